"""What travels on the control Pipe between the launching process and each worker.

One small class per kind of message, so a reader sees every field by name and a handler
dispatches on the type. Parent to worker: ``WireUp``, ``StartRun`` (followed on the Pipe by
the pickled function as raw bytes), ``DropSegments``, ``Stop``, ``BarrierRelease``,
``BarrierFailed``. Worker
to parent: ``Listening``, ``Wired``, ``StartFailed``, ``RunDone``, ``RunFailed``,
``BarrierArrived``, ``Progress``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .netem import Network
from .trace import Stats


# parent -> worker
@dataclass(frozen=True)
class WireUp:
    higher: dict   # rank -> address, for the neighbours this worker connects to
    lower: list    # ranks of the neighbours that connect to this worker


@dataclass(frozen=True)
class StartRun:
    """Followed on the Pipe by the pickled (fn, args, kwargs) as raw bytes."""
    run_id: int
    t0: float
    network: Network
    slow: dict
    faults: dict
    trace: bool
    drop_segments: tuple = ()  # segments the parent released since the last message


@dataclass(frozen=True)
class DropSegments:
    """The parent released these segments: unmap them, so their memory is really freed."""
    names: tuple


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class BarrierRelease:
    """Every running rank called comm.barrier(): go on."""


@dataclass(frozen=True)
class BarrierFailed:
    """The barrier can never complete: these ranks' functions returned in this run, so they
    will not call comm.barrier() again. The waiting rank raises PeerReturned naming them."""
    returned: tuple[int, ...]


# worker -> parent
@dataclass(frozen=True)
class Listening:
    address: object


@dataclass(frozen=True)
class Wired:
    pass


@dataclass(frozen=True)
class StartFailed:
    exc_type: str
    message: str
    traceback: str
    errno: int | None = None


@dataclass(frozen=True)
class RunDone:
    run_id: int
    result: bytes
    result_type: str
    stats: Stats
    events: list


@dataclass(frozen=True)
class RunFailed:
    run_id: int
    exc_type: str
    message: str
    traceback: str
    stats: Stats
    events: list
    raised_at: float = field(default_factory=time.time)  # wall clock, to measure how fast it is reported


@dataclass(frozen=True)
class BarrierArrived:
    """This rank called comm.barrier() and waits for BarrierRelease (or BarrierFailed)."""
    rank: int


@dataclass(frozen=True)
class Progress:
    rank: int
    done: int
    total: int
