"""One-to-all and all-to-one: broadcast, scatter, gather.

Costs (Thakur, Rabenseifner & Gropp 2005), n = bytes of the whole message:

* bcast ``flat``: the root sends to each rank in turn: (p-1)(alpha + n beta).
* bcast ``binomial``: every rank that has the data sends it on, so the number of ranks
  holding it doubles each round (the seeds' tree): ceil(lg p)(alpha + n beta).
* bcast ``scatter_allgather`` (van de Geijn): binomial scatter of p chunks, then a ring
  allgather: (lg p + p - 1) alpha + 2 (p-1)/p n beta. Wins for long messages.
* scatter / gather ``flat``: (p-1) alpha + (p-1)/p n beta;
  ``binomial``: lg p alpha + (p-1)/p n beta (the root sends halves, quarters, ...).
"""
from __future__ import annotations

import pickle

import numpy as np

from ..runtime import wire
from ..runtime.registry import Algorithm
from ._p2p import (
    TrafficCount,
    binomial_children,
    ceil_log2,
    chunk_bounds,
    chunk_sizes,
    is_array,
    non_roots_send_once,
    pack_blocks,
    unpack_blocks,
)


def _lowbit(v: int, p: int) -> int:
    """Size of the binomial subtree rooted at relative rank v (the root's is >= p)."""
    if v == 0:
        m = 1
        while m < p:
            m *= 2
        return m
    return v & -v


# -- broadcast -------------------------------------------------------------------------
def bcast_flat(t, obj, root=0):
    p, r = t.size, t.rank
    if r == root:
        for dst in range(p):
            if dst != root:
                t.send(obj, dst)
        return obj
    return t.recv(root)


def bcast_binomial(t, obj, root=0):
    p, r = t.size, t.rank
    vr = (r - root) % p
    low = _lowbit(vr, p)
    if vr != 0:
        obj = t.recv((vr - low + root) % p)
    m = low // 2
    while m >= 1:
        if vr + m < p:
            t.send(obj, (vr + m + root) % p)
        m //= 2
    return obj


HEADER_WORDS = 4  # + ndim: the header of a scatter message, in int64 words


def _header(n, dtype, kind, shape):
    code = np.frombuffer(np.dtype(dtype).str.encode().ljust(8, b" "), dtype=np.int64)[0]
    return np.array([n, code, kind, len(shape), *shape], dtype=np.int64)


def _parse(msg):
    words = msg[:HEADER_WORDS * 8].view(np.int64)
    n, code, kind, ndim = (int(w) for w in words)
    end = (HEADER_WORDS + ndim) * 8
    shape = tuple(int(w) for w in msg[HEADER_WORDS * 8:end].view(np.int64))
    dtype = np.dtype(np.int64(code).tobytes().decode().strip())
    return n, dtype, kind, shape, msg[end:].view(dtype)


def scatter_contiguous(t, flat, root, kind=0, shape=()):
    """Binomial scatter of a 1-D array cut into p chunks; relative rank v gets chunk v.

    Non-roots know nothing about the data (mpi4py's non-roots pass None), so each message
    starts with a small header: length, dtype, ``kind`` and ``shape`` chosen by the root,
    (4 + len(shape)) int64 words. Each message holds the chunks of the receiver's whole
    subtree. Returns (my_chunk, kind, shape, dtype)."""
    p, r = t.size, t.rank
    vr = (r - root) % p
    low = _lowbit(vr, p)
    if vr == 0:
        n, dtype = flat.size, flat.dtype
        base = 0
    else:
        n, dtype, kind, shape, flat = _parse(t.recv((vr - low + root) % p))
    b = chunk_bounds(n, p)
    if vr:
        base = b[vr]
    head = _header(n, dtype, kind, shape).view(np.uint8)
    m = low // 2
    while m >= 1:
        c = vr + m
        if c < p:
            body = flat[b[c] - base:b[min(c + m, p)] - base]
            t.send(np.concatenate([head, body.view(np.uint8)]), (c + root) % p)
        m //= 2
    return flat[b[vr] - base:b[vr + 1] - base], kind, shape, dtype


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
def _check_seq(seq, p):
    if seq is None or len(seq) != p:
        raise ValueError(f"scatter: the root must pass a sequence of {p} items (one per rank), "
                         f"got {type(seq).__name__}" + ("" if seq is None else f" of length {len(seq)}"))


def scatter_flat(t, seq, root=0):
    p, r = t.size, t.rank
    if r == root:
        _check_seq(seq, p)
        for dst in range(p):
            if dst != root:
                t.send(seq[dst], dst)
        return seq[root]
    return t.recv(root)


def scatter_binomial(t, seq, root=0):
    p, r = t.size, t.rank
    if r == root:
        _check_seq(seq, p)
    # the root says whether it scatters the rows of one array (contiguous, no pickling)
    # or a list of objects, in the first word of every message: non-roots learn it there
    vr = (r - root) % p
    low = _lowbit(vr, p)
    if r == root:
        rows = is_array(seq) and seq.ndim >= 1
    else:
        first = t.recv((vr - low + root) % p)
        rows = is_array(first)
    if rows:
        if r == root:
            rel = np.concatenate([seq[root:], seq[:root]]) if root else seq
            mine, _, shape, _ = _scatter_rows(t, np.ascontiguousarray(rel).reshape(-1), root, seq.shape[1:],
                                              None)
        else:
            mine, _, shape, _ = _scatter_rows(t, None, root, None, first)
        return mine.reshape(shape)
    payload = first if r != root else (list(seq)[root:] + list(seq)[:root])   # payload[v] -> relative v
    m = low // 2
    while m >= 1:
        c = vr + m
        if c < p:
            t.send(payload[c - vr:min(c + m, p) - vr], (c + root) % p)
        m //= 2
    return payload[0]


def _scatter_rows(t, flat, root, rowshape, first):
    """scatter_contiguous, with the first message already received (non-roots)."""
    class _Once:
        def __init__(self, t, msg):
            self.t, self.msg, self.rank, self.size = t, msg, t.rank, t.size

        def recv(self, src):
            msg, self.msg = self.msg, None
            return msg if msg is not None else self.t.recv(src)

        def send(self, obj, dest):
            self.t.send(obj, dest)

    return scatter_contiguous(_Once(t, first), flat, root, 0, () if rowshape is None else rowshape)


def gather_flat(t, obj, root=0):
    p, r = t.size, t.rank
    if r != root:
        t.send(obj, root)
        return None
    return [obj if src == root else t.recv(src) for src in range(p)]


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
# gather, one block per rank in their traffic(). The binomial scatters tell the non-roots what
# they receive with a header of (4 + ndim) int64 words per message (see _header).
def _header_bytes(ndim):
    return 8 * (4 + ndim)


def _root_sends_to_all(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    count.add(root, n * (p - 1), p - 1)
    return count.result()


def _bcast_binomial_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        k = len(binomial_children((r - root) % p, p))
        count.add(r, n * k, k)
    return count.result()


def _bcast_scatter_allgather_traffic(p, n, itemsize, root, ndim):
    count, c = TrafficCount(p, itemsize), chunk_sizes(n, p)
    for r in range(p):
        vr = (r - root) % p
        for child in binomial_children(vr, p):              # binomial scatter of subtrees
            low = child & -child
            count.add(r, sum(c[child:min(child + low, p)]))
            count.bytes[r] += _header_bytes(ndim)
        count.add(r, n - c[(vr + 1) % p], p - 1)            # ring allgather
    return count.result()


def _scatter_binomial_traffic(p, n, itemsize, root, ndim):   # an array of p rows of n items
    count = TrafficCount(p, itemsize)
    for r in range(p):
        for child in binomial_children((r - root) % p, p):
            low = child & -child
            count.add(r, n * (min(child + low, p) - child))
            count.bytes[r] += _header_bytes(ndim)
    return count.result()


def _gather_binomial_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        vr = (r - root) % p
        if vr:
            low = vr & -vr                                  # my subtree: ranks vr .. vr + low - 1
            count.add(r, n * (min(vr + low, p) - vr))
    return count.result()


def _flat_seconds(p, n, a, b, c):
    return (p - 1) * a + (p - 1) / p * n * b


def _tree_seconds(p, n, a, b, c):
    return ceil_log2(p) * a + (p - 1) / p * n * b


ROWS = [
    Algorithm("bcast", "flat", bcast_flat, "(p-1)(alpha + n beta)",
              seconds=lambda p, n, a, b, c: (p - 1) * (a + n * b),
              rounds=lambda p: p - 1, traffic=_root_sends_to_all),
    Algorithm("bcast", "binomial", bcast_binomial, "lg p (alpha + n beta)",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (a + n * b),
              rounds=ceil_log2, traffic=_bcast_binomial_traffic),
    Algorithm("bcast", "scatter_allgather", bcast_scatter_allgather, "(lg p + p - 1) alpha + 2 (p-1)/p n beta",
              seconds=lambda p, n, a, b, c: (ceil_log2(p) + p - 1) * a + 2 * (p - 1) / p * n * b if p > 1 else 0.0,
              traffic=_bcast_scatter_allgather_traffic),
    Algorithm("scatter", "flat", scatter_flat, "(p-1) alpha + (p-1)/p n beta",
              seconds=_flat_seconds, rounds=lambda p: p - 1, traffic=_root_sends_to_all),
    Algorithm("scatter", "binomial", scatter_binomial, "lg p alpha + (p-1)/p n beta",
              seconds=_tree_seconds, rounds=ceil_log2, traffic=_scatter_binomial_traffic),
    Algorithm("gather", "flat", gather_flat, "(p-1) alpha + (p-1)/p n beta",
              seconds=_flat_seconds, traffic=non_roots_send_once),
    Algorithm("gather", "binomial", gather_binomial, "lg p alpha + (p-1)/p n beta",
              seconds=_tree_seconds, traffic=_gather_binomial_traffic),
]
BCAST = {row.name: row.run for row in ROWS if row.collective == "bcast"}
SCATTER = {row.name: row.run for row in ROWS if row.collective == "scatter"}
GATHER = {row.name: row.run for row in ROWS if row.collective == "gather"}
