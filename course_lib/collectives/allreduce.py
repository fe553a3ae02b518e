"""Allreduce: every rank gets op over all ranks' vectors.

n = bytes of the vector each rank contributes, gamma = seconds per byte of reduction
work. Costs from Thakur, Rabenseifner & Gropp (2005), p a power of two:

* ``reduce_bcast``: 2 lg p alpha + 2 lg p n beta + lg p n gamma;
* ``recursive_doubling``: lg p (alpha + n beta + n gamma) (best for tiny messages);
* ``ring`` = ring reduce-scatter + ring allgather (Patarasuk & Yuan 2009):
  2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma, bandwidth-optimal;
* ``rabenseifner`` = recursive halving + recursive doubling (Rabenseifner 2004):
  2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.

When p is not a power of two, recursive doubling and Rabenseifner first fold p down to the
largest power of two p2 (the first 2(p - p2) ranks pair up) and unfold at the end.
``reduce_bcast``, ``recursive_doubling`` and ``rabenseifner`` combine contributions in rank
order, so an associative but non-commutative op is fine there; ``ring`` needs a commutative op.
"""
from __future__ import annotations

import numpy as np

from ..runtime.registry import Algorithm
from ._p2p import (
    TrafficCount,
    binomial_children,
    ceil_log2,
    chunk_bounds,
    chunk_sizes,
    fold_roles,
    folded_rounds,
    halving_ranges,
)
from .broadcast import bcast_binomial
from .reduction import folded_seconds, need_array, need_commute, reduce_binomial, sent_fraction


def allreduce_reduce_bcast(t, obj, op):
    return bcast_binomial(t, reduce_binomial(t, obj, op, 0), 0)


def allreduce_recursive_doubling(t, obj, op):
    p, r = t.size, t.rank
    p2, extra, virt, real = fold_roles(p)
    if r < 2 * extra:
        if r % 2 == 0:
            t.send(obj, r + 1)
            return t.recv(r + 1)
        obj = op(t.recv(r - 1), obj)
    v = virt[r]
    m = 1
    while m < p2:
        partner = v ^ m
        got = t.sendrecv(obj, real[partner], real[partner])
        obj = op(got, obj) if partner < v else op(obj, got)
        m *= 2
    if r < 2 * extra:
        t.send(obj, r - 1)
    return obj


def allreduce_ring(t, x, op):
    """Ring reduce-scatter (rank r ends with chunk r), then ring allgather of the chunks."""
    need_array(x, "ring")
    need_commute(op, "ring")
    p, r = t.size, t.rank
    flat = x.reshape(-1)
    b = chunk_bounds(flat.size, p)
    chunks = [flat[b[i]:b[i + 1]] for i in range(p)]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):                          # reduce-scatter
        out, inc = (r - s - 1) % p, (r - s - 2) % p
        chunks[inc] = op(t.sendrecv(chunks[out], right, left), chunks[inc])
    for s in range(p - 1):                          # allgather
        out, inc = (r - s) % p, (r - s - 1) % p
        chunks[inc] = t.sendrecv(chunks[out], right, left)
    return np.concatenate(chunks).reshape(x.shape) if p > 1 else x.copy()


def allreduce_rabenseifner(t, x, op):
    need_array(x, "rabenseifner")
    p, r = t.size, t.rank
    flat = x.reshape(-1).copy()
    p2, extra, virt, real = fold_roles(p)
    if r < 2 * extra:
        if r % 2 == 0:
            t.send(flat, r + 1)
            return t.recv(r + 1).reshape(x.shape)
        flat = op(t.recv(r - 1), flat)
    b = chunk_bounds(flat.size, p2)
    v = virt[r]
    lo, hi, m = 0, p2, p2 // 2
    rounds = []
    while m >= 1:                                    # recursive halving
        mid = lo + m
        keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
        partner = real[v ^ m]
        got = t.sendrecv(flat[b[give[0]]:b[give[1]]], partner, partner)
        seg = slice(b[keep[0]], b[keep[1]])
        flat[seg] = op(got, flat[seg]) if (v ^ m) < v else op(flat[seg], got)
        rounds.append((keep, give, partner))
        lo, hi = keep
        m //= 2
    for keep, give, partner in reversed(rounds):    # recursive doubling (allgather)
        flat[b[give[0]]:b[give[1]]] = t.sendrecv(flat[b[keep[0]]:b[keep[1]]], partner, partner)
    if r < 2 * extra:
        t.send(flat, r - 1)
    return flat.reshape(x.shape)


# -- cost rows (n: the vector of each rank) -------------------------------------------------
def _allreduce_ring_traffic(p, n, itemsize, root, ndim):
    count, c = TrafficCount(p, itemsize), chunk_sizes(n, p)
    for r in range(p):
        count.add(r, 2 * n - c[r] - c[(r + 1) % p], 2 * (p - 1))
    return count.result()


def _allreduce_recursive_doubling_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    p2, extra, virt, real = fold_roles(p)
    for r in range(p):
        if r < 2 * extra and r % 2 == 0:
            count.add(r, n)
        else:
            k = ceil_log2(p2) + (1 if r < 2 * extra else 0)
            count.add(r, n * k, k)
    return count.result()


def _allreduce_reduce_bcast_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        k = (1 if r != 0 else 0) + len(binomial_children(r, p))
        count.add(r, n * k, k)
    return count.result()


def _allreduce_rabenseifner_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    p2, extra, virt, real = fold_roles(p)
    c2 = chunk_sizes(n, p2)
    for r in range(p):
        if r < 2 * extra and r % 2 == 0:
            count.add(r, n)
            continue
        for keep, give in halving_ranges(virt[r], p2):
            count.add(r, sum(c2[give[0]:give[1]]))      # halving: send the other half
            count.add(r, sum(c2[keep[0]:keep[1]]))      # doubling: send what I kept
        if r < 2 * extra:
            count.add(r, n)
    return count.result()


def _ring_allreduce_seconds(p, n, a, b, c):
    from course_lib.reference.ex02 import ring_allreduce_time  # question ex02_4
    return float(ring_allreduce_time(p, n, a, b, c))


def _rabenseifner_pow2(p, n, a, b, c):
    f = sent_fraction(p)
    return 2 * ceil_log2(p) * a + 2 * f * n * b + f * n * c


def _rabenseifner_folded(p, n, a, b, c, lg2):
    f = sent_fraction(p)
    return 2 * lg2 * a + 2 * f * n * b + f * n * c + (a + n * b + n * c) + (a + n * b)


_rabenseifner_seconds = folded_seconds(_rabenseifner_pow2, _rabenseifner_folded)

ROWS = [
    Algorithm("allreduce", "reduce_bcast", allreduce_reduce_bcast, "2 lg p alpha + 2 lg p n beta + lg p n gamma",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (2 * a + 2 * n * b + n * c),
              traffic=_allreduce_reduce_bcast_traffic),
    Algorithm("allreduce", "recursive_doubling", allreduce_recursive_doubling, "lg p (alpha + n beta + n gamma)",
              seconds=folded_seconds(lambda p, n, a, b, c: ceil_log2(p) * (a + n * b + n * c),
                              lambda p, n, a, b, c, lg2: (lg2 * (a + n * b + n * c) + (a + n * b + n * c)
                                                          + (a + n * b))),
              rounds=lambda p: sum(folded_rounds(p)), traffic=_allreduce_recursive_doubling_traffic),
    Algorithm("allreduce", "ring", allreduce_ring, "2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
              seconds=_ring_allreduce_seconds, rounds=lambda p: 2 * (p - 1), traffic=_allreduce_ring_traffic),
    Algorithm("allreduce", "rabenseifner", allreduce_rabenseifner, "2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
              seconds=_rabenseifner_seconds,
              rounds=lambda p: 2 * folded_rounds(p)[0] + folded_rounds(p)[1],
              traffic=_allreduce_rabenseifner_traffic),
]
