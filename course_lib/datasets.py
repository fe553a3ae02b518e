r"""The least-squares data every lesson trains on, made in one place.

One seeded generator draws, in this order (the order is part of the contract: the
visible checks and the notebooks quote numbers computed from these arrays),

1. the features  ``X``, shape (n, d), entries :math:`X_{ij} \sim N(0, 1)`
   (or :math:`N(0, 1/d)` with ``unit_rows=True``, so that :math:`E\|x_i\|^2 = 1`);
2. the truth ``w_true``, shape (d,) or (d, k), standard normal;
3. the noise, shape (n,) or (n, k), standard normal, scaled by ``noise``:

.. math:: y = X w_\mathrm{true} + \sigma \varepsilon .

Two ways to make the data *not* identically distributed across contiguous shards of rows,
which is what a worker or a node holding "its own" data looks like:

* ``sort_by_first_feature=True`` sorts the rows by :math:`x_{i1}` (a stable sort), so
  every shard sees another part of the input space (covariate shift);
* ``shard_shift=h`` gives shard :math:`s` its own truth :math:`w_\mathrm{true} + h z_s`,
  :math:`z_s \sim N(0, I)` drawn after the noise, shard by shard:
  :math:`y_s \mathrel{+}= X_s (h z_s)`. The best single ``w`` is then a compromise
  between the shards' optima (concept shift).

The shards are :func:`contiguous_shards` (lessons 01 and 03: ``numpy.array_split``'s
rule) or any contiguous row ranges given explicitly, such as lesson 04's
:func:`rounded_shards`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["make_least_squares", "contiguous_shards", "rounded_shards", "check_sizes"]


def make_least_squares(n: int = 2000, d: int = 20, *, k: int | None = None, noise: float = 0.1, seed: int = 0,
                       unit_rows: bool = False, sort_by_first_feature: bool = False,
                       n_shards: int = 1, shard_shift: float = 0.0,
                       shard_ranges: Sequence[tuple[int, int]] | None = None,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded least-squares data ``(X, y, w_true)``: ``y = X w_true + noise * eps`` (see the module).

    k:            None for one output (y of shape (n,)), or k outputs at once (y (n, k), w_true (d, k)).
    noise:        the standard deviation of the noise.
    unit_rows:    features N(0, 1/d) instead of N(0, 1): E||x_i||^2 = 1 whatever d is.
    sort_by_first_feature: rows in increasing order of their first feature (non-iid shards).
    n_shards, shard_shift: shard s of ``contiguous_shards(n, n_shards)`` follows the truth
                  ``w_true + shard_shift * z_s``; ``shard_shift=0`` leaves y untouched.
    shard_ranges: the shards as explicit ``[(start, stop), ...]`` instead of ``n_shards``.

    Everything after ``d`` is keyword-only, so a third positional number cannot be taken for
    the wrong parameter.
    """
    check_sizes(n, d)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    if unit_rows:
        X /= np.sqrt(d)
    truth_shape = (d,) if k is None else (d, int(k))
    w_true = rng.standard_normal(truth_shape)
    y = X @ w_true + noise * rng.standard_normal((n,) + truth_shape[1:])
    if sort_by_first_feature:
        order = np.argsort(X[:, 0], kind="stable")
        X, y = X[order], y[order]
    if shard_shift:
        for start, stop in _shards_to_shift(n, n_shards, shard_ranges):
            y[start:stop] += X[start:stop] @ (shard_shift * rng.standard_normal(truth_shape))
    return X, y, w_true


def _shards_to_shift(n: int, n_shards: int, shard_ranges) -> list[tuple[int, int]]:
    if shard_ranges is None:
        return contiguous_shards(n, n_shards)
    if n_shards != 1:
        raise ValueError("give either n_shards or shard_ranges, not both")
    ranges = [(int(start), int(stop)) for start, stop in shard_ranges]
    if any(not 0 <= start <= stop <= n for start, stop in ranges):
        raise ValueError(f"shard_ranges must lie within rows 0..{n}, got {ranges}")
    return ranges


def contiguous_shards(n: int, n_shards: int) -> list[tuple[int, int]]:
    """Rows 0..n-1 cut into ``n_shards`` ranges [start, stop) the way ``numpy.array_split`` cuts.

    The sizes are ``n // n_shards`` plus one for the first ``n % n_shards`` shards. With more
    shards than rows the last ones are empty.
    """
    if not (isinstance(n_shards, (int, np.integer)) and n_shards >= 1):
        raise ValueError(f"n_shards must be an int >= 1, got {n_shards!r}")
    size, longer = divmod(int(n), int(n_shards))
    bounds = [0]
    for s in range(n_shards):
        bounds.append(bounds[-1] + size + (1 if s < longer else 0))
    return list(zip(bounds[:-1], bounds[1:]))


def rounded_shards(n: int, n_shards: int) -> list[tuple[int, int]]:
    """Rows 0..n-1 cut at ``round(s * n / n_shards)``, s = 0..n_shards (lesson 04's split, one shard per node).

    Like :func:`contiguous_shards` the sizes differ by at most one, but the longer shards are
    spread out instead of coming first.
    """
    if not (isinstance(n_shards, (int, np.integer)) and n_shards >= 1):
        raise ValueError(f"n_shards must be an int >= 1, got {n_shards!r}")
    bounds = np.linspace(0, n, n_shards + 1).round().astype(int)
    return [(int(start), int(stop)) for start, stop in zip(bounds[:-1], bounds[1:])]


def check_sizes(n, d) -> None:
    """ValueError unless n (samples) and d (features) are ints >= 1."""
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"n (number of samples) must be an int >= 1, got {n!r}")
    if not (isinstance(d, (int, np.integer)) and d >= 1):
        raise ValueError(f"d (number of features) must be an int >= 1, got {d!r}")
