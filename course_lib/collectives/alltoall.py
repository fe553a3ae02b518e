"""All-to-all: rank r sends its item j to rank j, and receives item r of everyone.

It is the transpose of a p x p matrix of blocks (row r lives on rank r).

* ``pairwise``: in step s = 1 .. p-1 rank r sends to r + s and receives from r - s:
  (p-1) alpha + (p-1)/p n beta, n = bytes each rank holds.
"""
from __future__ import annotations

from ..runtime.registry import Algorithm
from ._p2p import TrafficCount


def _check(seq, p):
    if seq is None or len(seq) != p:
        raise ValueError(f"alltoall: every rank must pass a sequence of {p} items, "
                         f"got {type(seq).__name__}" + ("" if seq is None else f" of length {len(seq)}"))


def pairwise(t, seq):
    p, r = t.size, t.rank
    _check(seq, p)
    out = [None] * p
    out[r] = seq[r]
    for s in range(1, p):
        dst, src = (r + s) % p, (r - s) % p
        out[src] = t.sendrecv(seq[dst], dst, src)
    return out


def _pairwise_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        count.add(r, n * (p - 1), p - 1)           # one item to every other rank
    return count.result()


ROWS = [
    Algorithm("alltoall", "pairwise", pairwise, "(p-1) alpha + (p-1)/p n beta",
              seconds=lambda p, n, a, b, c: (p - 1) * a + (p - 1) / p * n * b,
              rounds=lambda p: p - 1, traffic=_pairwise_traffic),
]
ALGORITHMS = {row.name: row.run for row in ROWS}
