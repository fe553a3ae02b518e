"""One-to-all and all-to-one: broadcast, scatter, gather.

Costs (Thakur, Rabenseifner & Gropp 2005), n = bytes of the whole message:

* bcast ``flat``: the root sends to each rank in turn: (p-1)(alpha + n beta).
* bcast ``binomial``: every rank that has the data sends it on, so the number of ranks
  holding it doubles each round (the tree of the source notes): ceil(lg p)(alpha + n beta).
* bcast ``scatter_allgather`` (van de Geijn): binomial scatter of p chunks, then a ring
  allgather: (lg p + p - 1) alpha + 2 (p-1)/p n beta. Wins for long messages.
* scatter / gather ``flat``: (p-1) alpha + (p-1)/p n beta;
  ``binomial``: lg p alpha + (p-1)/p n beta (the root sends halves, quarters, ...).

The binomial bcast and scatter and the flat gather are what the runtime's ``comm.bcast``,
``comm.scatter`` and ``comm.gather`` run by default: their code and cost rows live in
:mod:`course_lib.runtime.base_collectives` and are imported here, beside this lesson's variants.
"""
from __future__ import annotations

import pickle

import numpy as np

from ..runtime import wire
from ..runtime.base_collectives import (  # noqa: F401  (the runtime's defaults, taught here too)
    bcast_binomial,
    check_scatter_items,
    flat_seconds,
    gather_flat,
    header_bytes,
    scatter_binomial,
    scatter_contiguous,
    tree_seconds,
)
from ..runtime.registry import Algorithm
from ._p2p import TrafficCount, binomial_children, ceil_log2, chunk_sizes, is_array, pack_blocks, unpack_blocks


# -- broadcast -------------------------------------------------------------------------
def bcast_flat(t, obj, root=0):
    p, r = t.size, t.rank
    if r == root:
        for dst in range(p):
            if dst != root:
                t.send(obj, dst)
        return obj
    return t.recv(root)


def _to_flat(obj):
    if is_array(obj):
        return np.ascontiguousarray(obj).reshape(-1), 0, obj.shape
    return np.frombuffer(wire.dumps(obj), dtype=np.uint8), 1, ()   # a __main__ class travels too


def bcast_scatter_allgather(t, obj, root=0):
    p, r = t.size, t.rank
    if p == 1:
        return obj
    flat, kind, shape = _to_flat(obj) if r == root else (None, 0, ())
    mine, kind, shape, dtype = scatter_contiguous(t, flat, root, kind, shape)
    vr = (r - root) % p
    # ring allgather among relative ranks: pass on what came from the left
    chunks = [None] * p
    chunks[vr] = mine
    right, left = (vr + 1) % p, (vr - 1) % p
    for s in range(p - 1):
        out = (vr - s) % p
        chunks[(vr - s - 1) % p] = t.sendrecv(chunks[out], (right + root) % p, (left + root) % p)
    if r == root:
        return obj
    full = np.concatenate(chunks).astype(dtype, copy=False)
    return full.reshape(shape) if kind == 0 else pickle.loads(full.tobytes())


# -- scatter / gather -------------------------------------------------------------------
def scatter_flat(t, seq, root=0):
    p, r = t.size, t.rank
    if r == root:
        check_scatter_items(seq, p)
        for dst in range(p):
            if dst != root:
                t.send(seq[dst], dst)
        return seq[root]
    return t.recv(root)


def gather_binomial(t, obj, root=0):
    """Mirror of the binomial scatter: each rank sends its whole subtree's items at once."""
    p, r = t.size, t.rank
    vr = (r - root) % p
    held = {vr: obj}                              # items by relative rank
    m = 1
    while m < p:
        if vr & m:
            t.send(pack_blocks(held), (vr - m + root) % p)
            return None
        if vr + m < p:
            ids = range(vr + m, min(vr + 2 * m, p))
            held.update(unpack_blocks(t.recv((vr + m + root) % p), ids, obj))
        m *= 2
    return [held[(src - root) % p] for src in range(p)]


# -- cost rows ---------------------------------------------------------------------------------
# n: the vector of each rank (bcast); the whole buffer of p blocks in seconds() of scatter and
# gather, one block per rank in their traffic(). The binomial scatter inside scatter_allgather
# tells the non-roots what they receive with a header of (4 + ndim) int64 words per message.
def _root_sends_to_all(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    count.add(root, n * (p - 1), p - 1)
    return count.result()


def _bcast_scatter_allgather_traffic(p, n, itemsize, root, ndim):
    count, c = TrafficCount(p, itemsize), chunk_sizes(n, p)
    for r in range(p):
        vr = (r - root) % p
        for child in binomial_children(vr, p):              # binomial scatter of subtrees
            low = child & -child
            count.add(r, sum(c[child:min(child + low, p)]))
            count.bytes[r] += header_bytes(ndim)
        count.add(r, n - c[(vr + 1) % p], p - 1)            # ring allgather
    return count.result()


def _gather_binomial_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        vr = (r - root) % p
        if vr:
            low = vr & -vr                                  # my subtree: ranks vr .. vr + low - 1
            count.add(r, n * (min(vr + low, p) - vr))
    return count.result()


# this lesson's variants only: the runtime registers its defaults itself
ROWS = [
    Algorithm("bcast", "flat", bcast_flat, "(p-1)(alpha + n beta)",
              seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b),
              rounds=lambda p: p - 1, traffic=_root_sends_to_all),
    Algorithm("bcast", "scatter_allgather", bcast_scatter_allgather, "(lg p + p - 1) alpha + 2 (p-1)/p n beta",
              seconds=lambda p, n, a, b, c: (ceil_log2(p) + p - 1) * a + 2 * (p - 1) / p * n * b if p > 1 else 0.0,
              traffic=_bcast_scatter_allgather_traffic),
    Algorithm("scatter", "flat", scatter_flat, "(p-1) alpha + (p-1)/p n beta",
              seconds=flat_seconds, rounds=lambda p: p - 1, traffic=_root_sends_to_all),
    Algorithm("gather", "binomial", gather_binomial, "lg p alpha + (p-1)/p n beta",
              seconds=tree_seconds, traffic=_gather_binomial_traffic),
]
