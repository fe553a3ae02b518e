"""Reductions: reduce, reduce-scatter, scan and exscan.

n = bytes of the vector each rank contributes, gamma = seconds per byte of reduction
work. Costs from Thakur, Rabenseifner & Gropp (2005), p a power of two:

* reduce ``binomial``: lg p (alpha + n beta + n gamma); ``flat``: (p-1)(alpha + n beta + n gamma).
* reduce-scatter ``ring`` and ``pairwise``: (p-1) alpha + (p-1)/p n (beta + gamma);
  ``recursive_halving``: lg p alpha + (p-1)/p n (beta + gamma).
* scan ``linear``: (p-1)(alpha + n beta + n gamma); ``recursive_doubling`` (Hillis & Steele
  1986): lg p (alpha + n beta + n gamma). exscan runs the same algorithms, exclusive.
Allreduce, built on these, is in :mod:`.allreduce`.
When p is not a power of two, recursive doubling/halving first fold p down to the
largest power of two p2 (the first 2(p - p2) ranks pair up) and unfold at the end.

Contributions are combined in rank order (``op(lower, higher)``) by ``reduce`` and the
scans, so an associative but non-commutative op is fine there; the reduce-scatter
algorithms reorder and need a commutative op.
"""
from __future__ import annotations

import numpy as np

from ..runtime.registry import Algorithm
from ._p2p import (
    TrafficCount,
    ceil_log2,
    chunk_bounds,
    chunk_sizes,
    fold_roles,
    folded_rounds,
    halving_ranges,
    is_array,
    non_roots_send_once,
)


def need_array(x, name):
    if not is_array(x):
        raise TypeError(f"algorithm {name!r} cuts the buffer into chunks, so it needs a numpy array, "
                        f"got {type(x).__name__}; use algorithm='recursive_doubling' for other objects")


def need_commute(op, name):
    if not op.commute:
        raise ValueError(f"algorithm {name!r} combines contributions out of rank order, so it needs a "
                         f"commutative op; {op!r} is not (use 'recursive_doubling' or 'reduce_bcast')")


# -- reduce ---------------------------------------------------------------------------
def reduce_binomial(t, obj, op, root=0):
    """Binomial tree rooted at ``root`` (ranks rotated by ``root``), ``lg p`` rounds.

    A non-commutative op, or any object that is not a numpy array, is combined in rank
    order instead: the tree reduces to rank 0 and rank 0 hands the result to the root, one
    message more. That is what mpi4py's ``reduce`` does, and where the order shows (a SUM
    of lists concatenates them) the root gets ``[0, 1, ..., p-1]``, not a rotation of it."""
    p, r = t.size, t.rank
    if root != 0 and (not op.commute or not is_array(obj)):
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
    """At step s (from 0) rank r sends chunk r - s - 1 to the right and adds what comes from
    the left into chunk r - s - 2, which then holds the partial sum over s + 2 ranks; after
    p - 1 steps it holds chunk r complete (see ``schedule.holdings``)."""
    need_array(x, "ring")
    need_commute(op, "ring")
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
    need_array(x, "pairwise")
    need_commute(op, "pairwise")
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
    need_array(x, "recursive_halving")
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


def folded_seconds(pow2_seconds, folded_seconds):
    """seconds(): the power-of-two formula, or, for other p, the run among p2 = 2^floor(lg p)
    ranks plus folding in and out (Thakur et al. 2005, section 4)."""
    def seconds(p, n, a, b, c):
        lg2, fold = folded_rounds(p)
        return pow2_seconds(p, n, a, b, c) if not fold else folded_seconds(p, n, a, b, c, lg2)
    return seconds


def sent_fraction(p):
    """(p-1)/p: the fraction of the vector a rank sends (and receives) in the bandwidth-optimal algorithms."""
    return (p - 1) / p


ROWS = [
    Algorithm("reduce", "binomial", reduce_binomial, "lg p (alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (a + n * b + n * c), traffic=non_roots_send_once),
    Algorithm("reduce", "flat", reduce_flat, "(p-1)(alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b + n * c), traffic=non_roots_send_once),
    Algorithm("reduce_scatter", "ring", rs_ring, "(p-1) alpha + (p-1)/p n (beta + gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * a + sent_fraction(p) * n * (b + c),
              rounds=lambda p: p - 1, traffic=_rs_ring_traffic),
    Algorithm("reduce_scatter", "pairwise", rs_pairwise, "(p-1) alpha + (p-1)/p n (beta + gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * a + sent_fraction(p) * n * (b + c),
              rounds=lambda p: p - 1, traffic=_rs_ring_traffic),
    Algorithm("reduce_scatter", "recursive_halving", rs_recursive_halving, "lg p alpha + (p-1)/p n (beta + gamma)",
              seconds=folded_seconds(lambda p, n, a, b, c: ceil_log2(p) * a + sent_fraction(p) * n * (b + c),
                              lambda p, n, a, b, c, lg2: (lg2 * a + sent_fraction(p) * n * (b + c) + (a + n * b + n * c)
                                                          + (a + n / p * b))),
              rounds=lambda p: sum(folded_rounds(p)), traffic=_rs_recursive_halving_traffic),
    # exscan runs the same algorithms with exclusive=True: the same messages, so the same costs
    *(Algorithm(collective, "linear", scan_linear, "(p-1)(alpha + n beta + n gamma)",
                seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b + n * c),
                rounds=lambda p: p - 1, traffic=_scan_linear_traffic) for collective in ("scan", "exscan")),
    *(Algorithm(collective, "recursive_doubling", scan_recursive_doubling, "lg p (alpha + n beta + n gamma)",
                seconds=lambda p, n, a, b, c: ceil_log2(p) * (a + n * b + n * c),
                rounds=ceil_log2, traffic=_scan_recursive_doubling_traffic) for collective in ("scan", "exscan")),
]


def _table(collective):
    return {row.name: row.run for row in ROWS if row.collective == collective}


REDUCE, REDUCE_SCATTER, SCAN = (_table(c) for c in ("reduce", "reduce_scatter", "scan"))
