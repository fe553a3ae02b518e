"""Lesson 03: the asynchronous parameter server, staleness, backup workers and Hogwild!.

* :mod:`.parameter_server`: rank 0 serves, the other ranks push gradients; staleness of every gradient.
* :mod:`.experiment`: ``train_async(X, y, settings)`` runs it on real processes -> :class:`PSResult`.
* :mod:`.settings`: one frozen, checked dataclass per runner (:class:`AsyncSettings`, :class:`HogwildSettings`,
  :class:`FedAvgSettings`); each runner also takes their fields as keywords.
* :mod:`.theory`: backup-worker wait ``mu (H_{N+b} - H_b)`` and its Monte Carlo check.
* :mod:`.hogwild`: lock-free SGD on a shared-memory vector, a locked variant, a serial baseline.
* :mod:`.fedavg`: federated averaging (McMahan et al. 2017), the limit of a slow worker -> :class:`FedAvgResult`.
* :mod:`.sgd_problems`: data, losses, serial SGD baselines, the sparsity statistics of Hogwild!.

The functions the exercises ask for (the apply step, the staleness-aware step size, the Hogwild!
worker loop, the backup-worker wait, FedAvg's weighted average) live in :mod:`course_lib.reference.ex03`; this package
imports them from there and keeps their names.
"""
# Lesson 01's full gradient (question ex01_1), under the name this package used to give it.
from course_lib.reference.ex01 import full_gradient as gradient

from .experiment import PSResult, train_async
from .fedavg import FedAvgResult, fedavg, fedavg_serial, local_steps, train_fedavg
from .hogwild import HogwildResult, SerialRun, hogwild_worker, locked_worker, on_private_copy, run_hogwild, run_serial
from .hogwild_timing import collisions, time_hogwild_variants, time_overlap, timed_worker
from .parameter_server import POLICIES, Record, ServerState, apply_update, constant_lr, run_ps, staleness_aware_lr
from .settings import AsyncSettings, FedAvgSettings, HogwildSettings
from .sgd_problems import (
    SparseProblem,
    batch_gradient,
    loss,
    make_least_squares,
    make_sparse_problem,
    optimal_loss,
    sample_order,
    serial_sgd,
    serial_sparse_sgd,
    shards,
    sparse_loss,
    sparsity_stats,
)
from .theory import expected_backup_wait, harmonic, simulate_backup_wait

__all__ = [
    "AsyncSettings", "FedAvgSettings", "HogwildSettings",
    "PSResult", "train_async",
    "FedAvgResult", "fedavg", "fedavg_serial", "local_steps", "train_fedavg",
    "HogwildResult", "SerialRun", "collisions", "timed_worker", "hogwild_worker", "locked_worker", "run_hogwild",
    "run_serial", "on_private_copy", "time_hogwild_variants", "time_overlap",
    "SparseProblem", "batch_gradient", "gradient", "loss", "make_least_squares", "make_sparse_problem", "optimal_loss",
    "sample_order", "serial_sgd", "serial_sparse_sgd", "shards", "sparse_loss", "sparsity_stats",
    "POLICIES", "Record", "ServerState", "apply_update", "constant_lr", "run_ps", "staleness_aware_lr",
    "expected_backup_wait", "harmonic", "simulate_backup_wait",
]
