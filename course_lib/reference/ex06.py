"""Lesson 06, model and pipeline parallelism: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex06_1  column_parallel_forward(comm, X, W1_shard, b1_shard, gather)   this worker's hidden units
ex06_2  row_parallel_forward(comm, A_shard, W2_shard, b2)              the whole output on every worker
ex06_3  row_parallel_backward(comm, A_shard, W2_shard, dY)             (dW2_shard, db2, dA_shard)
ex06_4  predicted_bubble(p, m)                                         GPipe's idle fraction, (p-1)/(m+p-1)
ex06_5  measured_bubble(timeline, p)                                   the idle fraction of a real run

The tensor-parallel network of :mod:`course_lib.model_parallel.tensor` runs on the three layer
functions; :mod:`course_lib.model_parallel.pipeline` keeps its names ``bubble_formula`` and
``measured_bubble`` as wrappers of the last two.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np


def column_parallel_forward(comm, X, W1_shard, b1_shard, gather=False):
    """tanh(X W1_shard + b1_shard): this worker's hidden units for the whole batch, with no
    communication; with ``gather`` the shards of all workers side by side (a ring allgather)."""
    from course_lib.model_parallel.exchange import ring_allgather

    A_shard = np.tanh(np.asarray(X) @ W1_shard + b1_shard)
    return ring_allgather(comm, A_shard, axis=1) if gather else A_shard


def row_parallel_forward(comm, A_shard, W2_shard, b2):
    """Y = sum_r A_r W2_r + b2 on every worker: the local partial product, one ring allreduce,
    then the bias once (added before the reduction it would count p times)."""
    partial = np.asarray(A_shard) @ W2_shard
    return comm.allreduce(partial, algorithm="ring") + b2


def row_parallel_backward(comm, A_shard, W2_shard, dY):
    """(dW2_shard, db2, dA_shard) = (A_r^T dY, sum of dY over the batch, dY W2_r^T).

    No communication: dY is the same on every worker, since Y was allreduced."""
    return A_shard.T @ dY, dY.sum(axis=0), dY @ W2_shard.T


def predicted_bubble(p, m):
    """(p - 1) / (m + p - 1) as an exact fraction: both GPipe's phases last m + p - 1 steps, of
    which each stage is busy m."""
    return Fraction(int(p) - 1, int(m) + int(p) - 1)


def measured_bubble(timeline, p):
    """1 - (total compute time) / (p * span), over the run's ``"compute"`` events, the span from
    the first one's start to the last one's end."""
    ev = [e for e in timeline if e.kind == "compute"]
    span = max(e.end for e in ev) - min(e.start for e in ev)
    busy = sum(e.end - e.start for e in ev)
    return float(1.0 - busy / (p * span))
