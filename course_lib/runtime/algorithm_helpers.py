"""What every collective algorithm is built from: the transport, chunks, folding, packed blocks.

An algorithm is a plain function ``alg(t, ...)`` of a *transport* ``t`` with
``t.rank``, ``t.size`` and three calls:

* ``t.send(obj, dest)``
* ``t.recv(source) -> obj``
* ``t.sendrecv(obj, dest, source) -> obj`` (both at once: never deadlocks, however
  large the message)

Messages carry nothing but their payload: whatever a receiver needs to interpret a
message (block ids, shapes) it must know from the algorithm, as in MPI, where every
rank knows the counts from the call's arguments. The same algorithm runs on real
processes (the communicator's collective methods) and in lesson 02's in-process thread
simulator (:mod:`course_lib.collectives.sim`), which the fast unit tests use.

The runtime's own algorithms (:mod:`.base_collectives`) and lesson 02's teaching variants
(:mod:`course_lib.collectives`) are built from the helpers here, and so are their cost rows
(:class:`TrafficCount`, :func:`folded_seconds`). They live in the runtime because the
runtime's algorithms need them and the runtime imports no lesson.
"""
from __future__ import annotations

import numpy as np


def is_array(x) -> bool:
    """A numpy array of plain numbers: what collectives may slice, add and send as raw bytes."""
    return type(x) is np.ndarray and not x.dtype.hasobject


def need_array(x, name):
    if not is_array(x):
        raise TypeError(f"algorithm {name!r} cuts the buffer into chunks, so it needs a numpy array, "
                        f"got {type(x).__name__}; use algorithm='recursive_doubling' for other objects")


def need_commute(op, name):
    if not op.commute:
        raise ValueError(f"algorithm {name!r} combines contributions out of rank order, so it needs a "
                         f"commutative op; {op!r} is not (use 'recursive_doubling' or 'reduce_bcast')")


# -- chunks, trees and folding ----------------------------------------------------------------
def chunk_bounds(n: int, p: int) -> list[int]:
    """Boundaries of p near-equal chunks of n elements (the first n % p get one more),
    as ``np.array_split`` cuts: chunk i is ``[b[i], b[i+1])``."""
    q, rem = divmod(n, p)
    b = [0]
    for i in range(p):
        b.append(b[-1] + q + (1 if i < rem else 0))
    return b


def chunk_sizes(n: int, p: int) -> list[int]:
    b = chunk_bounds(n, p)
    return [b[i + 1] - b[i] for i in range(p)]


def pack_blocks(blocks: dict):
    """Several blocks in one message, in block-id order. Arrays of one shape and dtype
    travel as one concatenated array (payload = their bytes exactly); anything else as
    a list (pickled)."""
    vals = [blocks[i] for i in sorted(blocks)]
    if vals and all(is_array(v) for v in vals) and len({(v.shape, v.dtype) for v in vals}) == 1:
        return np.concatenate([v.reshape(-1) for v in vals])
    return vals


def unpack_blocks(payload, ids, like) -> dict:
    """Inverse of :func:`pack_blocks`: ``ids`` are the block ids the sender packed (known
    from the algorithm), ``like`` a block of the same shape (the receiver's own)."""
    ids = sorted(ids)
    if is_array(payload) and is_array(like):
        parts = payload.reshape(len(ids), -1) if ids else []
        return {i: parts[k].reshape(like.shape) for k, i in enumerate(ids)}
    return dict(zip(ids, payload))


def fold_roles(p: int):
    """Reduce p to the largest power of two p2 <= p, as Thakur et al. (2005) do for
    recursive doubling/halving: among the first 2r ranks (r = p - p2) each even rank
    hands its data to the odd rank above it and sits out.

    Returns (p2, r, virt, real): virt[rank] is the virtual rank (None for a rank that
    sits out) and real[v] the real rank of virtual rank v."""
    p2 = 1
    while p2 * 2 <= p:
        p2 *= 2
    r = p - p2
    virt = [None] * p
    real = []
    for v in range(p2):
        real.append(2 * v + 1 if v < r else v + r)
    for v, rk in enumerate(real):
        virt[rk] = v
    return p2, r, virt, real


def ceil_log2(p: int) -> int:
    return (p - 1).bit_length()


def lowbit(v: int, p: int) -> int:
    """Size of the binomial subtree rooted at relative rank v (the root's is >= p)."""
    if v == 0:
        m = 1
        while m < p:
            m *= 2
        return m
    return v & -v


def binomial_children(vr: int, p: int) -> list[int]:
    """Children of relative rank vr in the binomial tree of bcast and scatter (largest first)."""
    out, m = [], lowbit(vr, p) // 2
    while m >= 1:
        if vr + m < p:
            out.append(vr + m)
        m //= 2
    return out


def halving_ranges(v: int, p2: int):
    """(keep, give) virtual-rank ranges of v in each round of recursive halving."""
    lo, hi, m, out = 0, p2, p2 // 2, []
    while m >= 1:
        mid = lo + m
        keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
        out.append((keep, give))
        lo, hi = keep
        m //= 2
    return out


def folded_rounds(p: int) -> tuple[int, int]:
    """(lg p2, 2 or 0): rounds among the p2 = 2^floor(lg p) ranks that stay after folding,
    and the two extra rounds (fold in, unfold out) when p is not a power of two."""
    p2 = 1 << (p.bit_length() - 1)
    return p2.bit_length() - 1, (0 if p == p2 else 2)


# -- what the cost rows share ---------------------------------------------------------------------
class TrafficCount:
    """Bytes and messages each of p ranks sends in one call, counted by an algorithm's
    ``traffic`` row: ``add(rank, elements, messages)`` adds ``elements * itemsize`` bytes."""

    def __init__(self, p: int, itemsize: int):
        self.bytes = np.zeros(p, dtype=np.int64)
        self.messages = np.zeros(p, dtype=np.int64)
        self.itemsize = itemsize

    def add(self, rank: int, elements: int, messages: int = 1) -> None:
        self.bytes[rank] += elements * self.itemsize
        self.messages[rank] += messages

    def result(self):
        return self.bytes, self.messages


def non_roots_send_once(p, n, itemsize, root, ndim):
    """Traffic of flat gather and of reduce: every rank but the root sends its n elements once."""
    count = TrafficCount(p, itemsize)
    for r in range(p):
        if r != root:
            count.add(r, n)
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
