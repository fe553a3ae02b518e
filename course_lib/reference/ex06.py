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
    """This worker's hidden units for the whole batch, tanh(X W1_shard + b1_shard); with ``gather``,
    the shards of all workers side by side (the whole hidden layer, on every worker)."""
    # imported here, not at the top of course_lib/reference/ex06.py: course_lib.model_parallel
    # imports this module
    from course_lib.model_parallel.exchange import ring_allgather

    # no communication: each worker holds its own columns of W1 (and entries of b1) whole
    A_shard = np.tanh(np.asarray(X) @ W1_shard + b1_shard)
    return ring_allgather(comm, A_shard, axis=1) if gather else A_shard


def row_parallel_forward(comm, A_shard, W2_shard, b2):
    """Y = sum_r A_r W2_r + b2, the whole output, on every worker."""
    # the local partial product, then one ring allreduce (the runtime's, lesson 02)
    mine = np.asarray(A_shard) @ W2_shard
    # the bias once, after the reduction: added before it, it would count p times
    return comm.allreduce(mine, algorithm="ring") + b2


def row_parallel_backward(comm, A_shard, W2_shard, dY):
    """(dW2_shard, db2, dA_shard): the gradients of this worker's shards, given dY = dL/dY."""
    # Y = sum_r A_r W2_r + b2, so dW2_r = A_r^T dY, db2 = dY summed over the batch, dA_r = dY W2_r^T.
    # No communication: dY is the same on every worker, since Y was allreduced.
    return A_shard.T @ dY, dY.sum(axis=0), dY @ W2_shard.T


def predicted_bubble(p, m):
    """GPipe's bubble, the idle fraction of p stages on m micro-batches, as an exact Fraction."""
    # both phases last m + p - 1 steps, of which each stage is busy m: (p - 1) / (m + p - 1)
    return Fraction(int(p) - 1, int(m) + int(p) - 1)


def measured_bubble(timeline, p):
    """The idle fraction of a real pipeline run on p stages, from its timeline's ``"compute"`` events."""
    # 1 - (total compute time) / (p * span), the span from the first op's start to the last one's end
    ev = [e for e in timeline if e.kind == "compute"]
    span = max(e.end for e in ev) - min(e.start for e in ev)
    busy = sum(e.end - e.start for e in ev)
    return float(1.0 - busy / (p * span))


def in_graph_data_parallel(params, X, T, p):
    """TensorFlow's in-graph replication (Abadi et al. 2016): *one* client's graph of p replicas, as a
    list of ``Node``: ``"params"`` on rank 0 (the ps), replica r's gradient on rank r, ``"grad"`` (their
    sum, the full-batch gradient, flattened) on rank 0."""
    # imported here, not at the top of course_lib/reference/ex06.py: course_lib.model_parallel
    # imports this module
    from functools import partial

    import course_lib.model_parallel as mp
    from course_lib.model_parallel.graph import Node
    from course_lib.model_parallel.strategies import flatten, unflatten

    like = {k: np.asarray(v) for k, v in params.items()}
    X, T = np.asarray(X), np.asarray(T)
    batch = len(X)

    def share(X_rows, T_rows, flat_params):
        # replica r's share of the full-batch gradient, (B_r / B) g_r with g_r the mean gradient of
        # its rows: the shares add up to (1/B) sum over all B rows, whatever the shard sizes
        theta = unflatten(flat_params, like)
        return flatten(mp.backward(theta, mp.forward(theta, X_rows), T_rows)) * (len(X_rows) / batch)

    nodes = [Node("params", 0, partial(flatten, like))]
    # each replica's rows are a constant of its node, as each worker reads its own shard; only the
    # parameters travel out (to the p - 1 other workers) and one gradient back from each
    for r, rows in enumerate(np.array_split(np.arange(batch), p)):
        nodes.append(Node(f"replica{r}/grad", r, partial(share, X[rows], T[rows]), ("params",)))
    nodes.append(Node("grad", 0, lambda *shares: np.sum(shares, axis=0), tuple(f"replica{r}/grad" for r in range(p))))
    return nodes
