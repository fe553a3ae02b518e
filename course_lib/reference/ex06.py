"""Lesson 06, model and pipeline parallelism: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex06_1  column_parallel_forward(comm, X, W1_shard, b1_shard, gather)   this worker's hidden units
ex06_2  row_parallel_forward(comm, A_shard, W2_shard, b2)              the whole output on every worker
ex06_3  row_parallel_backward(comm, A_shard, W2_shard, dY)             (dW2_shard, db2, dA_shard)
ex06_4  predicted_bubble(p, m)                                         GPipe's idle fraction, (p-1)/(m+p-1)
ex06_5  measured_bubble(timeline, p)                                   the idle fraction of a real run
ex06_6  in_graph_data_parallel(params, X, T, p)                        one graph holding p replicas

The tensor-parallel network of :mod:`course_lib.model_parallel.tensor` runs on the three layer
functions; :mod:`course_lib.model_parallel.pipeline` keeps its names ``bubble_formula`` and
``measured_bubble`` as wrappers of ex06_4 and ex06_5; :mod:`course_lib.model_parallel.replication`
re-exports ex06_6 under its name.
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


# ------------------------------------------------------------------------------ ex06_6
def _flat_params(like):
    from course_lib.model_parallel.strategies import flatten

    return flatten(like)


def _replica_share(X_rows, T_rows, batch, like, flat_params):
    """Replica r's share of the full-batch gradient: (B_r / B) g_r, g_r the mean gradient of its rows."""
    from course_lib.model_parallel import backward, forward
    from course_lib.model_parallel.strategies import flatten, unflatten

    theta = unflatten(flat_params, like)
    return flatten(backward(theta, forward(theta, X_rows), T_rows)) * (len(X_rows) / batch)


def _sum_shares(*shares):
    return np.sum(shares, axis=0)


def in_graph_data_parallel(params, X, T, p):
    """TensorFlow's in-graph replication (Abadi et al. 2016): *one* client's graph of p replicas.

    Nodes, 1 + p + 1: ``"params"`` on rank 0 (the ps) holds the flattened parameters; replica r,
    ``"replica{r}/grad"`` on rank r, reads them and computes on its rows (``np.array_split``, a
    constant of its node, as each worker reads its own shard) the share ``(B_r / B) g_r``; ``"grad"``
    on rank 0 adds the shares. With g_r = (1/B_r) sum over its rows, the sum is the full-batch
    gradient (1/B) sum over all B rows, whatever the shard sizes. Traffic: the parameters to each
    of the p - 1 other workers, one gradient back from each: 2 (p - 1) x the parameter bytes.
    """
    from functools import partial

    from course_lib.model_parallel.graph import Node

    like = {k: np.asarray(v) for k, v in params.items()}
    X, T = np.asarray(X), np.asarray(T)
    nodes = [Node("params", 0, partial(_flat_params, like))]
    for r, rows in enumerate(np.array_split(np.arange(len(X)), p)):
        nodes.append(Node(f"replica{r}/grad", r, partial(_replica_share, X[rows], T[rows], len(X), like),
                          ("params",)))
    nodes.append(Node("grad", 0, _sum_shares, tuple(f"replica{r}/grad" for r in range(p))))
    return nodes
