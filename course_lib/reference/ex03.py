"""Lesson 03, the asynchronous parameter server and Hogwild!: reference answers
(instructor-only, see :mod:`course_lib.reference`).

ex03_1  apply_update(state, grad, computed_version, worker, time, step_size)  the server's apply step
ex03_2  staleness_aware_lr(lr, staleness)                                      step size lr / (staleness + 1)
ex03_3  hogwild_worker(w, idx, val, y, order, lr)                              the lock-free worker loop
ex03_4  expected_wait(n, b, mu)                                                backup workers: E[wait]
ex03_5  fedavg(models, sizes)                                                  FedAvg's weighted average

The asynchronous server of :mod:`course_lib.async_ps.parameter_server` applies gradients with
:func:`apply_update` (and :func:`staleness_aware_lr` under ``policy="staleness_aware"``); the
Hogwild! runner and its serial baseline (:mod:`course_lib.async_ps.hogwild`) step with
:func:`hogwild_worker`; :func:`course_lib.async_ps.expected_backup_wait` is :func:`expected_wait`; the federated
server of :mod:`course_lib.async_ps.fedavg` averages the clients' models with :func:`fedavg`.
"""
from __future__ import annotations

import numpy as np


def apply_update(state, grad, computed_version, worker, time, step_size=None):
    """Apply one gradient the moment it arrives and record it; return its staleness.

    staleness = state.version - computed_version, taken *before* the version moves; then
    w <- w - step_size(state.lr, staleness) * grad in place (workers' replies are built from
    state.w), version + 1, and one ``Record(worker, computed_version, staleness, time, True, lr)``.
    ``step_size`` defaults to the constant step :func:`course_lib.async_ps.constant_lr`."""
    from course_lib.async_ps.records import Record, constant_lr

    step_size = constant_lr if step_size is None else step_size
    staleness = state.version - computed_version
    lr = step_size(state.lr, staleness)
    state.w -= lr * grad
    state.version += 1
    state.records.append(Record(worker, computed_version, staleness, time, True, lr))
    return staleness


def staleness_aware_lr(lr, staleness):
    """Zhang et al. (2016): ``lr / (staleness + 1)``; a fresh gradient keeps the full step."""
    return lr / (staleness + 1)


def hogwild_worker(w, idx, val, y, order, lr):
    """Lock-free SGD on the shared vector ``w``: one step per sample i in ``order``, touching only
    its support J = idx[i]: w[J] -= lr * (val[i] . w[J] - y[i]) * val[i]. Returns the count."""
    for i in order:
        J = idx[i]
        xi = val[i]
        w[J] -= lr * (xi @ w[J] - y[i]) * xi
    return len(order)


def expected_wait(n, b, mu):
    """Mean time until the first n of n + b exponential(mean mu) workers finish: mu (H_{n+b} - H_b).

    The gaps between consecutive finishes are exponential with means mu/(n+b), mu/(n+b-1), ...,
    mu/(b+1) (memorylessness); their sum is the wait."""
    return mu * sum(1.0 / k for k in range(b + 1, n + b + 1))


def fedavg(models, sizes):
    """McMahan et al. (2017), the server's step: the clients' models averaged, weighted by data size.

    w = sum_k (n_k / n) w_k with n = sum_k n_k: a client with twice the rows counts twice. The
    models are (d,) arrays (not changed); the result is a new float64 array."""
    weights = np.asarray(sizes, dtype=np.float64)
    stacked = np.asarray(models, dtype=np.float64)
    return (weights / weights.sum()) @ stacked
