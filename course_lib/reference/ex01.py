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


def full_gradient(X, y, w):
    """Gradient of L(w) = (1/2N) ||X w - y||^2 at w."""
    # (1/N) X^T (X w - y): the average over the N samples of (x_i^T w - y_i) x_i, as two matrix
    # products (no Python loop over the samples)
    return X.T @ (X @ w - y) / len(X)


def map_gradient(X_shard, y_shard, w):
    """The map: the sum over the shard's rows of (x_i^T w - y_i) x_i (a sum, not a mean).

    With y of shape (n, k) and w of shape (d, k) (k outputs at once) it is the same product."""
    # a sum, so that the server divides by N once, whatever the shard sizes
    return X_shard.T @ (X_shard @ w - y_shard)


def reduce_update(partials, n_total, w, lr):
    """The reduce and the step: w - lr * (sum of the partial sums) / N."""
    # added in list order (shard order): a run is reproducible to the bit
    g = np.sum(partials, axis=0) / n_total
    return w - lr * g


def comm_time(p, n_params, latency, bandwidth):
    """Seconds of communication in one synchronous iteration on p workers, with P = n_params:

        2 * latency + (8P + p * 8(P + 1)) / bandwidth
    """
    # bytes of one copy of w down, and of one answer up (P gradient numbers and a loss), float64
    down, up = 8 * n_params, 8 * (n_params + 1)
    # The server's link sends and receives at once; the p answers arrive one after the other
    # (incast) and set the pace, after the first copy of w (no answer exists before it). The
    # latencies of the messages going one way overlap: one latency down, one up.
    return 2 * latency + (down + p * up) / bandwidth


def speedup_table(times):
    """{p: median(T_fewest[1:]) / median(T_p[1:])} from measured seconds per iteration, by p."""
    # [1:] drops each run's first iteration: it pays the warm-up (imports, first pages touched)
    base = np.median(np.asarray(times[min(times)])[1:])
    return {p: float(base / np.median(np.asarray(t)[1:])) for p, t in times.items()}
