"""Allgather: every rank ends with every rank's block, as a list in rank order.

With m = bytes of one block and n = p m (Thakur, Rabenseifner & Gropp 2005):

* ``ring``: in step s rank r passes block r - s to its right neighbour:
  (p-1) alpha + (p-1)/p n beta. Each rank sends exactly p - 1 blocks.
* ``recursive_doubling``: in round k partners r XOR 2^k swap everything they hold,
  so the held data doubles: lg p alpha + (p-1)/p n beta for a power of two. Other p
  are folded to the largest power of two p2 first (two extra steps).
* ``bruck`` (Bruck et al. 1997): in round k send the first min(2^k, p - 2^k) held
  blocks to rank r - 2^k; ceil(lg p) alpha + (p-1)/p n beta for *any* p, then a local
  rotation puts the blocks in rank order.

The ring (``comm.allgather``'s default) and Bruck (the runtime's signature check) are the
runtime's: their code and cost rows live in :mod:`course_lib.runtime.base_collectives` and are
imported here; recursive doubling is this lesson's variant.
"""
from __future__ import annotations

from ..runtime.base_collectives import allgather_bruck as bruck  # noqa: F401  (see above)
from ..runtime.base_collectives import allgather_ring as ring  # noqa: F401  (see above)
from ..runtime.registry import Algorithm
from ._p2p import TrafficCount, fold_roles, folded_rounds, pack_blocks, unpack_blocks


def _blocks_of(u, extra):
    """Real-rank ids of the blocks virtual rank u holds right after the fold."""
    return [2 * u, 2 * u + 1] if u < extra else [u + extra]


def recursive_doubling(t, obj):
    p, r = t.size, t.rank
    p2, extra, virt, real = fold_roles(p)
    held = {r: obj}
    if r < 2 * extra:
        if r % 2 == 0:                       # sit out: hand my block up, get all back
            t.send(obj, r + 1)
            held.update(unpack_blocks(t.recv(r + 1), [i for i in range(p) if i != r], obj))
            return [held[i] for i in range(p)]
        held[r - 1] = t.recv(r - 1)
    v = virt[r]
    m = 1
    while m < p2:
        partner = v ^ m
        ids = [i for u in range(p2) if u // m == partner // m for i in _blocks_of(u, extra)]
        got = t.sendrecv(pack_blocks(held), real[partner], real[partner])
        held.update(unpack_blocks(got, ids, obj))
        m *= 2
    if r < 2 * extra:
        t.send(pack_blocks({i: b for i, b in held.items() if i != r - 1}), r - 1)
    return [held[i] for i in range(p)]


# -- cost rows (n: the whole gathered buffer in seconds(); one block per rank in traffic()) -----------
def _recursive_doubling_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    p2, extra, virt, real = fold_roles(p)
    for r in range(p):
        if r < 2 * extra and r % 2 == 0:
            count.add(r, n)                  # fold: hand my block to the odd rank above
            continue
        v, m = virt[r], 1
        while m < p2:                        # send every block held: those of my aligned group of m
            group = [u for u in range(p2) if u // m == v // m]
            count.add(r, n * sum(2 if u < extra else 1 for u in group))
            m *= 2
        if r < 2 * extra:
            count.add(r, n * (p - 1))        # unfold: everything but the partner's own block
    return count.result()


def _recursive_doubling_seconds(p, n, a, b, c):
    lg2, fold = folded_rounds(p)
    f = (p - 1) / p
    if not fold:
        return lg2 * a + f * n * b
    return lg2 * a + f * n * b + (a + n / p * b) + (a + f * n * b)   # + fold in, unfold out


# this lesson's variant only: the runtime registers the ring and Bruck itself
ROWS = [
    Algorithm("allgather", "recursive_doubling", recursive_doubling, "lg p alpha + (p-1)/p n beta",
              seconds=_recursive_doubling_seconds, rounds=lambda p: sum(folded_rounds(p)),
              traffic=_recursive_doubling_traffic),
]
