"""The two problems of lesson 01 and their seeded data (least squares: :mod:`course_lib.datasets`).

Both losses are averages over the N samples,

    L(w) = (1/N) * sum_i l_i(w),        g(w) = grad L(w) = (1/N) * sum_i g_i(w),

so the gradient is a *sum over samples*: any split of the rows into shards gives
partial sums that add up to the same total. That is all MapReduce needs.

* least squares:        l_i = 1/2 (x_i^T w - y_i)^2,          g_i = (x_i^T w - y_i) x_i
* logistic regression:  l_i = log(1 + e^{z_i}) - y_i z_i,     g_i = (sigmoid(z_i) - y_i) x_i,
  with z_i = x_i^T w and labels y_i in {0, 1}.

Least squares also accepts k outputs at once (y of shape (N, k), w of shape (d, k)):
the map is then a matrix-matrix product, which keeps a core busy (compute bound) instead
of waiting for memory; the speedup benchmark uses it.
"""
from __future__ import annotations

from types import MappingProxyType

import numpy as np

from course_lib.datasets import check_sizes, make_least_squares
from course_lib.reference.ex01 import map_gradient

__all__ = ["Problem", "LeastSquares", "Logistic", "PROBLEMS", "get_problem", "make_least_squares", "make_logistic"]


class Problem:
    """A loss that is an average over samples. Subclasses give the per-shard sums."""

    name = "problem"

    def shard_sums(self, X, y, w):
        """Map one shard: (sum_i g_i(w) over its rows, sum_i l_i(w) over its rows)."""
        raise NotImplementedError

    def per_sample(self, X, y, w):
        """Per-sample gradients, shape (n, w.size), and per-sample losses, shape (n,)."""
        raise NotImplementedError

    def loss(self, X, y, w) -> float:
        return self.shard_sums(X, y, w)[1] / len(X)

    def gradient(self, X, y, w):
        return self.shard_sums(X, y, w)[0] / len(X)

    def lipschitz(self, X) -> float:
        """A bound L on the gradient's Lipschitz constant; step 1/L always converges."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


class LeastSquares(Problem):
    """Least squares, L(w) = (1/2N) ||X w - y||^2 (y may hold k columns)."""

    name = "least_squares"

    def shard_sums(self, X, y, w):
        # the map of lesson 01 (question ex01_2); the loss is the shard's half sum of squared residuals
        r = X @ w - y
        return map_gradient(X, y, w), 0.5 * float(np.vdot(r, r))

    def per_sample(self, X, y, w):
        r = X @ w - y
        if r.ndim == 1:
            G = X * r[:, None]
            losses = 0.5 * r * r
        else:  # k outputs: g_i = x_i r_i^T, flattened to d*k numbers
            G = (X[:, :, None] * r[:, None, :]).reshape(len(X), -1)
            losses = 0.5 * np.einsum("ij,ij->i", r, r)
        return G, losses

    def lipschitz(self, X) -> float:
        # largest eigenvalue of X^T X / N = (largest singular value)^2 / N
        return float(np.linalg.norm(X, 2) ** 2 / len(X))

    def solution(self, X, y):
        """The exact minimiser, from numpy.linalg.lstsq."""
        return np.linalg.lstsq(X, y, rcond=None)[0]


class Logistic(Problem):
    """Logistic regression with labels in {0, 1}, L(w) = (1/N) sum log(1+e^z) - y z."""

    name = "logistic"

    def shard_sums(self, X, y, w):
        z = X @ w
        s = _sigmoid(z) - y
        return X.T @ s, float(np.sum(np.logaddexp(0.0, z) - y * z))

    def per_sample(self, X, y, w):
        z = X @ w
        s = _sigmoid(z) - y
        return X * s[:, None], np.logaddexp(0.0, z) - y * z

    def lipschitz(self, X) -> float:
        # sigmoid' <= 1/4
        return float(np.linalg.norm(X, 2) ** 2 / (4 * len(X)))


def _sigmoid(z):
    # stable for large |z|: exp(-logaddexp(0, -z)) = 1 / (1 + e^{-z})
    return np.exp(-np.logaddexp(0.0, -z))


# Read-only: the names a run accepts are fixed; a new problem is passed as a Problem instance.
PROBLEMS = MappingProxyType({"least_squares": LeastSquares, "logistic": Logistic})


def get_problem(problem) -> Problem:
    """Accept a Problem instance or its name ("least_squares", "logistic")."""
    if isinstance(problem, Problem):
        return problem
    if isinstance(problem, str) and problem in PROBLEMS:
        return PROBLEMS[problem]()
    raise ValueError(f"problem must be one of {sorted(PROBLEMS)} or a Problem, got {problem!r}")


def make_logistic(n=2000, d=20, seed=0):
    """Seeded data for logistic regression: y_i ~ Bernoulli(sigmoid(x_i^T w_true)).

    Returns (X, y, w_true); y holds 0.0 and 1.0.
    """
    check_sizes(n, d)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d) / np.sqrt(d) * 3.0
    y = (rng.random(n) < _sigmoid(X @ w_true)).astype(np.float64)
    return X, y, w_true
