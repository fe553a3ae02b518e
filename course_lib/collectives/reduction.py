"""Reductions: reduce, reduce-scatter, allreduce, scan and exscan.

n = bytes of the vector each rank contributes, gamma = seconds per byte of reduction
work. Costs from Thakur, Rabenseifner & Gropp (2005), p a power of two:

* reduce ``binomial``: lg p (alpha + n beta + n gamma); ``flat``: (p-1)(alpha + n beta + n gamma).
* reduce-scatter ``ring`` and ``pairwise``: (p-1) alpha + (p-1)/p n (beta + gamma);
  ``recursive_halving``: lg p alpha + (p-1)/p n (beta + gamma).
* allreduce ``reduce_bcast``: 2 lg p alpha + 2 lg p n beta + lg p n gamma;
  ``recursive_doubling``: lg p (alpha + n beta + n gamma) (best for tiny messages);
  ``ring`` = ring reduce-scatter + ring allgather (Patarasuk & Yuan 2009):
  2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma, bandwidth-optimal;
  ``rabenseifner`` = recursive halving + recursive doubling (Rabenseifner 2004):
  2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
When p is not a power of two, recursive doubling/halving first fold p down to the
largest power of two p2 (the first 2(p - p2) ranks pair up) and unfold at the end.

Contributions are combined in rank order (``op(lower, higher)``) by ``reduce``,
``recursive_doubling``, ``rabenseifner`` and the scans, so an associative but
non-commutative op is fine there; ``ring``, ``pairwise`` and ``recursive_halving``
(reduce-scatter) reorder and need a commutative op.
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
    is_array,
    non_roots_send_once,
)
from .broadcast import bcast_binomial


def _need_array(x, name):
    if not is_array(x):
        raise TypeError(f"algorithm {name!r} cuts the buffer into chunks, so it needs a numpy array, "
                        f"got {type(x).__name__}; use algorithm='recursive_doubling' for other objects")


def _need_commute(op, name):
    if not op.commute:
        raise ValueError(f"algorithm {name!r} combines contributions out of rank order, so it needs a "
                         f"commutative op; {op!r} is not (use 'recursive_doubling' or 'reduce_bcast')")


# -- reduce ---------------------------------------------------------------------------
def reduce_binomial(t, obj, op, root=0):
    p, r = t.size, t.rank
    if not op.commute and root != 0:
        # keep rank order: reduce to rank 0, then hand the result to the root
        res = reduce_binomial(t, obj, op, 0)
        if r == 0:
            t.send(res, root)
        return t.recv(0) if r == root else None
    vr = (r - root) % p
    acc = obj
    m = 1
    while m < p:
        if vr & m:
            t.send(acc, (vr - m + root) % p)
            return None
        if vr + m < p:
            acc = op(acc, t.recv((vr + m + root) % p))
        m *= 2
    return acc


def reduce_flat(t, obj, op, root=0):
    p, r = t.size, t.rank
    if r != root:
        t.send(obj, root)
        return None
    acc = None
    for src in range(p):
        val = obj if src == root else t.recv(src)
        acc = val if src == 0 else op(acc, val)
    return acc


# -- reduce-scatter (returns this rank's chunk of the flattened result) -----------------
def rs_ring(t, x, op):
    """After step s rank r holds the partial sum of chunk r - s - 1 over s + 2 ranks;
    after p - 1 steps it holds chunk r complete."""
    _need_array(x, "ring")
    _need_commute(op, "ring")
    p, r = t.size, t.rank
    flat = x.reshape(-1)
    b = chunk_bounds(flat.size, p)
    chunks = [flat[b[i]:b[i + 1]] for i in range(p)]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out, inc = (r - s - 1) % p, (r - s - 2) % p
        got = t.sendrecv(chunks[out], right, left)
        chunks[inc] = op(got, chunks[inc])
    return chunks[r]


def rs_pairwise(t, x, op):
    """Step s: send the chunk of rank r + s straight to it, take my chunk from r - s."""
    _need_array(x, "pairwise")
    _need_commute(op, "pairwise")
    p, r = t.size, t.rank
    flat = x.reshape(-1)
    b = chunk_bounds(flat.size, p)
    acc = flat[b[r]:b[r + 1]]
    for s in range(1, p):
        dst, src = (r + s) % p, (r - s) % p
        acc = op(acc, t.sendrecv(flat[b[dst]:b[dst + 1]], dst, src))
    return acc


def rs_recursive_halving(t, x, op):
    """Round k: partners r XOR p2/2^(k+1) split their current range in halves, each sends
    the half the other keeps. Virtual rank v owns the chunks of the real ranks it stands for."""
    _need_array(x, "recursive_halving")
    p, r = t.size, t.rank
    flat = x.reshape(-1).copy()
    b = chunk_bounds(flat.size, p)
    p2, extra, virt, real = fold_roles(p)
    if r < 2 * extra:
        if r % 2 == 0:
            t.send(flat, r + 1)
            return t.recv(r + 1)
        flat = op(t.recv(r - 1), flat)

    def start(v):                         # first element of virtual rank v's chunks
        return b[2 * v if v < extra else v + extra]

    v = virt[r]
    lo, hi, m = 0, p2, p2 // 2
    while m >= 1:
        mid = lo + m
        keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
        partner = v ^ m
        got = t.sendrecv(flat[start(give[0]):start(give[1])], real[partner], real[partner])
        seg = slice(start(keep[0]), start(keep[1]))
        flat[seg] = op(got, flat[seg]) if partner < v else op(flat[seg], got)
        lo, hi = keep
        m //= 2
    if r < 2 * extra:
        t.send(flat[b[r - 1]:b[r]], r - 1)
    return flat[b[r]:b[r + 1]]


# -- allreduce -------------------------------------------------------------------------
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
    _need_array(x, "ring")
    _need_commute(op, "ring")
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
    _need_array(x, "rabenseifner")
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


# -- scans -----------------------------------------------------------------------------
def scan_linear(t, obj, op, exclusive=False):
    """Rank r waits for the prefix of ranks < r, adds its own, passes it on: p - 1 steps."""
    p, r = t.size, t.rank
    before = t.recv(r - 1) if r > 0 else None
    incl = obj if before is None else op(before, obj)
    if r < p - 1:
        t.send(incl, r + 1)
    return before if exclusive else incl


def scan_recursive_doubling(t, obj, op, exclusive=False):
    """Hillis & Steele (1986): round k, send my partial prefix to r + 2^k, combine the one
    from r - 2^k in front of mine. ceil(lg p) rounds."""
    p, r = t.size, t.rank
    incl, excl = obj, None
    d = 1
    while d < p:
        if r + d < p:
            t.send(incl, r + d)
        if r - d >= 0:
            got = t.recv(r - d)
            excl = got if excl is None else op(got, excl)
            incl = op(got, incl)
        d *= 2
    return excl if exclusive else incl


# -- cost rows (n: the vector of each rank) ----------------------------------------------------------
def _rs_ring_traffic(p, n, itemsize, root, ndim):
    count, c = TrafficCount(p, itemsize), chunk_sizes(n, p)
    for r in range(p):
        count.add(r, n - c[r], p - 1)                  # every chunk but my own, one per step
    return count.result()


def _rs_recursive_halving_traffic(p, n, itemsize, root, ndim):
    count, c = TrafficCount(p, itemsize), chunk_sizes(n, p)
    p2, extra, virt, real = fold_roles(p)
    bounds = np.cumsum([0] + c)

    def start(v):                                      # first element of virtual rank v's chunks
        return int(bounds[2 * v if v < extra else v + extra])

    for r in range(p):
        if r < 2 * extra and r % 2 == 0:
            count.add(r, n)                            # fold: hand everything to the odd rank above
            continue
        for _keep, give in halving_ranges(virt[r], p2):
            count.add(r, start(give[1]) - start(give[0]))
        if r < 2 * extra:
            count.add(r, c[r - 1])                     # unfold: the partner's chunk
    return count.result()


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


def _scan_linear_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p - 1):
        count.add(r, n)
    return count.result()


def _scan_recursive_doubling_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        d = 1
        while d < p:
            if r + d < p:
                count.add(r, n)
            d *= 2
    return count.result()


def _folded(pow2_seconds, folded_seconds):
    """seconds(): the power-of-two formula, or, for other p, the run among p2 = 2^floor(lg p)
    ranks plus folding in and out (Thakur et al. 2005, section 4)."""
    def seconds(p, n, a, b, c):
        lg2, fold = folded_rounds(p)
        return pow2_seconds(p, n, a, b, c) if not fold else folded_seconds(p, n, a, b, c, lg2)
    return seconds


def _ring_allreduce_seconds(p, n, a, b, c):
    from course_lib.reference.ex02 import ring_allreduce_time  # question ex02_4
    return float(ring_allreduce_time(p, n, a, b, c))


def _F(p):
    """(p-1)/p: the fraction of the vector a rank sends (and receives) in the bandwidth-optimal algorithms."""
    return (p - 1) / p


ROWS = [
    Algorithm("reduce", "binomial", reduce_binomial, "lg p (alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (a + n * b + n * c), traffic=non_roots_send_once),
    Algorithm("reduce", "flat", reduce_flat, "(p-1)(alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b + n * c), traffic=non_roots_send_once),
    Algorithm("reduce_scatter", "ring", rs_ring, "(p-1) alpha + (p-1)/p n (beta + gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * a + _F(p) * n * (b + c),
              rounds=lambda p: p - 1, traffic=_rs_ring_traffic),
    Algorithm("reduce_scatter", "pairwise", rs_pairwise, "(p-1) alpha + (p-1)/p n (beta + gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * a + _F(p) * n * (b + c),
              rounds=lambda p: p - 1, traffic=_rs_ring_traffic),
    Algorithm("reduce_scatter", "recursive_halving", rs_recursive_halving, "lg p alpha + (p-1)/p n (beta + gamma)",
              seconds=_folded(lambda p, n, a, b, c: ceil_log2(p) * a + _F(p) * n * (b + c),
                              lambda p, n, a, b, c, lg2: (lg2 * a + _F(p) * n * (b + c) + (a + n * b + n * c)
                                                          + (a + n / p * b))),
              rounds=lambda p: sum(folded_rounds(p)), traffic=_rs_recursive_halving_traffic),
    Algorithm("allreduce", "reduce_bcast", allreduce_reduce_bcast, "2 lg p alpha + 2 lg p n beta + lg p n gamma",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (2 * a + 2 * n * b + n * c),
              traffic=_allreduce_reduce_bcast_traffic),
    Algorithm("allreduce", "recursive_doubling", allreduce_recursive_doubling, "lg p (alpha + n beta + n gamma)",
              seconds=_folded(lambda p, n, a, b, c: ceil_log2(p) * (a + n * b + n * c),
                              lambda p, n, a, b, c, lg2: (lg2 * (a + n * b + n * c) + (a + n * b + n * c)
                                                          + (a + n * b))),
              rounds=lambda p: sum(folded_rounds(p)), traffic=_allreduce_recursive_doubling_traffic),
    Algorithm("allreduce", "ring", allreduce_ring, "2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
              seconds=_ring_allreduce_seconds, rounds=lambda p: 2 * (p - 1), traffic=_allreduce_ring_traffic),
    Algorithm("allreduce", "rabenseifner", allreduce_rabenseifner, "2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
              seconds=_folded(lambda p, n, a, b, c: 2 * ceil_log2(p) * a + 2 * _F(p) * n * b + _F(p) * n * c,
                              lambda p, n, a, b, c, lg2: (2 * lg2 * a + 2 * _F(p) * n * b + _F(p) * n * c
                                                          + (a + n * b + n * c) + (a + n * b))),
              rounds=lambda p: 2 * folded_rounds(p)[0] + folded_rounds(p)[1],
              traffic=_allreduce_rabenseifner_traffic),
    Algorithm("scan", "linear", scan_linear, "(p-1)(alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b + n * c),
              rounds=lambda p: p - 1, traffic=_scan_linear_traffic),
    Algorithm("scan", "recursive_doubling", scan_recursive_doubling, "lg p (alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (a + n * b + n * c),
              rounds=ceil_log2, traffic=_scan_recursive_doubling_traffic),
    # exscan runs the scan algorithms with exclusive=True; its costs are not kept in closed form
    Algorithm("exscan", "linear", scan_linear),
    Algorithm("exscan", "recursive_doubling", scan_recursive_doubling),
]


def _table(collective):
    return {row.name: row.run for row in ROWS if row.collective == collective}


REDUCE, REDUCE_SCATTER, ALLREDUCE, SCAN = (_table(c) for c in ("reduce", "reduce_scatter", "allreduce", "scan"))
