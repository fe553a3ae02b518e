"""Lesson 00, the cluster in your laptop: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex00_1  sum_shard(comm, sa)                   each rank sums its contiguous block of a shared array
ex00_2  fit_latency_bandwidth(sizes, times)   least squares fit of  t = latency + size / bandwidth
ex00_3  ring_pass(comm, token)                pass a list once around a ring with send/recv

The library uses :func:`fit_latency_bandwidth` for its ping-pong measurements
(:mod:`course_lib.measure`) and the cost model of lesson 01 (:mod:`course_lib.mapreduce.cost`).
"""
from __future__ import annotations

import numpy as np


def sum_shard(comm, sa):
    """Sum of rank r's block ``sa.array[r*n//size:(r+1)*n//size]``, as a float."""
    a = sa.array
    n = len(a)
    lo, hi = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
    return float(np.sum(a[lo:hi]))


def fit_latency_bandwidth(sizes, times):
    """Least-squares fit of ``seconds = latency + nbytes / bandwidth``; returns (latency, bandwidth).

    Message sizes span decades, and an ordinary fit in absolute seconds lets the largest
    messages decide the intercept alone, so every point is weighted by 1/seconds (relative
    error), which keeps small messages, and so the latency, meaningful. A fitted latency below
    zero (noise on a fast link) is reported as 0; a slope <= 0 as an infinite bandwidth.
    """
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError("need two 1-D arrays of the same length >= 2")
    weight = 1.0 / np.maximum(y, 1e-12)
    A = np.stack([np.ones_like(x), x], axis=1) * weight[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(A, y * weight, rcond=None)
    bandwidth = 1.0 / float(per_byte) if per_byte > 0 else float("inf")
    return max(float(latency), 0.0), bandwidth


def ring_pass(comm, token):
    """Rank 0 sends ``[token]`` right; each rank appends its rank and passes it on; rank 0 returns it."""
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    if comm.rank == 0:
        comm.send([token], dest=right)
        return comm.recv(source=left)
    trail = comm.recv(source=left)
    comm.send(list(trail) + [comm.rank], dest=right)
    return None
