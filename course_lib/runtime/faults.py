"""Fault and straggler injection: make a worker fail or slow down on purpose."""
from __future__ import annotations

import numbers
import operator
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
        step = _as_int(self.step)
        if step is None or step < 0:
            raise ValueError(f"Fault step must be an int >= 0, got {self.step!r}")
        object.__setattr__(self, "step", step)  # np.int64(2) from np.arange is stored as 2
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


def _as_int(value) -> int | None:
    """``value`` as a plain int if it is an integer (int, np.int64, ...) but not a bool; else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_rank_map(mapping, n_workers: int, what: str) -> dict:
    """Validate {rank: value} maps such as ``slow`` and ``faults``; keys become plain ints.

    A key such as np.int64(1) (from np.arange) means rank 1: the workers look their rank up
    with a plain int, and np.int64 keys would not even survive every pickling the same way.
    """
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise TypeError(f"{what} must be a dict {{rank: value}}, got {type(mapping).__name__}")
    out = {}
    for key, value in mapping.items():
        rank = _as_int(key)
        if rank is None or not 0 <= rank < n_workers:
            raise ValueError(f"{what} names rank {key!r}, but ranks are 0..{n_workers - 1}")
        if rank in out:
            raise ValueError(f"{what} names rank {rank} twice")
        out[rank] = value
    return out


def check_slow(slow, n_workers: int) -> dict:
    slow = check_rank_map(slow, n_workers, "slow")
    for rank, factor in slow.items():
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not factor >= 1:
            raise ValueError(f"slow[{rank}] must be a factor >= 1 (1 = normal speed), got {factor!r}")
        slow[rank] = float(factor)
    return slow
