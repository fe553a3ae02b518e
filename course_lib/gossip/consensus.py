r"""Single-process references for gossip, in the exact arithmetic order the workers use.

Node ``i`` computes its new value as :math:`\sum_{j} W_{ij} x_j` over ``j`` in
``{i} + neighbours(i)``, **in increasing order of j**, with :func:`mix`. The real-process
workers call the same function on the same numbers, so a run equals these references to
the last bit, not only to 1e-12. (``W @ x`` sums in an order chosen by BLAS and agrees to
about 1e-15.)
"""
from __future__ import annotations

import math

import numpy as np

from .topologies import validate_graph

__all__ = [
    "mix", "gossip_reference", "consensus_error", "component_errors", "fit_decay_rate",
    "pairwise_schedule", "pairwise_reference", "pairwise_expected_matrix",
]


def mix(weights: dict, values: dict):
    """sum_j weights[j] * values[j], summed in increasing j (a fixed, documented order)."""
    acc = None
    for j in sorted(weights):
        term = weights[j] * values[j]
        acc = term if acc is None else acc + term
    return acc


def _rows(W, G=None):
    W = np.asarray(W, dtype=float)
    n = W.shape[0]
    if G is not None:
        return [{j: float(W[i, j]) for j in sorted(set(G.neighbors(i)) | {i})} for i in range(n)]
    return [{j: float(W[i, j]) for j in range(n) if j == i or W[i, j] != 0} for i in range(n)]


def gossip_reference(W, x0, steps: int, G=None) -> np.ndarray:
    """Iterate x <- W x for ``steps`` steps; returns the trajectory, shape (steps+1,) + x0.shape.

    ``x0`` has one row per node (shape (n,) or (n, d)). With ``G`` the sums run over G's
    neighbours (as in the workers); without it over the nonzeros of W.
    """
    x0 = np.asarray(x0, dtype=float)
    rows = _rows(W, G)
    if x0.shape[0] != len(rows):
        raise ValueError(f"x0 has {x0.shape[0]} rows but W is {len(rows)} x {len(rows)}")
    traj = np.empty((steps + 1,) + x0.shape)
    traj[0] = x0
    for t in range(steps):
        x = traj[t]
        for i, w in enumerate(rows):
            traj[t + 1, i] = mix(w, {j: x[j] for j in w})
    return traj


def consensus_error(traj, x_bar=None) -> np.ndarray:
    r"""e_t = \|x_t - \bar x \mathbf 1\|_F for a trajectory of shape (T+1, n[, d]).

    ``x_bar`` defaults to the average of ``traj[0]``, which gossip with a doubly
    stochastic W keeps for ever.
    """
    traj = np.asarray(traj, dtype=float)
    if x_bar is None:
        x_bar = traj[0].mean(axis=0)
    diff = traj - x_bar
    return np.sqrt((diff.reshape(diff.shape[0], -1) ** 2).sum(axis=1))


def component_errors(traj, comps) -> np.ndarray:
    """Per-component disagreement, shape (T+1, n_components): each against its own average."""
    traj = np.asarray(traj, dtype=float)
    out = np.empty((traj.shape[0], len(comps)))
    for k, c in enumerate(comps):
        out[:, k] = consensus_error(traj[:, c])
    return out


def fit_decay_rate(errors, t_min: int | None = None, floor: float = 1e-11) -> float:
    """Fit log(e_t) ~ a + t log(rate) on the tail of the curve; return the fitted rate.

    Uses t >= t_min (default: half the run) and only points with e_t / e_0 above ``floor``,
    where rounding does not yet dominate.
    """
    e = np.asarray(errors, dtype=float)
    t = np.arange(e.size)
    if t_min is None:
        t_min = e.size // 2
    keep = (t >= t_min) & (e > floor * e[0])
    if keep.sum() < 3:
        raise ValueError("fewer than 3 points to fit; run more steps or lower t_min")
    slope = np.polyfit(t[keep], np.log(e[keep]), 1)[0]
    return float(math.exp(slope))


# Randomized pairwise gossip (Boyd, Ghosh, Prabhakar, Shah 2006).
def pairwise_schedule(G, ticks: int, seed: int = 0) -> np.ndarray:
    """Who averages with whom at each tick, shape (ticks, 2), each row sorted (lo, hi).

    At each tick a node i is chosen uniformly (its Poisson clock ticked first) and picks a
    neighbour j uniformly (P_ij = 1 / d_i). An isolated node's tick is a no-op ``(i, i)``.
    Every worker gets the same schedule (same seed), so no coordinator is needed.
    """
    n = validate_graph(G)
    rng = np.random.default_rng(seed)
    nbrs = [sorted(G.neighbors(i)) for i in range(n)]
    out = np.empty((ticks, 2), dtype=np.int64)
    for k in range(ticks):
        i = int(rng.integers(n))
        j = nbrs[i][int(rng.integers(len(nbrs[i])))] if nbrs[i] else i
        out[k] = (min(i, j), max(i, j))
    return out


def pairwise_reference(x0, schedule) -> np.ndarray:
    """Apply the schedule: both ends become 0.5 * (x_lo + x_hi). Trajectory (ticks+1, n[, d])."""
    x = np.array(x0, dtype=float)
    traj = np.empty((len(schedule) + 1,) + x.shape)
    traj[0] = x
    for k, (a, b) in enumerate(schedule):
        if a != b:
            v = 0.5 * (x[a] + x[b])
            x[a] = v
            x[b] = v
        traj[k + 1] = x
    return traj


def pairwise_expected_matrix(G) -> np.ndarray:
    r"""E[W(k)] for one tick of randomized gossip, as in Boyd et al. (2006):

    .. math:: \bar W = I - \frac{1}{2n} \sum_{i,j} P_{ij} (e_i - e_j)(e_i - e_j)^T,
              \quad P_{ij} = 1 / d_i.

    Each W(k) is a projection (W^T W = W), so E||x_k - x̄||^2 <= lambda_2(W̄)^k ||x_0 - x̄||^2.
    """
    n = validate_graph(G)
    Wb = np.eye(n)
    for i in range(n):
        d = G.degree(i)
        for j in G.neighbors(i):
            c = 1.0 / (2 * n * d)
            Wb[i, i] -= c
            Wb[j, j] -= c
            Wb[i, j] += c
            Wb[j, i] += c
    return Wb
