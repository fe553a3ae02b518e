r"""Mixing matrices and their spectrum.

Synchronous gossip replaces every node's value by a weighted average of its own and its
neighbours' values: :math:`x \leftarrow W x`. For the average to be kept and reached,
``W`` must be

* supported on the graph: :math:`W_{ij} = 0` unless ``i == j`` or ``(i, j)`` is an edge;
* symmetric and doubly stochastic: :math:`W = W^T`, :math:`W \mathbf 1 = \mathbf 1`
  (so :math:`\bar x` never changes).

Metropolis-Hastings weights (Xiao and Boyd 2004, "Fast linear iterations for distributed
averaging") need only the degrees of the two endpoints:

.. math:: W_{ij} = \frac{1}{1 + \max(d_i, d_j)}, \qquad W_{ii} = 1 - \sum_{j \ne i} W_{ij}.

With eigenvalues :math:`1 = \lambda_1 \ge \lambda_2 \ge \dots \ge \lambda_n > -1`, the
disagreement :math:`x_t - \bar x \mathbf 1` lives orthogonally to :math:`\mathbf 1`, where
``W`` shrinks every vector by at least

.. math:: r = \max(\lambda_2, |\lambda_n|) \quad\Rightarrow\quad
          \|x_t - \bar x \mathbf 1\| \le r^t \, \|x_0 - \bar x \mathbf 1\|.

Not :math:`\lambda_2` alone: on a torus or a hypercube these weights give
:math:`\lambda_n = -\lambda_2`. The spectral gap is ``1 - r``; the iterations to shrink the
error by ``eps`` are about ``log(eps) / log(r)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
import numpy as np

from course_lib.reference.ex04 import iterations_to_reach, metropolis_weights, mixing_rate  # ex04_1, 2, 4

from .topologies import validate_graph, warn_if_disconnected

__all__ = [
    "metropolis_hastings", "check_mixing_matrix", "Spectrum", "spectrum", "mixing_rate",
    "iterations_to_eps", "ring_lambda2", "star_lambda2", "complete_lambda2", "neighbor_weights",
]


def metropolis_hastings(G, warn: bool = True) -> np.ndarray:
    """The Metropolis-Hastings mixing matrix of graph ``G`` (nodes 0..n-1), as an n x n array:
    :func:`course_lib.reference.ex04.metropolis_weights` (question ex04_1) on a checked graph.

    Warns with :class:`DisconnectedGraphWarning` (naming the components) when ``G`` is
    disconnected: the matrix is still valid, but consensus then stays inside components.
    """
    validate_graph(G)
    if warn:
        warn_if_disconnected(G, stacklevel=2)
    return metropolis_weights(G)


def check_mixing_matrix(W, G=None, atol: float = 1e-12) -> np.ndarray:
    """Raise ValueError unless W is a valid symmetric doubly-stochastic mixing matrix.

    With ``G`` given, also checks that W is zero off the graph's edges (a node can only
    average with the neighbours it has a Pipe to). Returns W as a float array.
    """
    W = np.asarray(W, dtype=float)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be a square matrix, got shape {W.shape}")
    n = W.shape[0]
    if not np.all(np.isfinite(W)):
        raise ValueError("W has non-finite entries")
    asym = np.abs(W - W.T).max()
    if asym > atol:
        i, j = np.unravel_index(np.argmax(np.abs(W - W.T)), W.shape)
        raise ValueError(f"W is not symmetric: W[{i},{j}]={W[i, j]} but W[{j},{i}]={W[j, i]}")
    rows = W.sum(axis=1)
    bad = np.flatnonzero(np.abs(rows - 1) > atol)
    if bad.size:
        raise ValueError(f"rows of W must sum to 1 (keeps the average); row {bad[0]} sums to "
                         f"{rows[bad[0]]!r}")
    if W.min() < -atol:
        i, j = np.unravel_index(np.argmin(W), W.shape)
        raise ValueError(f"W has a negative weight W[{i},{j}]={W[i, j]}")
    if G is not None:
        validate_graph(G, n)
        allowed = nx.to_numpy_array(G, nodelist=range(n)) != 0
        allowed |= np.eye(n, dtype=bool)
        off = np.argwhere((np.abs(W) > atol) & ~allowed)
        if off.size:
            i, j = off[0]
            raise ValueError(f"W[{i},{j}]={W[i, j]} but ({i}, {j}) is not an edge of the graph")
    return W


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues of a symmetric mixing matrix, sorted from largest to smallest."""
    eigenvalues: np.ndarray
    lambda_2: float
    lambda_n: float
    r: float          # max(lambda_2, |lambda_n|): the per-step contraction of the disagreement

    @property
    def gap(self) -> float:
        """Spectral gap 1 - r (0 means no convergence)."""
        return 1.0 - self.r

    def iterations_to(self, eps: float) -> int:
        return iterations_to_eps(self.r, eps)


def spectrum(W) -> Spectrum:
    """Eigenvalues (``numpy.linalg.eigvalsh``), lambda_2, lambda_n and r of symmetric W.

    r comes from :func:`course_lib.reference.ex04.mixing_rate` (question ex04_2)."""
    W = np.asarray(W, dtype=float)
    Ws = (W + W.T) / 2
    ev = np.linalg.eigvalsh(Ws)[::-1].copy()
    if ev.size == 1:
        return Spectrum(ev, 0.0, float(ev[0]), 0.0)
    return Spectrum(ev, float(ev[1]), float(ev[-1]), float(mixing_rate(Ws)))


def iterations_to_eps(r: float, eps: float) -> int:
    """Smallest t with r^t <= eps: the bound guarantees error <= eps * initial error by then.

    :func:`course_lib.reference.ex04.iterations_to_reach` (question ex04_4) for 0 < r < 1;
    ``inf`` when r >= 1 (no convergence), 1 when r <= 0 (one step reaches the average)."""
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if r >= 1:
        return math.inf
    if r <= 0:
        return 1
    return iterations_to_reach(r, eps)


def neighbor_weights(W, i: int, G=None) -> dict[int, float]:
    """Row i of W as {j: W_ij} over i itself and its neighbours (the nonzero pattern, or G's)."""
    W = np.asarray(W, dtype=float)
    js = sorted(set(G.neighbors(i)) | {i}) if G is not None else \
        [j for j in range(W.shape[0]) if j == i or W[i, j] != 0]
    return {int(j): float(W[i, j]) for j in js}


# Closed forms for Metropolis-Hastings weights (checked by the tests).
def ring_lambda2(n: int) -> float:
    """Ring, n >= 3: W = I/3 + A/3, eigenvalues 1/3 + 2/3 cos(2 pi k / n)."""
    return 1 / 3 + 2 / 3 * math.cos(2 * math.pi / n)


def star_lambda2(n: int) -> float:
    """Star, n >= 3: every edge gets 1/n, so a leaf keeps 1 - 1/n of itself."""
    return 1 - 1 / n


def complete_lambda2(n: int) -> float:
    """Complete graph: W = 11^T / n, one step reaches the average."""
    return 0.0
