"""Lesson 01, MapReduce gradient descent: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex01_1  full_gradient(X, y, w)                      gradient of L(w) = (1/2N) ||X w - y||^2
ex01_2  map_gradient(X_shard, y_shard, w)           the map: a shard's partial gradient sum
ex01_3  reduce_update(partials, n_total, w, lr)     the reduce (sum, then 1/N) and the update step
ex01_4  comm_time(p, n_params, latency, bandwidth)  communication seconds of one iteration
ex01_5  speedup_table(times)                        speedups from measured seconds per iteration

The MapReduce runtime of :mod:`course_lib.mapreduce` maps least squares with
:func:`map_gradient`, reduces by sum with :func:`reduce_update`, and its cost model takes its
communication term from :func:`comm_time`.
"""
from __future__ import annotations

import numpy as np

WORD = 8  # bytes of a float64


def full_gradient(X, y, w):
    """(1/N) X^T (X w - y): the average over the N samples of (x_i^T w - y_i) x_i."""
    return X.T @ (X @ w - y) / len(X)


def map_gradient(X_shard, y_shard, w):
    """sum over the shard's rows of (x_i^T w - y_i) x_i (a sum, not a mean: the server divides by N once).

    With y of shape (n, k) and w of shape (d, k) (k outputs at once) it is the same product."""
    return X_shard.T @ (X_shard @ w - y_shard)


def reduce_update(partials, n_total, w, lr):
    """w - lr * (sum of the partial sums) / N: the partials are sums over rows, so divide by N once.

    The partials are added in list order (shard order), so a run is reproducible to the bit."""
    g = np.sum(partials, axis=0) / n_total
    return w - lr * g


def comm_time(p, n_params, latency, bandwidth):
    """Seconds of communication in one synchronous iteration on p workers with P = n_params:

        2 * latency + (8P + p * 8(P + 1)) / bandwidth

    The server's one link sends p copies of w (8P bytes each) one after the other and
    receives the p answers (P gradient numbers and a loss, 8(P + 1) bytes each) one after
    the other (incast). A link sends and receives at once, and the answers come back as
    staggered as the copies left, so the busier direction sets the pace: the p answers,
    after the first copy of w (no answer exists before it). The latencies of one direction
    overlap: one latency down, one up."""
    down, up = WORD * n_params, WORD * (n_params + 1)
    return 2 * latency + (p * max(down, up) + min(down, up)) / bandwidth


def speedup_table(times):
    """{p: median(T_fewest[1:]) / median(T_p[1:])}: [1:] drops the warm-up iteration."""
    base = np.median(np.asarray(times[min(times)])[1:])
    return {p: float(base / np.median(np.asarray(t)[1:])) for p, t in times.items()}
