"""Problems and single-process baselines for lesson 03.

Least squares, loss ``f(w) = 1/(2n) * ||X w - y||^2``, and its gradient on a minibatch B
(:func:`batch_gradient`), on the data of :func:`course_lib.datasets.make_least_squares`; with
``n_shards`` and ``shard_shift`` the rows of each worker (:func:`shards`) follow their own model.

The sparse problem of Hogwild! (Recht et al. 2011) stores every row with a fixed number
of non-zeros: ``idx[i]`` (column indices, distinct) and ``val[i]`` (values), so one
stochastic step on sample i touches only the coordinates ``idx[i]``:
``w[idx[i]] -= lr * (val[i] . w[idx[i]] - y[i]) * val[i]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_lib.datasets import contiguous_shards, make_least_squares

__all__ = ["make_least_squares", "optimal_loss", "loss", "batch_gradient", "shards", "batch_rng", "serial_sgd",
           "SparseProblem", "make_sparse_problem", "sparse_loss", "sample_order", "serial_sparse_sgd",
           "sparsity_stats"]


# --------------------------------------------------------------------------- dense
def optimal_loss(X, y) -> float:
    """The least-squares minimum ``min_w f(w)`` (the floor every curve is compared with)."""
    w = np.linalg.lstsq(X, y, rcond=None)[0]
    return loss(X, y, w)


def loss(X, y, w) -> float:
    """``1/(2n) ||X w - y||^2``."""
    r = X @ w - y
    return float(r @ r) / (2 * len(y))


def batch_gradient(X, y, rows, w):
    """Mean least-squares gradient over the minibatch ``rows`` of X and y, at w.

    The step each worker of the asynchronous server (and :func:`serial_sgd`) takes. The full
    gradient of lesson 01 is question ex01_1: see :mod:`course_lib.reference.ex01`."""
    Xb, yb = X[rows], y[rows]
    return Xb.T @ (Xb @ w - yb) / len(yb)


def shards(n: int, n_shards: int):
    """Split rows 0..n-1 into ``n_shards`` contiguous shards (as index arrays): the shards of
    :func:`course_lib.datasets.contiguous_shards`, which ``shard_shift`` shifts."""
    return [np.arange(start, stop, dtype=np.int64) for start, stop in contiguous_shards(n, n_shards)]


def batch_rng(seed: int, worker: int):
    """The minibatch sampler of worker ``worker`` (1-based, as in the PS: rank = worker)."""
    return np.random.default_rng([seed, worker])


def serial_sgd(X, y, n_updates: int, lr: float, batch_size: int, seed: int = 0, w0=None):
    """Minibatch SGD in one process: the baseline the async PS with one worker must equal.

    It draws batches exactly as worker rank 1 of :func:`course_lib.async_ps.run_ps` does
    (``batch_rng(seed, 1).choice(rows, batch_size)``) and applies ``w -= lr * g``.
    Returns ``(w, losses)`` with ``losses[k]`` the loss after k updates.
    """
    w = np.zeros(X.shape[1]) if w0 is None else np.array(w0, dtype=np.float64)
    rng = batch_rng(seed, 1)
    rows = np.arange(len(y))
    losses = [loss(X, y, w)]
    for _ in range(n_updates):
        b = rng.choice(rows, batch_size)
        w -= lr * batch_gradient(X, y, b, w)
        losses.append(loss(X, y, w))
    return w, np.array(losses)


# -------------------------------------------------------------------------- sparse
@dataclass
class SparseProblem:
    """Rows with ``nnz`` non-zeros each: ``idx (n, nnz)`` int64, ``val (n, nnz)``, ``y (n,)``."""

    idx: np.ndarray
    val: np.ndarray
    y: np.ndarray
    d: int
    w_true: np.ndarray

    @property
    def n(self) -> int:
        return len(self.y)

    @property
    def nnz(self) -> int:
        return self.idx.shape[1]

    def dense(self) -> np.ndarray:
        """The (n, d) matrix, for checks and statistics on small problems."""
        X = np.zeros((self.n, self.d))
        np.put_along_axis(X, self.idx, self.val, axis=1)
        return X


def make_sparse_problem(n: int = 4000, d: int = 2000, nnz: int = 5, noise: float = 0.01,
                        seed: int = 0) -> SparseProblem:
    """Sparse least squares: each row has ``nnz`` distinct random columns.

    ``nnz = d`` gives the dense problem (every update touches every coordinate).
    Values are scaled by ``1/sqrt(nnz)`` so that ``||x_i||^2 ~ 1`` whatever ``nnz`` is,
    and the same step size is stable for sparse and dense problems.
    """
    if not 1 <= nnz <= d:
        raise ValueError(f"need 1 <= nnz <= d, got nnz={nnz}, d={d}")
    rng = np.random.default_rng(seed)
    if nnz == d:
        idx = np.tile(np.arange(d, dtype=np.int64), (n, 1))
    elif 2 * nnz > d:
        # argpartition of random keys: nnz distinct columns per row (memory n * d: small d only).
        idx = np.argpartition(rng.random((n, d)), nnz, axis=1)[:, :nnz].astype(np.int64)
        idx.sort(axis=1)
    else:
        # Draw with replacement, redraw the rows that got a column twice (few when nnz << d).
        idx = np.sort(rng.integers(0, d, size=(n, nnz)), axis=1)
        bad = (np.diff(idx, axis=1) == 0).any(axis=1)
        while bad.any():
            idx[bad] = np.sort(rng.integers(0, d, size=(int(bad.sum()), nnz)), axis=1)
            bad = (np.diff(idx, axis=1) == 0).any(axis=1)
    val = rng.standard_normal((n, nnz)) / np.sqrt(nnz)
    w_true = rng.standard_normal(d)
    y = np.einsum("ij,ij->i", val, w_true[idx]) + noise * rng.standard_normal(n)
    return SparseProblem(idx=idx, val=val, y=y, d=d, w_true=w_true)


def sparse_loss(idx, val, y, w) -> float:
    """``1/(2n) sum_i (val_i . w[idx_i] - y_i)^2``."""
    r = np.einsum("ij,ij->i", val, w[idx]) - y
    return float(r @ r) / (2 * len(y))


def sample_order(n: int, n_updates: int, seed: int = 0):
    """The sequence of sample indices SGD visits (uniform with replacement, seeded)."""
    return np.random.default_rng(seed).integers(0, n, size=n_updates)


def serial_sparse_sgd(idx, val, y, d: int, order, lr: float, w0=None):
    """Plain SGD over the samples in ``order``, one sample per update (the Hogwild! baseline):
    the Hogwild! worker loop (question ex03_3) run alone, in this process, on a private vector."""
    from course_lib.reference.ex03 import hogwild_worker

    w = np.zeros(d) if w0 is None else np.array(w0, dtype=np.float64)
    hogwild_worker(w, idx, val, y, order, lr)
    return w


def sparsity_stats(idx, d: int) -> dict:
    """The statistics of Recht et al. (2011) for the hypergraph whose edges are the supports.

    With E the set of supports e_i = idx[i] (one hyperedge per sample):

    * ``Omega = max_e |e|``: the most coordinates one update touches;
    * ``Delta = max_v |{e : v in e}| / |E|``: the largest fraction of samples sharing a coordinate;
    * ``rho = max_e |{e' : e' ∩ e != ∅}| / |E|``: the largest fraction of samples an
      update can collide with.

    Hogwild!'s speedup argument needs ``Omega``, ``Delta`` and ``rho`` small.
    """
    idx = np.asarray(idx)
    n = idx.shape[0]
    if n == 0:
        raise ValueError("need at least one sample")
    A = np.zeros((n, d), dtype=np.float32)
    np.put_along_axis(A, idx, 1.0, axis=1)
    omega = int(A.sum(axis=1).max())
    delta = float(A.sum(axis=0).max()) / n
    overlap = (A @ A.T) > 0  # e and e' share a coordinate (e overlaps itself)
    rho = float(overlap.sum(axis=1).max()) / n
    return {"Omega": omega, "Delta": delta, "rho": rho}
