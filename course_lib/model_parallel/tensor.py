"""Tensor (model) parallelism for the two-layer network of :mod:`.mlp`.

Megatron-LM style (Shoeybi et al. 2019). With p workers, worker r owns

* columns ``c_r`` of W1 and b1  (column-parallel first layer): it computes the hidden
  units ``c_r`` of the whole batch, ``H_r = X W1[:, c_r] + b1[c_r]``, with no
  communication, because every hidden unit needs all inputs but only its own column;
* the same rows ``c_r`` of W2  (row-parallel second layer): ``A_r W2[c_r, :]`` is a
  *partial sum* of the output; ``Y = sum_r A_r W2[c_r, :] + b2`` needs an allreduce.

Backward: ``dY`` is the same on every worker (Y was allreduced), so
``dW2[c_r] = A_r^T dY`` and ``dA_r = dY W2[c_r]^T`` are local: the row-parallel layer
communicates nothing on the way back. The column-parallel layer's input gradient
``dX = sum_r dH_r W1[:, c_r]^T`` is again a sum over workers (an allreduce), needed only
when something comes before the layer.

A column-parallel layer used *alone* (its output needed whole) needs an allgather of
the column shards instead: ``(p-1) B Hd`` values on the wire.

Parameter memory per worker: ``(D Hd + Hd + Hd O) / p + O`` values (b2 is replicated),
against ``D Hd + Hd + Hd O + O`` for the whole network.
"""
from __future__ import annotations

import numpy as np

# The layers themselves are questions ex06_1 to ex06_3 (course_lib.reference.ex06).
from course_lib.reference.ex06 import column_parallel_forward, row_parallel_backward
from course_lib.reference.ex06 import row_parallel_forward as _row_parallel_forward

from .exchange import ring_reduce_scatter
from .mlp import loss as mse_loss

__all__ = ["split_ranges", "shard_mlp", "column_parallel_forward", "row_parallel_forward",
           "row_parallel_backward", "column_parallel_backward", "tp_mlp_step",
           "assemble_grads", "tp_param_bytes", "tp_step_bytes"]


def split_ranges(n: int, p: int):
    """Cut ``range(n)`` in p contiguous nearly-equal ranges ``[(start, stop), ...]``."""
    n, p = int(n), int(p)
    if p < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    if n < p:
        raise ValueError(f"cannot split {n} columns over {p} workers: need at least one each")
    # like np.array_split: the first n % p ranges get one extra column
    sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def shard_mlp(params: dict, p: int, rank: int) -> dict:
    """The parameters worker ``rank`` of ``p`` keeps (copies, not views)."""
    W1 = np.asarray(params["W1"])
    a, b = split_ranges(W1.shape[1], p)[rank]
    return {"W1": W1[:, a:b].copy(), "b1": np.asarray(params["b1"])[a:b].copy(),
            "W2": np.asarray(params["W2"])[a:b, :].copy(), "b2": np.asarray(params["b2"]).copy(),
            "cols": (a, b)}


def row_parallel_forward(comm, A_shard, W2_shard, b2, scatter: bool = False):
    """``Y = sum_r A_r W2_r + b2`` on every worker: question ex06_2
    (:func:`course_lib.reference.ex06.row_parallel_forward`).

    With ``scatter=True`` worker r only gets its block of rows of Y (the rows
    ``np.array_split(range(B), p)[r]``): a reduce-scatter, half the bytes of the allreduce.
    """
    if not scatter:
        return _row_parallel_forward(comm, A_shard, W2_shard, b2)
    return ring_reduce_scatter(comm, np.asarray(A_shard) @ W2_shard) + b2


def column_parallel_backward(comm, X, W1_shard, A_shard, dA_shard, need_dX: bool = True):
    """``(dW1_shard, db1_shard, dX)``; dX is a sum over workers (the runtime's ring allreduce)."""
    dH = dA_shard * (1.0 - A_shard * A_shard)
    dX = comm.allreduce(dH @ W1_shard.T, algorithm="ring") if need_dX else None
    return np.asarray(X).T @ dH, dH.sum(0), dX


def tp_mlp_step(comm, params, X, T, need_dX: bool = True):
    """One forward + backward of the network, tensor-parallel over all ranks.

    ``params`` is the full parameter dict (plain arrays or SharedArrays); each worker
    copies only its own shard out of it. Returns a dict with the replicated output
    ``Y``, ``loss`` and ``dX``, this worker's gradient shards, its parameter bytes and
    the bytes it sent during the step.
    """
    p, r = comm.size, comm.rank
    shard = shard_mlp({k: np.asarray(v) for k, v in params.items()}, p, r)
    X, T = np.asarray(X), np.asarray(T)
    sent0 = comm.stats.bytes_sent(r)
    with comm.compute("col fwd"):
        A_r = column_parallel_forward(comm, X, shard["W1"], shard["b1"])
    Y = row_parallel_forward(comm, A_r, shard["W2"], shard["b2"])
    fwd_bytes = comm.stats.bytes_sent(r) - sent0
    with comm.compute("row bwd"):
        dY = (Y - T) / X.shape[0]
        dW2, db2, dA_r = row_parallel_backward(comm, A_r, shard["W2"], dY)
    dW1, db1, dX = column_parallel_backward(comm, X, shard["W1"], A_r, dA_r, need_dX)
    held = sum(shard[k].nbytes for k in ("W1", "b1", "W2", "b2"))
    return {"Y": Y, "loss": mse_loss(Y, T), "dX": dX, "cols": shard["cols"],
            "grads": {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2},
            "param_bytes": int(held), "fwd_bytes": int(fwd_bytes),
            "bytes_sent": int(comm.stats.bytes_sent(r) - sent0)}


def assemble_grads(results) -> dict:
    """Glue the per-worker gradient shards of :func:`tp_mlp_step` into full gradients."""
    g = [res["grads"] for res in results]
    return {"W1": np.concatenate([x["W1"] for x in g], axis=1),
            "b1": np.concatenate([x["b1"] for x in g]),
            "W2": np.concatenate([x["W2"] for x in g], axis=0),
            "b2": g[0]["b2"]}


def tp_param_bytes(d_in, d_hidden, d_out, p, itemsize=8):
    """Parameter bytes per worker, ``[bytes of rank 0, ..., rank p-1]``."""
    out = []
    for a, b in split_ranges(d_hidden, p):
        w = b - a
        out.append((d_in * w + w + w * d_out + d_out) * itemsize)
    return out


def tp_step_bytes(batch, d_in, d_out, p, need_dX=True, itemsize=8):
    """Total bytes of one :func:`tp_mlp_step`: allreduce of Y (B x O) forward,
    allreduce of dX (B x D) backward."""
    from .exchange import allreduce_bytes
    return allreduce_bytes(p, batch * d_out, itemsize) + (
        allreduce_bytes(p, batch * d_in, itemsize) if need_dX else 0)
