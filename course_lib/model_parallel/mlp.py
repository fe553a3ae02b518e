"""The single-process reference network every parallel version is checked against.

A two-layer perceptron on a batch ``X`` of shape ``(B, D)``:

    H = X W1 + b1          (B, Hd)    first layer
    A = tanh(H)            (B, Hd)
    Y = A W2 + b2          (B, O)     second layer
    L = 1/(2B) * sum((Y - T)^2)

and its hand-written backward pass

    dY  = (Y - T) / B
    dW2 = A^T dY,  db2 = sum_rows(dY),  dA = dY W2^T
    dH  = dA * (1 - A^2)
    dW1 = X^T dH,  db1 = sum_rows(dH),  dX = dH W1^T

``tanh`` (not ReLU) keeps the function smooth, so finite differences check the
gradients and there is no tie at zero to break differently on different workers.

:func:`deep_forward_backward` is the same thing for a stack of layers (the
reference for the pipeline).
"""
from __future__ import annotations

import numpy as np

__all__ = ["init_mlp", "make_data", "forward", "backward", "loss",
           "init_deep", "deep_forward_backward", "param_bytes"]


def _check_2d(name, a):
    a = np.asarray(a)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {a.shape}")
    return a


def init_mlp(d_in: int, d_hidden: int, d_out: int, seed: int = 0) -> dict:
    """Random float64 parameters ``{"W1", "b1", "W2", "b2"}`` (scaled like Glorot)."""
    for name, v in (("d_in", d_in), ("d_hidden", d_hidden), ("d_out", d_out)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    rng = np.random.default_rng(seed)
    return {
        "W1": rng.normal(0, 1 / np.sqrt(d_in), (d_in, d_hidden)),
        "b1": rng.normal(0, 0.1, d_hidden),
        "W2": rng.normal(0, 1 / np.sqrt(d_hidden), (d_hidden, d_out)),
        "b2": rng.normal(0, 0.1, d_out),
    }


def make_data(batch: int, d_in: int, d_out: int, seed: int = 1):
    """A synthetic regression batch ``(X, T)``: targets from a fixed random tanh map."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(batch, d_in))
    M = rng.normal(size=(d_in, d_out)) / np.sqrt(d_in)
    T = np.tanh(X @ M) + 0.05 * rng.normal(size=(batch, d_out))
    return X, T


def forward(params: dict, X) -> dict:
    """Forward pass; returns the cache ``{"X", "H", "A", "Y"}`` the backward needs."""
    X = _check_2d("X", X)
    H = X @ params["W1"] + params["b1"]
    A = np.tanh(H)
    Y = A @ params["W2"] + params["b2"]
    return {"X": X, "H": H, "A": A, "Y": Y}


def loss(Y, T) -> float:
    """Mean-squared error ``1/(2B) sum (Y - T)^2`` (B = number of rows)."""
    Y, T = np.asarray(Y), np.asarray(T)
    if Y.shape != T.shape:
        raise ValueError(f"Y {Y.shape} and T {T.shape} must have the same shape")
    return float(0.5 * np.sum((Y - T) ** 2) / Y.shape[0])


def backward(params: dict, cache: dict, T) -> dict:
    """Gradients ``{"W1", "b1", "W2", "b2", "X"}`` of :func:`loss` at the cached forward."""
    X, A, Y = cache["X"], cache["A"], cache["Y"]
    dY = (Y - T) / X.shape[0]
    dA = dY @ params["W2"].T
    dH = dA * (1.0 - A * A)
    return {"W1": X.T @ dH, "b1": dH.sum(0), "W2": A.T @ dY, "b2": dY.sum(0),
            "X": dH @ params["W1"].T}


def param_bytes(params) -> int:
    """Bytes held by a dict (or list of dicts / tuples) of arrays."""
    if isinstance(params, dict):
        return sum(param_bytes(v) for v in params.values())
    if isinstance(params, (list, tuple)):
        return sum(param_bytes(v) for v in params)
    return int(np.asarray(params).nbytes)


# ----------------------------------------------------------------------------- deep stack
def init_deep(widths, seed: int = 0) -> list:
    """Layers ``[(W, b), ...]`` for widths ``[d0, d1, ..., dL]`` (L layers)."""
    widths = [int(w) for w in widths]
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"widths needs >= 2 positive entries, got {widths}")
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b))
            for a, b in zip(widths[:-1], widths[1:])]


def layer_forward(W, b, a_in, last: bool):
    """One layer: ``h = a_in W + b``; ``tanh(h)`` unless it is the last layer."""
    h = a_in @ W + b
    return h if last else np.tanh(h)


def layer_backward(W, a_in, a_out, d_out, last: bool):
    """Backward of :func:`layer_forward`: returns ``(dW, db, d_in)``."""
    dh = d_out if last else d_out * (1.0 - a_out * a_out)
    return a_in.T @ dh, dh.sum(0), dh @ W.T


def deep_forward_backward(layers, X, T, batch_total: int | None = None):
    """Loss and gradients ``[(dW, db), ...]`` of the stack, in one process.

    ``batch_total`` is the B in 1/(2B): pass the full batch size when ``X`` is one
    micro-batch, so that summing micro-batch gradients gives the full-batch gradient.
    """
    X, T = _check_2d("X", X), _check_2d("T", T)
    B = X.shape[0] if batch_total is None else int(batch_total)
    acts = [X]
    for i, (W, b) in enumerate(layers):
        acts.append(layer_forward(W, b, acts[-1], i == len(layers) - 1))
    Y = acts[-1]
    L = float(0.5 * np.sum((Y - T) ** 2) / B)
    d = (Y - T) / B
    grads = [None] * len(layers)
    for i in range(len(layers) - 1, -1, -1):
        dW, db, d = layer_backward(layers[i][0], acts[i], acts[i + 1], d, i == len(layers) - 1)
        grads[i] = (dW, db)
    return L, grads
