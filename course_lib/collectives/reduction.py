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

The binomial reduce, the ring reduce-scatter and the recursive-doubling scan are what the
runtime's ``comm.reduce``, ``comm.reduce_scatter``, ``comm.scan`` and ``comm.exscan`` run by
default: their code and cost rows live in :mod:`course_lib.runtime.base_collectives` and are
imported here, beside this lesson's variants (flat reduce, pairwise and recursive-halving
reduce-scatter, linear scan).
"""
from __future__ import annotations

import numpy as np

from ..runtime.base_collectives import (  # noqa: F401  (the runtime's defaults, taught here too)
    reduce_binomial,
    reduce_scatter_ring_traffic,
    scan_recursive_doubling,
)
from ..runtime.base_collectives import reduce_scatter_ring as rs_ring  # noqa: F401  (see above)
from ..runtime.registry import Algorithm
from ._p2p import (
    TrafficCount,
    ceil_log2,
    chunk_bounds,
    chunk_sizes,
    fold_roles,
    folded_rounds,
    folded_seconds,
    halving_ranges,
    need_array,
    need_commute,
    non_roots_send_once,
    sent_fraction,
)


# -- reduce ---------------------------------------------------------------------------
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


# -- cost rows (n: the vector of each rank) ----------------------------------------------------------
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


# this lesson's variants only: the runtime registers its defaults itself
ROWS = [
    Algorithm("reduce", "flat", reduce_flat, "(p-1)(alpha + n beta + n gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b + n * c), traffic=non_roots_send_once),
    Algorithm("reduce_scatter", "pairwise", rs_pairwise, "(p-1) alpha + (p-1)/p n (beta + gamma)",
              seconds=lambda p, n, a, b, c: (p - 1) * a + sent_fraction(p) * n * (b + c),
              rounds=lambda p: p - 1, traffic=reduce_scatter_ring_traffic),
    Algorithm("reduce_scatter", "recursive_halving", rs_recursive_halving, "lg p alpha + (p-1)/p n (beta + gamma)",
              seconds=folded_seconds(lambda p, n, a, b, c: ceil_log2(p) * a + sent_fraction(p) * n * (b + c),
                                     lambda p, n, a, b, c, lg2: (lg2 * a + sent_fraction(p) * n * (b + c)
                                                                 + (a + n * b + n * c) + (a + n / p * b))),
              rounds=lambda p: sum(folded_rounds(p)), traffic=_rs_recursive_halving_traffic),
    # exscan runs the same algorithm with exclusive=True: the same messages, so the same costs
    *(Algorithm(collective, "linear", scan_linear, "(p-1)(alpha + n beta + n gamma)",
                seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b + n * c),
                rounds=lambda p: p - 1, traffic=_scan_linear_traffic) for collective in ("scan", "exscan")),
]
