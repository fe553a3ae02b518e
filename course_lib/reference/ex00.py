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
    """Sum of this rank's contiguous block of the shared array ``sa``, as a float.

    The blocks are those of ``np.array_split(sa.array, p)``, the course's split: with n values on
    p workers, the first n % p blocks hold n // p + 1 values and the others n // p, so they cover
    the array once and their sizes differ by at most one element."""
    a = sa.array
    r = comm.rank
    base, extra = divmod(len(a), comm.size)   # extra: how many blocks, the first ones, get one more value
    lo = r * base + min(r, extra)             # every earlier rank took base values, and min(r, extra) one more
    hi = lo + base + (1 if r < extra else 0)
    # a view of the block, no copy: every worker reads the one array in shared memory
    return float(a[lo:hi].sum())


def fit_latency_bandwidth(sizes, times):
    """Least squares fit of ``time = latency + size / bandwidth``; returns (latency, bandwidth).

    One straight line through all the (size, time) rows, in any order: the intercept is the
    latency (the time of an empty message), the slope the seconds per byte, 1 / bandwidth."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or len(s) < 2:
        raise ValueError("need two 1-D arrays of the same length >= 2")
    # the columns [1, size] of A multiply (latency, slope): t ~ A @ (latency, slope)
    A = np.column_stack([np.ones_like(s), s])
    (latency, slope), *_ = np.linalg.lstsq(A, t, rcond=None)
    # on noisy timings of small messages the slope can come out <= 0: no measurable cost per byte
    return float(latency), (1.0 / float(slope) if slope > 0 else float("inf"))


def ring_pass(comm, token):
    """Pass ``[token]`` once around the ring, each rank appending its rank; rank 0 returns the list.

    Rank 0 sends ``[token]`` to its right neighbour and returns what comes back from its left;
    every other rank returns None."""
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    if comm.rank == 0:
        comm.send([token], dest=right)
        return comm.recv(source=left)
    # receive before sending: rank 0 is the only one that starts, so the token goes round in order
    trail = comm.recv(source=left)
    comm.send(list(trail) + [comm.rank], dest=right)
    return None
