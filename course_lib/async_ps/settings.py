"""The settings of lesson 03's runs, one frozen dataclass per runner, checked when made.

* :class:`AsyncSettings`: :func:`course_lib.async_ps.train_async` and the SPMD program it runs,
  :func:`course_lib.async_ps.run_ps`;
* :class:`HogwildSettings`: :func:`course_lib.async_ps.run_hogwild`;
* :class:`FedAvgSettings`: :func:`course_lib.async_ps.train_fedavg` and :func:`course_lib.async_ps.run_fedavg`.

Each runner also takes its settings as keywords (``train_async(X, y, n_workers=3)``), which
override the fields of the settings it is given.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course_lib import validate
from course_lib.reference.ex03 import apply_update, fedavg  # questions ex03_1, ex03_5
from course_lib.runtime.faults import as_fault, check_rank_map, check_slow

POLICIES = ("async", "staleness_aware", "drop", "sync")
COMPUTE_DISTS = ("fixed", "exp")


def _run_knobs(owner, settings, n_ranks: int) -> None:
    """Check ``slow``, ``faults``, ``timeout`` and ``start_method`` against a cluster of ``n_ranks``."""
    if getattr(settings, "slow", None) is not None:
        check_rank_map(settings.slow, n_ranks, f"{owner}.slow")
        object.__setattr__(settings, "slow", check_slow(settings.slow, n_ranks))
    if getattr(settings, "faults", None) is not None:
        faults = check_rank_map(settings.faults, n_ranks, f"{owner}.faults")
        object.__setattr__(settings, "faults", {rank: as_fault(f) for rank, f in faults.items()})
    object.__setattr__(settings, "timeout", validate.number(owner, "timeout", settings.timeout, positive=True))
    if getattr(settings, "start_method", None) is not None and not isinstance(settings.start_method, str):
        raise TypeError(f"{owner}.start_method must be a str or None, got {settings.start_method!r}")


@dataclass(frozen=True)
class AsyncSettings:
    """How one run of the asynchronous parameter server goes (rank 0 serves, ranks 1..n_workers work).

    n_workers:     the workers; the run uses a cluster of ``n_workers + 1`` ranks.
    n_updates:     the server stops at this version (one version per applied update or sync round).
    lr:            the step size.
    policy:        ``"async"`` (apply every gradient), ``"staleness_aware"`` (step ``lr / (staleness + 1)``),
                   ``"drop"`` (discard gradients staler than ``max_staleness``) or ``"sync"`` (rounds
                   that wait for ``n_workers - n_backup`` fresh gradients).
    max_staleness: the staleness above which ``"drop"`` discards a gradient (that policy only).
    n_backup:      the backup workers of ``"sync"``, ``0 <= n_backup < n_workers`` (that policy only).
    batch_size:    the rows of each minibatch, drawn with replacement from the worker's rows.
    seed:          the minibatch (and compute-time) draws: worker r samples with ``default_rng([seed, r])``.
    compute_time:  emulated seconds of compute per gradient (stretched by ``slow``).
    compute_dist:  ``"fixed"`` (always ``compute_time``) or ``"exp"`` (exponential of mean ``compute_time``).
    apply:         the server's apply step, ``apply(state, g, version, worker, time, step_size)`` (question ex03_1).
    step_size:     ``step_size(lr, staleness)``; None: from the policy (constant, or staleness-aware).
    loss_every:    the server records the loss every this many versions (and at the end).
    slow:          {cluster rank: factor >= 1} slowing that rank's compute.
    faults:        {cluster rank: Fault}; with faults the server carries on past a dead worker.
    start_method:  fork, spawn or forkserver for the run's own cluster (None: the course's default).
    timeout:       seconds the whole run may take before it is stopped.
    """

    n_workers: int = 3
    n_updates: int = 200
    lr: float = 0.05
    policy: str = "async"
    max_staleness: int | None = None
    n_backup: int = 0
    batch_size: int = 16
    seed: int = 0
    compute_time: float = 0.0
    compute_dist: str = "fixed"
    apply: Callable = apply_update
    step_size: Callable | None = None
    loss_every: int = 1
    slow: dict | None = None
    faults: dict | None = None
    start_method: str | None = None
    timeout: float = 60.0

    def __post_init__(self):
        owner = type(self).__name__
        for name, minimum in (("n_workers", 1), ("n_updates", 1), ("batch_size", 1), ("seed", 0),
                              ("loss_every", 1), ("n_backup", 0)):
            object.__setattr__(self, name, validate.integer(owner, name, getattr(self, name), minimum))
        object.__setattr__(self, "lr", validate.number(owner, "lr", self.lr, positive=True))
        object.__setattr__(self, "compute_time", validate.number(owner, "compute_time", self.compute_time))
        validate.choice(owner, "compute_dist", self.compute_dist, COMPUTE_DISTS)
        validate.function(owner, "apply", self.apply)
        validate.function(owner, "step_size", self.step_size, optional=True)
        self._check_policy(owner)
        _run_knobs(owner, self, self.n_workers + 1)

    def _check_policy(self, owner: str) -> None:
        """The policy, and the two settings that belong to one policy only."""
        validate.choice(owner, "policy", self.policy, POLICIES)
        if self.policy == "drop":
            if self.max_staleness is None:
                raise ValueError(f"{owner}: policy='drop' needs max_staleness (an int >= 0)")
            object.__setattr__(self, "max_staleness", validate.integer(owner, "max_staleness", self.max_staleness, 0))
        elif self.max_staleness is not None:
            raise ValueError(f"{owner}.max_staleness applies to policy='drop' only, got it with {self.policy!r}")
        if self.policy == "sync" and not self.n_backup < self.n_workers:
            raise ValueError(f"{owner}.n_backup must be < n_workers = {self.n_workers} (a round needs one fresh "
                             f"gradient), got {self.n_backup}")
        if self.policy != "sync" and self.n_backup:
            raise ValueError(f"{owner}.n_backup applies to policy='sync' only, "
                             f"got {self.n_backup} with {self.policy!r}")


@dataclass(frozen=True)
class HogwildSettings:
    """How one Hogwild! run goes: ``n_workers`` processes doing SGD on one shared ``w``.

    n_workers:    the worker processes.
    n_updates:    the samples visited in all, ``sample_order(n, n_updates, seed)`` dealt round-robin
                  to the workers (at least one each).
    lr:           the step size.
    lock:         take a lock around each update (the serialised, always-correct variant).
    worker:       the worker loop, with the signature of ``hogwild_worker`` (plus ``lock`` when
                  ``lock=True``); None: ``hogwild_worker`` (question ex03_3), or its locked loop.
    seed:         the sample order.
    start_method: fork, spawn or forkserver (None: the course's default).
    timeout:      seconds all the workers of one run may take together.
    repeats:      runs of the whole thing, from w = 0 each time; the fastest one is returned.
    apart:        each worker on a private copy of ``w``: the time of the same loop sharing nothing.
    """

    n_workers: int = 2
    n_updates: int = 20000
    lr: float = 0.5
    lock: bool = False
    worker: Callable | None = None
    seed: int = 0
    start_method: str | None = None
    timeout: float = 60.0
    repeats: int = 1
    apart: bool = False

    def __post_init__(self):
        owner = type(self).__name__
        for name, minimum in (("n_workers", 1), ("seed", 0), ("repeats", 1)):
            object.__setattr__(self, name, validate.integer(owner, name, getattr(self, name), minimum))
        object.__setattr__(self, "n_updates", validate.integer(owner, "n_updates", self.n_updates, self.n_workers))
        object.__setattr__(self, "lr", validate.number(owner, "lr", self.lr, positive=True))
        validate.flag(owner, "lock", self.lock)
        validate.flag(owner, "apart", self.apart)
        if self.apart and self.lock:
            raise ValueError(f"{owner}: apart=True shares nothing, so there is nothing to lock (lock=True)")
        validate.function(owner, "worker", self.worker, optional=True)
        _run_knobs(owner, self, self.n_workers)


@dataclass(frozen=True)
class FedAvgSettings:
    """How one run of federated averaging goes: rank 0 serves, ranks 1..n_clients are the clients.

    n_clients:    the clients; the run uses a cluster of ``n_clients + 1`` ranks.
    n_rounds:     the rounds: the server sends ``w``, the clients train, the server averages.
    local_steps:  E, the gradient steps each client takes on its own rows per round (1: FedSGD).
    lr:           the clients' step size.
    shard_ranges: the clients' rows, ``((start, stop), ...)``, one non-empty range per client;
                  None: the contiguous shards of the data (``contiguous_shards(n, n_clients)``).
    min_answers:  None: a round waits for every client; m: it closes after m answers, later ones dropped.
    compute_time: emulated seconds of compute per local step (stretched by ``slow``).
    slow:         {cluster rank: factor >= 1} slowing that rank's compute.
    average:      the server's step ``average(models, sizes)`` (question ex03_5).
    timeout:      seconds the whole run may take before it is stopped.
    """

    n_clients: int = 4
    n_rounds: int = 50
    local_steps: int = 1
    lr: float = 0.1
    shard_ranges: tuple | None = None
    min_answers: int | None = None
    compute_time: float = 0.0
    slow: dict | None = None
    average: Callable = fedavg
    timeout: float = 60.0

    def __post_init__(self):
        owner = type(self).__name__
        for name in ("n_clients", "n_rounds", "local_steps"):
            object.__setattr__(self, name, validate.integer(owner, name, getattr(self, name), 1))
        object.__setattr__(self, "lr", validate.number(owner, "lr", self.lr, positive=True))
        object.__setattr__(self, "compute_time", validate.number(owner, "compute_time", self.compute_time))
        if self.min_answers is not None:
            answers = validate.integer(owner, "min_answers", self.min_answers, 1)
            if answers > self.n_clients:
                raise ValueError(f"{owner}.min_answers must be None or 1..{self.n_clients}, got {answers}")
            object.__setattr__(self, "min_answers", answers)
        if self.shard_ranges is not None:
            object.__setattr__(self, "shard_ranges", self._checked_ranges(owner))
        validate.function(owner, "average", self.average)
        _run_knobs(owner, self, self.n_clients + 1)

    def _checked_ranges(self, owner: str) -> tuple:
        """The clients' row ranges as a tuple of ``(start, stop)`` ints, one non-empty range per client."""
        try:
            ranges = tuple((int(start), int(stop)) for start, stop in self.shard_ranges)
        except (TypeError, ValueError):
            raise TypeError(f"{owner}.shard_ranges must be pairs (start, stop), got {self.shard_ranges!r}") from None
        if len(ranges) != self.n_clients or any(not 0 <= start < stop for start, stop in ranges):
            raise ValueError(f"{owner}.shard_ranges needs one non-empty row range per client "
                             f"({self.n_clients}), got {list(ranges)}")
        return ranges
