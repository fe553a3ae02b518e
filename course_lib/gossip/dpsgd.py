r"""D-PSGD (Lian et al. 2017, "Can decentralized algorithms outperform centralized algorithms?").

Every node ``i`` holds its own model :math:`x_i` and its own data shard. One iteration:

1. compute a stochastic gradient :math:`g_i = \nabla F_i(x_i; \xi_i)` on a minibatch of
   its shard, at its *current* model;
2. exchange models with its neighbours (the only Pipes it has);
3. average and step:  :math:`x_i \leftarrow \sum_j W_{ij} x_j - \gamma g_i`.

No server: the busiest node sends ``degree x model size`` bytes per iteration, against
``n x model size`` for a central server. The average :math:`\bar x` follows SGD with the
averaged gradient; the models disagree by an amount set by the spectral gap ``1 - r``.

The problem here is least squares, the example of the course's source note on parallel gradient
descent (README, "Source notes"):
:math:`f(w) = \frac{1}{2N}\|Xw - y\|^2`, shard ``i`` holding rows ``shards[i]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from course_lib import datasets

from .consensus import mix

__all__ = ["LeastSquares", "make_least_squares", "minibatch_gradient", "node_rng",
           "dpsgd_reference", "centralised_sgd_reference"]


@dataclass
class LeastSquares:
    """Least squares data split into contiguous shards (one per node)."""
    X: np.ndarray
    y: np.ndarray
    shards: list            # [(start, stop)] rows of each node
    w_opt: np.ndarray       # numpy.linalg.lstsq solution
    f_opt: float            # loss at w_opt

    @property
    def n_nodes(self) -> int:
        return len(self.shards)

    @property
    def dim(self) -> int:
        return self.X.shape[1]

    def loss(self, w) -> np.ndarray | float:
        """f(w) = ||Xw - y||^2 / (2N); w may be (d,) or a stack (..., d).

        Computed from the d x d Gram matrix, f(w) = (w'Aw - 2 w'b + c) / 2 with A = X'X/N,
        b = X'y/N, c = y'y/N, so a whole trajectory costs O(d^2) per model instead of O(N d).
        """
        A, b, c = self.gram
        w = np.asarray(w, dtype=float)
        return 0.5 * (((w @ A) * w).sum(axis=-1) - 2 * (w @ b) + c)

    @cached_property
    def gram(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(X'X/N, X'y/N, y'y/N), computed on first use and kept with the problem."""
        N = self.X.shape[0]
        return self.X.T @ self.X / N, self.X.T @ self.y / N, float(self.y @ self.y) / N

    def suboptimality(self, w):
        return self.loss(w) - self.f_opt


def make_least_squares(n_samples: int, dim: int, n_nodes: int, noise: float = 0.1,
                       iid: bool = True, seed: int = 0, heterogeneity: float = 0.0) -> LeastSquares:
    """Synthetic y = X w_true + noise, split in ``n_nodes`` contiguous shards (one per node).

    The data of :func:`course_lib.datasets.make_least_squares` with rows of unit expected norm
    (x_i ~ N(0, I/dim)), cut by :func:`course_lib.datasets.rounded_shards`.
    ``iid=False`` sorts the rows by their first feature before splitting, so every node
    sees a different part of the input space. ``heterogeneity=h`` gives shard ``i`` its own
    truth ``w_true + h * u_i`` (``u_i`` random, unit scale): the local optima disagree, and
    that is where the topology shows in D-PSGD.
    """
    if n_samples < n_nodes:
        raise ValueError(f"need at least one sample per node: {n_samples} < {n_nodes}")
    shards = datasets.rounded_shards(n_samples, n_nodes)
    X, y, _ = datasets.make_least_squares(n_samples, dim, noise=noise, seed=seed, unit_rows=True,
                                          sort_by_first_feature=not iid, shard_shift=heterogeneity,
                                          shard_ranges=shards)
    w_opt = np.linalg.lstsq(X, y, rcond=None)[0]
    f_opt = float(0.5 * np.mean((X @ w_opt - y) ** 2))   # direct form: the reference value
    return LeastSquares(np.ascontiguousarray(X), np.ascontiguousarray(y), shards, w_opt, f_opt)


def node_rng(seed: int, rank: int) -> np.random.Generator:
    """The minibatch stream of node ``rank``: the same in a worker and in the reference."""
    return np.random.default_rng([seed, rank])


def minibatch_gradient(X, y, shard, w, batch: int, rng) -> np.ndarray:
    r"""\frac{1}{b} X_B^T (X_B w - y_B) for b rows drawn with replacement from ``shard``."""
    lo, hi = shard
    idx = rng.integers(lo, hi, size=batch)
    Xb = X[idx]
    return Xb.T @ (Xb @ w - y[idx]) / batch


def dpsgd_reference(problem: LeastSquares, W, G, steps: int, lr: float, batch: int,
                    seed: int = 0, x0=None) -> np.ndarray:
    """Single-process D-PSGD with the workers' arithmetic; trajectory (steps+1, n, d)."""
    n, d = problem.n_nodes, problem.dim
    W = np.asarray(W, dtype=float)
    rows = [{j: float(W[i, j]) for j in sorted(set(G.neighbors(i)) | {i})} for i in range(n)]
    rngs = [node_rng(seed, i) for i in range(n)]
    traj = np.empty((steps + 1, n, d))
    traj[0] = 0.0 if x0 is None else x0
    for t in range(steps):
        x = traj[t]
        for i in range(n):
            g = minibatch_gradient(problem.X, problem.y, problem.shards[i], x[i], batch, rngs[i])
            traj[t + 1, i] = mix(rows[i], {j: x[j] for j in rows[i]}) - lr * g
    return traj


def centralised_sgd_reference(problem: LeastSquares, steps: int, lr: float, batch: int,
                              seed: int = 0) -> np.ndarray:
    """Synchronous data-parallel SGD with a server (lesson 01's shape, minibatches).

    Every node computes a minibatch gradient at the server's w; the server averages them
    in rank order and steps. Trajectory of w, shape (steps+1, d).
    """
    n, d = problem.n_nodes, problem.dim
    rngs = [node_rng(seed, i) for i in range(n)]
    w = np.zeros(d)
    traj = [w.copy()]
    for _ in range(steps):
        gs = [minibatch_gradient(problem.X, problem.y, problem.shards[i], w, batch, rngs[i])
              for i in range(n)]
        w = w - lr * _mean_in_order(gs)
        traj.append(w.copy())
    return np.array(traj)


def _mean_in_order(gs):
    acc = gs[0].copy()
    for g in gs[1:]:
        acc = acc + g
    return acc / len(gs)
