"""The model every lesson 08 run trains: lesson 06's stack of tanh layers, seen as one vector.

Data-parallel training moves gradients as flat vectors (DDP's buckets, ZeRO's shards), so the
layers ``[(W, b), ...]`` of :func:`course_lib.model_parallel.mlp.init_deep` are laid out in
one vector, layer 0 first, ``W`` before ``b``. :class:`Adam` updates such a vector.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def layer_sizes(layers) -> list[int]:
    """Number of parameters of each layer, ``W.size + b.size``."""
    return [int(np.size(W) + np.size(b)) for W, b in layers]


def flatten_layers(layers, dtype=None) -> np.ndarray:
    """One vector of every parameter: layer 0's W then b, then layer 1's, ..."""
    parts = [np.asarray(a).ravel() for W, b in layers for a in (W, b)]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return flat if dtype is None else flat.astype(dtype)


def unflatten_layers(flat, like) -> list[tuple[np.ndarray, np.ndarray]]:
    """The inverse of :func:`flatten_layers`: views of ``flat`` shaped as the layers ``like``."""
    flat = np.asarray(flat)
    need = sum(layer_sizes(like))
    if flat.ndim != 1 or flat.size != need:
        raise ValueError(f"a flat vector of {need} parameters is needed, got shape {flat.shape}")
    out, at = [], 0
    for W, b in like:
        w_n, b_n = np.size(W), np.size(b)
        out.append((flat[at:at + w_n].reshape(np.shape(W)), flat[at + w_n:at + w_n + b_n].reshape(np.shape(b))))
        at += w_n + b_n
    return out


def layer_ranges(layers) -> list[tuple[int, int]]:
    """``[start, end)`` of each layer's parameters in the flat vector."""
    ends = np.cumsum([0] + layer_sizes(layers))
    return [(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]


@dataclass
class Adam:
    """Adam (Kingma and Ba, 2015) on a flat float32 vector; its state is two float32 vectors.

    With gradient g at step t (from 1):  m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,
    w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
    Mixed-precision training keeps w (the fp32 master copy), m and v: 12 bytes per parameter.
    :meth:`step` updates a slice of the vector too (ZeRO: each rank its own shard)."""
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    m: np.ndarray = field(default=None, repr=False)
    v: np.ndarray = field(default=None, repr=False)
    t: int = 0

    def init(self, n: int) -> Adam:
        """Zero moments for ``n`` parameters; returns self."""
        self.m = np.zeros(int(n), dtype=np.float32)
        self.v = np.zeros(int(n), dtype=np.float32)
        self.t = 0
        return self

    def step(self, w: np.ndarray, g: np.ndarray) -> None:
        """Update ``w`` in place with gradient ``g`` (same length as the moments)."""
        if self.m is None:
            self.init(w.size)
        if w.shape != self.m.shape or g.shape != self.m.shape:
            raise ValueError(f"Adam holds {self.m.size} moments; got w {w.shape} and g {g.shape}")
        self.t += 1
        g = g.astype(np.float32, copy=False)
        self.m *= self.beta1
        self.m += (1 - self.beta1) * g
        self.v *= self.beta2
        self.v += (1 - self.beta2) * g * g
        m_hat = self.m / (1 - self.beta1 ** self.t)
        v_hat = self.v / (1 - self.beta2 ** self.t)
        w -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(w.dtype, copy=False)

    def state_bytes(self) -> int:
        """Bytes of the optimizer state held: m and v."""
        return 0 if self.m is None else int(self.m.nbytes + self.v.nbytes)
