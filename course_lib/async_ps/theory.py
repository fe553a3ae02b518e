"""Order statistics for synchronous SGD with backup workers (Chen et al. 2016).

With ``N + b`` workers whose compute times are i.i.d. exponential with mean ``mu``, a
round that waits for the first ``N`` gradients lasts the N-th smallest of ``N + b``
exponentials. By the memoryless property the gaps between consecutive finishes are
exponential with means ``mu / (N+b), mu / (N+b-1), ...``, so

    E[wait] = mu * (1/(N+b) + 1/(N+b-1) + ... + 1/(b+1)) = mu * (H_{N+b} - H_b),

with ``H_k = 1 + 1/2 + ... + 1/k`` the harmonic numbers. Without backups (b = 0) the
wait is ``mu * H_N``, growing like ``mu * ln N``: the straggler cost of synchronous SGD.
"""
from __future__ import annotations

import numpy as np

from course_lib.reference.ex03 import expected_wait


def harmonic(k: int) -> float:
    """``H_k = sum_{i=1}^k 1/i`` (``H_0 = 0``)."""
    if k < 0:
        raise ValueError(f"harmonic number needs k >= 0, got {k}")
    return float(sum(1.0 / i for i in range(1, k + 1)))


def expected_backup_wait(n: int, b: int, mu: float) -> float:
    """``E[wait] = mu (H_{N+b} - H_b)`` for the first ``n`` of ``n + b`` exponential(mean mu) times:
    :func:`course_lib.reference.ex03.expected_wait` (question ex03_4), with its inputs checked."""
    if n < 1 or b < 0:
        raise ValueError(f"need N >= 1 and b >= 0, got N={n}, b={b}")
    return expected_wait(n, b, mu)


def simulate_backup_wait(n: int, b: int, mu: float, rounds: int = 20000, seed: int = 0):
    """Monte Carlo: per round draw ``n + b`` exponential times, wait for the n-th smallest.

    Returns the array of ``rounds`` waits (its mean estimates ``expected_backup_wait``).
    """
    if n < 1 or b < 0:
        raise ValueError(f"need N >= 1 and b >= 0, got N={n}, b={b}")
    times = np.random.default_rng(seed).exponential(mu, size=(rounds, n + b))
    return np.partition(times, n - 1, axis=1)[:, n - 1]
