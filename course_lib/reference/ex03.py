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

    staleness = state.version - computed_version; w <- w - step_size(state.lr, staleness) * grad,
    the version + 1, and one ``Record(worker, computed_version, staleness, time, True, lr)``.
    ``step_size`` defaults to the constant step ``constant_lr``."""
    # imported here, not at the top of course_lib/reference/ex03.py: the server imports this module
    from course_lib.async_ps.records import Record, constant_lr

    step_size = constant_lr if step_size is None else step_size
    # the gap is measured before the version moves: 0 for a gradient of the current w
    staleness = state.version - computed_version
    lr = step_size(state.lr, staleness)
    # in place: the workers' replies are built from state.w
    state.w -= lr * grad
    state.version += 1
    state.records.append(Record(worker, computed_version, staleness, time, True, lr))
    return staleness


def staleness_aware_lr(lr, staleness):
    """Step size for a gradient ``staleness`` versions old (Zhang et al. 2016)."""
    # lr / (staleness + 1): a fresh gradient (staleness 0) keeps the full step, an old one counts less
    return lr / (staleness + 1)


def hogwild_worker(w, idx, val, y, order, lr):
    """Lock-free SGD on the shared vector ``w``, one step per sample i in ``order``; returns the count.

    Sample i's features are ``val[i]`` at the positions ``idx[i]``, its target ``y[i]``."""
    for i in order:
        J = idx[i]
        xi = val[i]
        # the squared-error step on sample i touches only its support J: read, compute and write
        # back w[J] alone; other processes write other coordinates meanwhile, with no lock (a rare
        # collision costs little on sparse data)
        w[J] -= lr * (xi @ w[J] - y[i]) * xi
    return len(order)


def expected_wait(n, b, mu):
    """Mean time until the first n of n + b exponential(mean mu) workers finish: mu (H_{n+b} - H_b)."""
    # The gaps between consecutive finishes are exponential with means mu/(n+b), mu/(n+b-1),
    # ..., mu/(b+1) (memorylessness: the running workers start afresh); the wait is their sum.
    return mu * sum(1.0 / k for k in range(b + 1, n + b + 1))


def fedavg(models, sizes):
    """The server's step of FedAvg (McMahan et al. 2017): w = sum_k (n_k / n) w_k, n = sum_k n_k.

    ``models`` are (d,) arrays (left unchanged); the result is a new float64 array."""
    # a client with twice the rows counts twice: one weighted sum, as a (K,) @ (K, d) product
    weights = np.asarray(sizes, dtype=np.float64)
    stacked = np.asarray(models, dtype=np.float64)
    return (weights / weights.sum()) @ stacked
