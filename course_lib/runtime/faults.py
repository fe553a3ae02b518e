"""Fault and straggler injection: make a worker fail or slow down on purpose."""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

FAULT_KINDS = ("raise", "kill", "hang", "exit")


class InjectedFault(RuntimeError):
    """The exception a ``Fault("raise", ...)`` throws inside the worker."""


@dataclass(frozen=True)
class Fault:
    """Make a rank fail at the start of its ``step``-th compute phase (0-based).

    kind: ``"raise"`` (an exception, with traceback), ``"kill"`` (SIGKILL: the
    process vanishes, as when a machine loses power), ``"hang"`` (never returns),
    ``"exit"`` (``os._exit(3)``, a crash without a traceback).
    label: count only the compute phases with this label (``comm.compute(label)``), so
    a fault can hit one protocol step exactly, e.g. ``Fault("kill", 0, label="precopy")``.
    """

    kind: str = "raise"
    step: int = 0
    label: str | None = None

    def __post_init__(self):
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"Fault kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        if not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"Fault step must be an int >= 0, got {self.step!r}")
        if self.label is not None and not isinstance(self.label, str):
            raise ValueError(f"Fault label must be a str or None, got {self.label!r}")

    def trigger(self, rank: int) -> None:
        if self.kind == "raise":
            where = f"compute step {self.step}" + (f" labelled {self.label!r}" if self.label else "")
            raise InjectedFault(f"injected fault on rank {rank} at {where}")
        sys.stdout.flush()
        time.sleep(0.05)  # let the log feeder thread finish writing (a kill mid-write wedges the queue)
        if self.kind == "kill":
            if hasattr(signal, "SIGKILL"):
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(9)  # Windows: no SIGKILL
        if self.kind == "exit":
            os._exit(3)
        while True:  # "hang"
            time.sleep(3600)


def as_fault(value) -> Fault:
    if isinstance(value, Fault):
        return value
    if isinstance(value, tuple) and len(value) in (2, 3):
        return Fault(*value)
    raise TypeError(f"a fault must be Fault(kind, step[, label]) or (kind, step[, label]), got {value!r}")


def check_rank_map(mapping, n_workers: int, what: str) -> dict:
    """Validate {rank: value} maps such as ``slow`` and ``faults``."""
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise TypeError(f"{what} must be a dict {{rank: value}}, got {type(mapping).__name__}")
    for rank in mapping:
        if not isinstance(rank, int) or not 0 <= rank < n_workers:
            raise ValueError(f"{what} names rank {rank!r}, but ranks are 0..{n_workers - 1}")
    return dict(mapping)


def check_slow(slow, n_workers: int) -> dict:
    slow = check_rank_map(slow, n_workers, "slow")
    for rank, factor in slow.items():
        if not isinstance(factor, (int, float)) or factor < 1:
            raise ValueError(f"slow[{rank}] must be a factor >= 1 (1 = normal speed), got {factor!r}")
    return slow
