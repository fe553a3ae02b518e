"""All-to-all: rank r sends its item j to rank j, and receives item r of everyone.

It is the transpose of a p x p matrix of blocks (row r lives on rank r).

* ``pairwise``: in step s = 1 .. p-1 rank r sends to r + s and receives from r - s:
  (p-1) alpha + (p-1)/p n beta, n = bytes each rank holds. Every byte crosses the network
  once: best for large items.
* ``bruck`` (Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005, section 4.6):
  ceil(lg p) rounds for any p, each carrying about half of a rank's blocks, so
  ceil(lg p) alpha + (lg p / 2) n beta for p a power of two: fewer messages, more bytes;
  best for small items, where latency dominates.

The pairwise exchange is ``comm.alltoall``'s default: its code and cost row live in
:mod:`course_lib.runtime.base_collectives` and are imported here; Bruck is this lesson's variant.
"""
from __future__ import annotations

from ..runtime.base_collectives import alltoall_pairwise as pairwise  # noqa: F401  (see above)
from ..runtime.base_collectives import check_alltoall_items
from ..runtime.registry import Algorithm
from ._p2p import TrafficCount, ceil_log2, is_array, pack_blocks, unpack_blocks


def bruck(t, seq):
    """Rotate so that slot j holds the item for rank r + j; in the round of distance d
    (1, 2, 4, ...) send every slot whose index has bit d to rank r + d and take the same
    slots from rank r - d. An item in slot j moves by the bits of j, j in all, so it ends
    at its destination, in slot j of a rank that is j after its source; a last rotation
    puts the items in source order. Several items travel per message, packed as one array
    when they are arrays of one shape and dtype on every rank."""
    p, r = t.size, t.rank
    check_alltoall_items(seq, p)
    slots = [seq[(r + j) % p] for j in range(p)]
    d = 1
    while d < p:
        ids = [j for j in range(p) if j & d]
        got = t.sendrecv(pack_blocks({j: slots[j] for j in ids}), (r + d) % p, (r - d) % p)
        like = slots[ids[0]]
        if is_array(got) and is_array(like) and got.size != len(ids) * like.size:
            raise ValueError("alltoall 'bruck' packs several items per message, so every item on every rank "
                             "must be an array of one shape and dtype; use algorithm='pairwise' for others")
        for j, block in unpack_blocks(got, ids, like).items():
            slots[j] = block
        d *= 2
    return [slots[(r - i) % p] for i in range(p)]


def _bruck_blocks_sent(p: int) -> int:
    """Items one rank sends in all: for every distance d, the slots j < p with bit d set."""
    return sum(sum(1 for j in range(p) if j & d) for d in (1 << k for k in range(ceil_log2(p))))


def _bruck_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        count.add(r, n * _bruck_blocks_sent(p), ceil_log2(p))
    return count.result()


# this lesson's variant only: the runtime registers the pairwise exchange itself
ROWS = [
    Algorithm("alltoall", "bruck", bruck, "ceil(lg p) alpha + (lg p / 2) n beta",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * a + _bruck_blocks_sent(p) / p * n * b,
              rounds=ceil_log2, traffic=_bruck_traffic),
]
