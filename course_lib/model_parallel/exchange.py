"""The few collectives tensor parallelism needs, written with point-to-point messages.

Kept here (and not taken from the collectives lesson) so this lesson stands alone and
its byte counts are exactly the ones below. Both are the ring algorithms (Patarasuk and
Yuan 2009; Thakur, Rabenseifner and Gropp 2005): rank r only talks to its ring
neighbours r-1 and r+1, one block per step, p-1 steps. ``ring_allreduce`` is re-exported
from :mod:`course_lib.reference` (in the student release it runs the student's own answer),
and the checks of the collectives lesson refuse an answer that calls the two helpers below.
This lesson's layers sum with the runtime's ``comm.allreduce(x, algorithm="ring")``, which
moves exactly :func:`allreduce_bytes`.

Bytes on the wire, summed over all links, for p workers and an array of n float64
values (``item = 8``):

    ring allgather      (p-1) * n * item   (n = size of the gathered result)
    ring reduce-scatter (p-1) * n * item   (n = size of the input on each rank)
    ring allreduce    2 (p-1) * n * item   (= reduce-scatter + allgather)

Each rank sends 1/p of that. These counts hold for uneven blocks too: every block
crosses p-1 links once per phase.
"""
from __future__ import annotations

import numpy as np

from course_lib.reference.ex02 import ring_allreduce  # noqa: F401

__all__ = ["ring_allgather", "ring_reduce_scatter", "ring_allreduce",
           "allgather_bytes", "reduce_scatter_bytes", "allreduce_bytes"]

# Tags of this module's messages (user context; well away from small tags students use).
TAG_ALLGATHER = 6001
TAG_REDUCE_SCATTER = 6002


def _ring(comm):
    p, r = comm.size, comm.rank
    return p, r, (r + 1) % p, (r - 1) % p


def ring_allgather(comm, block, axis: int = -1):
    """Concatenate every rank's ``block`` along ``axis``, in rank order, on every rank.

    Blocks may differ in size along ``axis`` (like the column shards of a layer whose
    width is not a multiple of p). Step k: send the block received at step k-1 (at
    step 0: our own) to r+1, receive block r-k-1 from r-1.
    """
    block = np.ascontiguousarray(block)
    p, r, right, left = _ring(comm)
    blocks = [None] * p
    blocks[r] = block
    for k in range(p - 1):
        send_idx, recv_idx = (r - k) % p, (r - k - 1) % p
        blocks[recv_idx] = comm.sendrecv(blocks[send_idx], dest=right, source=left,
                                         sendtag=TAG_ALLGATHER, recvtag=TAG_ALLGATHER)
    return np.concatenate(blocks, axis=axis) if p > 1 else block.copy()


def ring_reduce_scatter(comm, x):
    """Sum ``x`` over ranks; rank r ends with block r of the sum, cut along axis 0.

    The blocks are ``np.array_split(x, p, axis=0)`` (nearly equal, the first ones one row
    longer). Step k: send our partial sum of block r-k-1 to r+1, receive partial block
    r-k-2 from r-1 and add our own contribution; after p-1 steps block r is complete.
    """
    x = np.asarray(x, dtype=np.float64)
    p, r, right, left = _ring(comm)
    chunks = np.array_split(x, p, axis=0)
    acc = chunks[(r - 1) % p].copy()
    for k in range(p - 1):
        recv_idx = (r - k - 2) % p
        got = comm.sendrecv(acc, dest=right, source=left,
                            sendtag=TAG_REDUCE_SCATTER, recvtag=TAG_REDUCE_SCATTER)
        acc = got + chunks[recv_idx]
    # after p-1 steps acc is the full sum of block (r - p) % p == r
    return acc


def _check(p, n, itemsize):
    if int(p) < 1 or int(n) < 0:
        raise ValueError(f"need p >= 1 and n >= 0, got p={p}, n={n}")
    return int(p), int(n) * int(itemsize)


def allgather_bytes(p: int, n: int, itemsize: int = 8) -> int:
    """Total bytes of :func:`ring_allgather` whose result has n items."""
    p, nb = _check(p, n, itemsize)
    return (p - 1) * nb


def reduce_scatter_bytes(p: int, n: int, itemsize: int = 8) -> int:
    """Total bytes of :func:`ring_reduce_scatter` of an n-item array."""
    p, nb = _check(p, n, itemsize)
    return (p - 1) * nb


def allreduce_bytes(p: int, n: int, itemsize: int = 8) -> int:
    """Total bytes of :func:`ring_allreduce` of an n-item array."""
    p, nb = _check(p, n, itemsize)
    return 2 * (p - 1) * nb
