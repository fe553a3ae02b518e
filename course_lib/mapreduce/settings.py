"""The settings of one MapReduce gradient-descent run (lesson 01), a frozen dataclass checked when made.

:func:`course_lib.mapreduce.mapreduce_gd` takes them whole, or their fields as keywords
(``mapreduce_gd(cluster, "least_squares", X, y, iters=50)``), which override the fields of
the settings it is given.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from course_lib import validate
from course_lib.runtime.faults import as_fault
from course_lib.runtime.netem import Network

from .serial import REDUCES

ON_FAILURE = ("raise", "continue")


@dataclass(frozen=True)
class MapReduceSettings:
    """How one run of synchronous MapReduce GD goes (rank 0 serves, ranks 1..M map).

    iters:            the iterations: broadcast w, map every shard, reduce, update.
    lr:               the step size; None: 1/L, L the loss's Lipschitz bound on the data (``default_lr``).
    reduce:           ``"sum"``, ``"mean"`` or ``"collect"``: what each worker sends up (see ``serial``).
    checkpoint_dir:   where the server saves (w, iteration, losses); None: no checkpoints.
    checkpoint_every: save every this many iterations (needs ``checkpoint_dir``).
    resume:           start from the last checkpoint in ``checkpoint_dir``, if there is one.
    task_timeout:     seconds after the broadcast within which a worker must answer, else its shards are
                      re-executed elsewhere; None: only a worker whose process died counts as failed.
    batch_size:       None: full-batch gradient descent. B: minibatch SGD, each iteration's gradient the mean
                      of g_i over B rows drawn without replacement (``serial.minibatch``); every worker maps
                      only the drawn rows of its shard, so the same words travel as for the full batch.
    batch_seed:       the seed of the draws: iteration t's rows come from ``default_rng([batch_seed, t])``,
                      which every rank computes alike (no row indices travel).

    The run's own knobs, passed to ``cluster.run`` (None: the cluster's own setting):

    network:          a :class:`course_lib.Network` emulating the links.
    slow:             {rank: factor >= 1} slowing that rank's compute.
    faults:           {rank: Fault}; with faults and no ``on_failure``, ``on_failure="continue"``.
    timeout:          seconds the whole run may take.
    on_failure:       ``"raise"`` or ``"continue"`` when a worker fails.
    """

    iters: int = 100
    lr: float | None = None
    reduce: str = "sum"
    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    task_timeout: float | None = None
    batch_size: int | None = None
    batch_seed: int = 0
    network: Network | None = None
    slow: dict | None = None
    faults: dict | None = None
    timeout: float | None = None
    on_failure: str | None = None

    def __post_init__(self):
        owner = type(self).__name__
        object.__setattr__(self, "iters", validate.integer(owner, "iters", self.iters, 1))
        for name in ("lr", "task_timeout", "timeout"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, validate.number(owner, name, getattr(self, name), positive=True))
        validate.choice(owner, "reduce", self.reduce, REDUCES)
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", validate.integer(owner, "batch_size", self.batch_size, 1))
        object.__setattr__(self, "batch_seed", validate.integer(owner, "batch_seed", self.batch_seed, 0))
        self._check_checkpoints(owner)
        self._check_run_knobs(owner)

    def _check_checkpoints(self, owner: str) -> None:
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise TypeError(f"{owner}.checkpoint_dir must be a path or None, got {self.checkpoint_dir!r}")
        validate.flag(owner, "resume", self.resume)
        if self.checkpoint_every is not None:
            every = validate.integer(owner, "checkpoint_every", self.checkpoint_every, 1)
            object.__setattr__(self, "checkpoint_every", every)
        for name in ("checkpoint_every", "resume"):
            if getattr(self, name) and self.checkpoint_dir is None:
                raise ValueError(f"{owner}.{name} needs a checkpoint_dir")

    def _check_run_knobs(self, owner: str) -> None:
        """Types and values; the ranks of ``slow`` and ``faults`` are checked against the cluster by ``cluster.run``."""
        if self.network is not None and not isinstance(self.network, Network):
            raise TypeError(f"{owner}.network must be a course_lib.Network or None, got {type(self.network).__name__}")
        for name in ("slow", "faults"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise TypeError(f"{owner}.{name} must be a dict {{rank: value}} or None, got {getattr(self, name)!r}")
        for factor in (self.slow or {}).values():
            validate.number(owner, "slow", factor, positive=True)
        for fault in (self.faults or {}).values():
            as_fault(fault)
        if self.on_failure is not None:
            validate.choice(owner, "on_failure", self.on_failure, ON_FAILURE)

    def run_knobs(self) -> dict:
        """The keywords for ``cluster.run``: the knobs given; with faults, the server survives them by default."""
        knobs = {name: getattr(self, name) for name in ("network", "slow", "faults", "timeout", "on_failure")
                 if getattr(self, name) is not None}
        if self.faults and self.on_failure is None:
            knobs["on_failure"] = "continue"  # the server must outlive the worker it re-executes
        return knobs
