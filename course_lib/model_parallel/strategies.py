"""Data parallelism on the same two-layer network, for the lesson's comparison table.

Lesson 01 reduces gradients through a server (rank 0 gathers and sums the gradients,
then sends the new weights back); lesson 02 does it with a ring allreduce. Both keep a
full copy of the parameters on every worker and split the *batch*; tensor parallelism
splits the *weights* (:mod:`.tensor`); pipeline parallelism splits the *layers*
(:mod:`.pipeline`).
"""
from __future__ import annotations

import numpy as np

from .mlp import backward, forward

__all__ = ["data_parallel_step", "flatten", "unflatten"]

TAG_DP = 6031
KEYS = ("W1", "b1", "W2", "b2")


def flatten(grads) -> np.ndarray:
    """One flat float64 vector of W1, b1, W2, b2 (the message a data-parallel step sends)."""
    return np.concatenate([np.asarray(grads[k]).ravel() for k in KEYS])


def unflatten(vec, like) -> dict:
    out, at = {}, 0
    for k in KEYS:
        n = np.asarray(like[k]).size
        out[k] = vec[at:at + n].reshape(np.shape(like[k]))
        at += n
    return out


def data_parallel_step(comm, params, X, T, mode: str = "ring"):
    """Gradient of the full batch, each worker working on ``B/p`` rows.

    ``mode="server"`` (lesson 01): workers send their gradient to rank 0, which sums
    and sends the sum back. ``mode="ring"`` (lesson 02): the runtime's ring allreduce.
    Returns the full gradient, the parameter bytes held and the bytes sent.
    """
    if mode not in ("ring", "server"):
        raise ValueError(f"mode must be 'ring' or 'server', got {mode!r}")
    p, r = comm.size, comm.rank
    params = {k: np.asarray(v).copy() for k, v in params.items()}
    X, T = np.asarray(X), np.asarray(T)
    rows = np.array_split(np.arange(X.shape[0]), p)[r]
    sent0 = comm.stats.bytes_sent(r)
    with comm.compute("local grad"):
        cache = forward(params, X[rows])
        g = backward(params, cache, T[rows])
        # local grads use 1/B_local; rescale so that the sum over workers is the full-batch mean
        g = flatten(g) * (len(rows) / X.shape[0])
    if p == 1:
        total = g
    elif mode == "ring":
        total = comm.allreduce(g, algorithm="ring")
    elif r == 0:
        total = g.copy()
        for src in range(1, p):
            total = total + comm.recv(source=src, tag=TAG_DP)
        for dst in range(1, p):
            comm.send(total, dst, tag=TAG_DP)
    else:
        comm.send(g, 0, tag=TAG_DP)
        total = comm.recv(source=0, tag=TAG_DP)
    return {"grads": unflatten(total, params),
            "param_bytes": int(sum(v.nbytes for v in params.values())),
            "bytes_sent": int(comm.stats.bytes_sent(r) - sent0)}
