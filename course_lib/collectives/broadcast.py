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

from ._p2p import chunk_bounds, is_array, pack_blocks, unpack_blocks


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


def scatter_contiguous(t, flat, root, info=None):
    """Binomial scatter of a 1-D array cut into p chunks; relative rank v gets chunk v.

    The root passes ``flat`` and ``info`` (carried along to every rank); returns
    (my_chunk, info). Each message holds the chunks of the receiver's whole subtree."""
    p, r = t.size, t.rank
    vr = (r - root) % p
    low = _lowbit(vr, p)
    if vr == 0:
        b = chunk_bounds(flat.size, p)
        base = 0
    else:
        (flat, meta) = t.recv_info((vr - low + root) % p)
        info, b = meta
        base = b[vr]
    m = low // 2
    while m >= 1:
        c = vr + m
        if c < p:
            hi = min(c + m, p)
            t.send(flat[b[c] - base:b[hi] - base], (c + root) % p, info=(info, b))
        m //= 2
    return flat[b[vr] - base:b[vr + 1] - base], (info, b)


def _to_flat(obj):
    if is_array(obj):
        return np.ascontiguousarray(obj).reshape(-1), ("arr", obj.shape)
    return np.frombuffer(pickle.dumps(obj, protocol=5), dtype=np.uint8), ("pickle", None)


def _from_flat(flat, meta):
    kind, shape = meta
    return flat.reshape(shape) if kind == "arr" else pickle.loads(flat.tobytes())


def bcast_scatter_allgather(t, obj, root=0):
    p, r = t.size, t.rank
    if p == 1:
        return obj
    flat, meta = _to_flat(obj) if r == root else (None, None)
    mine, (meta, b) = scatter_contiguous(t, flat, root, meta)
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
    return _from_flat(np.concatenate(chunks), meta)


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
    vr = (r - root) % p
    low = _lowbit(vr, p)
    if r == root:
        _check_seq(seq, p)
        if is_array(seq) and seq.ndim >= 1:
            # rows of one array: contiguous slices travel, no pickling
            rel = np.concatenate([seq[root:], seq[:root]]) if root else seq
            payload = np.ascontiguousarray(rel).reshape(-1)
            meta = (seq.shape[1:], chunk_bounds(payload.size, p))
        else:
            items = list(seq)
            payload, meta = items[root:] + items[:root], None   # payload[v] -> relative rank v
    else:
        payload, meta = t.recv_info((vr - low + root) % p)
    m = low // 2
    if meta is None:
        while m >= 1:
            c = vr + m
            if c < p:
                t.send(payload[c - vr:min(c + m, p) - vr], (c + root) % p)
            m //= 2
        return payload[0]
    rowshape, b = meta
    base = b[vr]
    while m >= 1:
        c = vr + m
        if c < p:
            t.send(payload[b[c] - base:b[min(c + m, p)] - base], (c + root) % p, info=meta)
        m //= 2
    return payload[:b[vr + 1] - base].reshape(rowshape)


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
            payload, info = pack_blocks(held)
            t.send(payload, (vr - m + root) % p, info=info)
            return None
        if vr + m < p:
            payload, info = t.recv_info((vr + m + root) % p)
            held.update(unpack_blocks(payload, info))
        m *= 2
    return [held[(src - root) % p] for src in range(p)]


BCAST = {"flat": bcast_flat, "binomial": bcast_binomial, "scatter_allgather": bcast_scatter_allgather}
SCATTER = {"flat": scatter_flat, "binomial": scatter_binomial}
GATHER = {"flat": gather_flat, "binomial": gather_binomial}
