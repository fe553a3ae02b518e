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
"""
from __future__ import annotations

from ._p2p import fold_roles, pack_blocks, unpack_blocks


def ring(t, obj):
    p, r = t.size, t.rank
    blocks = [None] * p
    blocks[r] = obj
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        blocks[(r - s - 1) % p] = t.sendrecv(blocks[(r - s) % p], right, left)
    return blocks


def recursive_doubling(t, obj):
    p, r = t.size, t.rank
    p2, extra, virt, real = fold_roles(p)
    held = {r: obj}
    if r < 2 * extra:
        if r % 2 == 0:                       # sit out: hand my block up, get all back
            t.send(obj, r + 1)
            payload, info = t.recv_info(r + 1)
            held.update(unpack_blocks(payload, info))
            return [held[i] for i in range(p)]
        held[r - 1] = t.recv(r - 1)
    v = virt[r]
    m = 1
    while m < p2:
        partner = real[v ^ m]
        payload, info = pack_blocks(held)
        got, ginfo = t.sendrecv_info(payload, partner, partner, info=info)
        held.update(unpack_blocks(got, ginfo))
        m *= 2
    if r < 2 * extra:
        payload, info = pack_blocks({i: b for i, b in held.items() if i != r - 1})
        t.send(payload, r - 1, info=info)
    return [held[i] for i in range(p)]


def bruck(t, obj):
    p, r = t.size, t.rank
    held = [obj]                          # held[j] is the block of rank (r + j) % p
    d = 1
    while d < p:
        k = min(d, p - d)
        payload, info = pack_blocks(dict(enumerate(held[:k])))
        got, ginfo = t.sendrecv_info(payload, (r - d) % p, (r + d) % p, info=info)
        new = unpack_blocks(got, ginfo)
        held.extend(new[j] for j in range(k))
        d *= 2
    return [held[(i - r) % p] for i in range(p)]


ALGORITHMS = {"ring": ring, "recursive_doubling": recursive_doubling, "bruck": bruck}
