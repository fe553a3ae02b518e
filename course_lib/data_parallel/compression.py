"""Gradient compression by top-k sparsification, with and without error feedback, on real ranks.

Each rank r computes its gradient g_r and sends only its k largest-magnitude entries as
(index, value) pairs (8 bytes each: int32 + float32); an allgather brings every rank's pairs to
every rank, which adds them into one vector and steps w <- w - lr sum_r topk(u_r).

* Without memory, u_r = g_r: what top-k drops is lost. When the ranks' gradients disagree (their
  data differ), the small entries they agree on may never be sent, and training stalls away from
  the optimum.
* Error feedback (Seide et al. 2014, "1-bit SGD"; Stich, Cordonnier and Jaggi 2018, "Sparsified
  SGD with Memory"; Lin et al. 2018, "Deep Gradient Compression") keeps what was not sent:
  u_r = g_r + e_r, then e_r <- u_r - topk(u_r). Every entry is sent eventually, late.

Bytes on the wire per step, all ranks together (ring collectives, float32 gradients of d entries):
dense allreduce 2 (N-1) d x 4; top-k allgather N (N-1) k x 8. Ratio d / (N k).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..datasets import contiguous_shards, make_least_squares

SPARSE = np.dtype([("index", np.int32), ("value", np.float32)])
METHODS = ("dense", "topk", "topk_ef")


def topk_sparsify(u: np.ndarray, k: int) -> np.ndarray:
    """The k entries of largest |u| as a structured array of (index, value), ascending index."""
    idx = np.sort(np.argpartition(np.abs(u), -k)[-k:])
    out = np.empty(k, SPARSE)
    out["index"], out["value"] = idx, u[idx]
    return out


def densify(pairs_by_rank, dim: int) -> np.ndarray:
    """The sum of every rank's (index, value) pairs as a dense float64 vector (rank order)."""
    g = np.zeros(dim)
    for pairs in pairs_by_rank:
        np.add.at(g, pairs["index"], pairs["value"].astype(np.float64))
    return g


def dense_bytes_per_step(dim: int, n_ranks: int, itemsize: int = 4) -> int:
    """A ring allreduce of d entries: 2 (N-1) d items sent over all ranks."""
    return 2 * (n_ranks - 1) * dim * itemsize


def topk_bytes_per_step(k: int, n_ranks: int) -> int:
    """A ring allgather of N blocks of k pairs: each rank forwards N-1 blocks of 8 k bytes."""
    return n_ranks * (n_ranks - 1) * k * SPARSE.itemsize


@dataclass(frozen=True)
class CompressionConfig:
    """Least squares whose shards follow different truths (``shard_shift``): the ranks'
    gradients disagree, which is where top-k without memory loses."""
    n_rows: int = 1000
    dim: int = 200
    k: int = 2                     # 1% of the entries
    shard_shift: float = 2.0
    lr_fraction: float = 0.03      # lr = lr_fraction / L, L the largest eigenvalue of X^T X / n
    steps: int = 250
    seed: int = 0


def _problem(cfg: CompressionConfig, n_ranks: int):
    X, y, _ = make_least_squares(cfg.n_rows, cfg.dim, n_shards=n_ranks, shard_shift=cfg.shard_shift,
                                 seed=cfg.seed, unit_rows=True)
    return X, y


def compression_worker(comm, method: str, cfg: CompressionConfig) -> list[float]:
    """Train with ``method`` ("dense", "topk", "topk_ef"); return this rank's share of the loss
    1/(2n) ||X w - y||^2 before each step."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    X, y = _problem(cfg, comm.size)
    lr = cfg.lr_fraction / np.linalg.eigvalsh(X.T @ X / cfg.n_rows).max()
    a, b = contiguous_shards(cfg.n_rows, comm.size)[comm.rank]
    Xr, yr = X[a:b], y[a:b]
    w, memory, losses = np.zeros(cfg.dim), np.zeros(cfg.dim), []
    for _ in range(cfg.steps):
        resid = Xr @ w - yr
        losses.append(float(0.5 * resid @ resid / cfg.n_rows))
        g = Xr.T @ resid / cfg.n_rows               # summed over ranks: the full gradient
        if method == "dense":
            total = comm.allreduce(g.astype(np.float32), algorithm="ring").astype(np.float64)
        else:
            u = g + memory if method == "topk_ef" else g
            mine = topk_sparsify(u, cfg.k)
            if method == "topk_ef":                     # keep what was not sent (float32 rounding too)
                memory = u - densify([mine], cfg.dim)
            total = densify(comm.allgather(mine), cfg.dim)
        w -= lr * total
    return losses


@dataclass(frozen=True)
class CompressionRun:
    """One method's run: the distance to the optimum f(w_t) - f* per step, and its traffic."""
    method: str
    n_ranks: int
    suboptimality: np.ndarray
    bytes_total: int
    messages_total: int

    @property
    def bytes_per_step(self) -> float:
        return self.bytes_total / len(self.suboptimality)


def optimal_loss(cfg: CompressionConfig, n_ranks: int) -> float:
    """f* = min_w 1/(2n) ||X w - y||^2, by least squares in one process."""
    X, y = _problem(cfg, n_ranks)
    w = np.linalg.lstsq(X, y, rcond=None)[0]
    return float(0.5 * np.mean((X @ w - y) ** 2))


def run_compression(cluster, method: str, cfg: CompressionConfig = CompressionConfig()) -> CompressionRun:
    """Run :func:`compression_worker` on every rank of ``cluster``."""
    res = cluster.run(compression_worker, method, cfg)
    loss = np.sum([r for r in res], axis=0)
    return CompressionRun(method, len(res), loss - optimal_loss(cfg, len(res)),
                          res.stats.total_bytes, res.stats.total_messages)
