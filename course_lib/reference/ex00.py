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
    """Least-squares fit of ``time = latency + size / bandwidth``; returns (latency, bandwidth).

    One straight line through all the (size, time) rows, in any order: the intercept is the
    latency (the time of an empty message), the slope seconds per byte, so bandwidth = 1 / slope
    (infinite if the slope is not positive)."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or len(s) < 2:
        raise ValueError("need two 1-D arrays of the same length >= 2")
    A = np.column_stack([np.ones_like(s), s])
    (latency, slope), *_ = np.linalg.lstsq(A, t, rcond=None)
    return float(latency), (1.0 / float(slope) if slope > 0 else float("inf"))


def ring_pass(comm, token):
    """Rank 0 sends ``[token]`` right; each rank appends its rank and passes it on; rank 0 returns it."""
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    if comm.rank == 0:
        comm.send([token], dest=right)
        return comm.recv(source=left)
    trail = comm.recv(source=left)
    comm.send(list(trail) + [comm.rank], dest=right)
    return None
