"""The messages of the parameter server: one frozen dataclass per kind, and how they travel.

Ranks ``0 .. S-1`` are servers, ``S .. S+W-1`` workers (worker ``w`` is rank ``S + w``), and with
``cfg.scheduler`` the last rank hands out data. A request (push or pull) is cut into *slices*, one
per key range of the ring; a slice's ``pid`` numbers it within its request, and the *tag*
``(worker, ts, pid)`` names one update slice everywhere (servers apply each tag once).

On the wire a message is a plain tuple ``(kind, field, field, ...)`` in field order, and a list of
records (slices, range sums, answers) a list of plain tuples: :func:`encode` and :func:`decode`
are the only code that knows this. Plain tuples pickle smaller than dataclasses, so the byte
counts a lesson shows are those of the payload, not of class names.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

Tag = tuple[int, int, int]                    # (worker, request timestamp, slice id): one update slice
Keys = np.ndarray | bytes                     # sorted int64 keys, or the 8-byte digest of a list sent before
Values = np.ndarray | bytes | None            # float64 values (zlib bytes when compressed); None in a pull


class UnknownMessage(TypeError):
    """A message that its receiver has no handler for (or a wire tuple of no known kind)."""


# ---------------------------------------------------------------------------- records inside messages
@dataclass(frozen=True)
class Slice:
    """The part of a push or pull that falls in one key range: arc ``arc`` of the ring it was cut with."""
    pid: int
    arc: int
    keys: Keys
    values: Values


@dataclass(frozen=True)
class RangeSum:
    """The sum of the buffered updates of one key range, and the tags of the updates it contains."""
    arc: int
    keys: np.ndarray
    total: np.ndarray
    tags: list[Tag]
    clock: int                                # the latest iteration among them


@dataclass(frozen=True)
class SliceValues:
    """The values of the keys of slice ``pid`` of a pull, in key order."""
    pid: int
    values: Values


def _records(record_type: type) -> Any:
    """A field holding a list of ``record_type``; on the wire, a list of plain tuples."""
    return field(metadata={"record": record_type})


# ---------------------------------------------------------------------------- messages
_BY_KIND: dict[str, type[Message]] = {}


class Message:
    """Base of every message; ``kind`` is its name on the wire."""
    kind: ClassVar[str]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "kind" not in cls.__dict__:          # a base of several kinds (SliceRequest)
            return
        if cls.kind in _BY_KIND:
            raise TypeError(f"two messages of kind {cls.kind!r}: {_BY_KIND[cls.kind].__name__} and {cls.__name__}")
        _BY_KIND[cls.kind] = cls


@dataclass(frozen=True)
class SliceRequest(Message):
    """What a push, a pull and a forwarded push carry: slices of worker ``worker``'s request ``ts``, made at
    its clock ``clock`` (iterations finished) with the ring of ``epoch`` (0 before a server joined, 1 after)."""
    worker: int
    ts: int
    clock: int
    slices: list[Slice] = _records(Slice)
    epoch: int


@dataclass(frozen=True)
class Push(SliceRequest):
    """Worker -> head server of each range: add the slices' values to their keys (``kv.push``). The head
    applies it and forwards it down the range's chain; the tail acknowledges."""
    kind: ClassVar[str] = "push"


@dataclass(frozen=True)
class Pull(SliceRequest):
    """Worker -> head server of each range: send me the values of the slices' keys (``kv.pull``). The
    server holds it back until the bounded-delay gate lets a worker at ``clock`` read."""
    kind: ClassVar[str] = "pull"


@dataclass(frozen=True)
class Forward(SliceRequest):
    """Server -> its successor in a range's chain: a push it applied (chain replication), sent on once."""
    kind: ClassVar[str] = "fwd"


@dataclass(frozen=True)
class Aggregate(Message):
    """Server -> its successor, with ``replicate="aggregate"``: the buffered pushes summed per key range,
    every ``aggregate_every`` clock ticks; fewer, smaller messages than forwarding each push, later acks."""
    kind: ClassVar[str] = "agg"
    sums: list[RangeSum] = _records(RangeSum)


@dataclass(frozen=True)
class Ack(Message):
    """Tail server of a chain -> worker: slices ``pids`` of push ``ts`` are on every replica."""
    kind: ClassVar[str] = "ack"
    ts: int
    pids: list[int]


@dataclass(frozen=True)
class Answer(Message):
    """Server -> worker: the values its pull ``ts`` asked for, per slice."""
    kind: ClassVar[str] = "vals"
    ts: int
    slices: list[SliceValues] = _records(SliceValues)


@dataclass(frozen=True)
class Clock(Message):
    """Worker -> every live server (``kv.advance``): I finished iteration ``clock - 1``; the servers'
    read gate waits on the slowest of these clocks."""
    kind: ClassVar[str] = "clock"
    worker: int
    clock: int


@dataclass(frozen=True)
class Flush(Message):
    """Worker -> every live server, with ``replicate="aggregate"``: replicate what you buffered now, so the
    acknowledgements I wait for come."""
    kind: ClassVar[str] = "flush"


@dataclass(frozen=True)
class Done(Message):
    """Worker -> every live server: I will send nothing more; stop waiting for my clock."""
    kind: ClassVar[str] = "done"
    worker: int


# ---------------------------------------------------------------------------- a server joins (:mod:`.join`)
@dataclass(frozen=True)
class JoinRequest(Message):
    """Joiner -> every live server: send me a snapshot of these keys (the ones you head that I will hold)."""
    kind: ClassVar[str] = "join_req"
    keys: np.ndarray


@dataclass(frozen=True)
class Precopy(Message):
    """Server -> joiner: one chunk of its snapshot, with the tags of the updates applied since the previous
    chunk (so the joiner knows which updates the chunk holds); ``last`` ends the snapshot."""
    kind: ClassVar[str] = "precopy"
    server: int
    keys: np.ndarray
    values: np.ndarray
    tags: set[Tag]
    last: bool


@dataclass(frozen=True)
class Delta(Message):
    """Old head -> joiner: an update of keys the joiner will hold, applied after the join began; sent
    before it goes down the chain, so the joiner holds whatever a replica holds."""
    kind: ClassVar[str] = "delta"
    tag: Tag
    clock: int
    keys: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class CopyBack(Message):
    """Joiner -> old head (``replicas = 0``): a new-ring update of keys it took over, so a worker that has
    not switched yet still reads it at the old head."""
    kind: ClassVar[str] = "back"
    keys: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Switch(Message):
    """Joiner -> workers: every snapshot is in; slice new requests with the new ring."""
    kind: ClassVar[str] = "switch"


@dataclass(frozen=True)
class Switched(Message):
    """Worker -> every live server but the joiner: I use the new ring; links are FIFO, so you have seen my
    last old-ring request."""
    kind: ClassVar[str] = "switched"
    worker: int


@dataclass(frozen=True)
class HandoffDone(Message):
    """Server -> joiner: every worker has switched (or finished); the joiner may answer reads once all have."""
    kind: ClassVar[str] = "handoff_done"
    server: int


@dataclass(frozen=True)
class JoinAbort(Message):
    """Joiner -> every live server and worker: a range was lost before the switch; the old ring carries on."""
    kind: ClassVar[str] = "join_abort"


@dataclass(frozen=True)
class Bye(Message):
    """Server -> joiner, at the end: I have finished, so every delta I sent is in."""
    kind: ClassVar[str] = "bye"
    server: int


# ---------------------------------------------------------------------------- the scheduler (:mod:`.scheduler`)
@dataclass(frozen=True)
class NextTask(Message):
    """Worker -> scheduler: give me a block of data; the answer is a task id, or None when all are done."""
    kind: ClassVar[str] = "next"


@dataclass(frozen=True)
class TaskFinished(Message):
    """Worker -> scheduler: I trained on block ``task`` (its updates are acknowledged)."""
    kind: ClassVar[str] = "finished"
    task: int


MESSAGE_TYPES: tuple[type[Message], ...] = tuple(_BY_KIND.values())


# ---------------------------------------------------------------------------- the wire
def _as_tuple(record) -> tuple:
    return tuple(getattr(record, f.name) for f in fields(record))


def encode(msg: Message) -> tuple:
    """``msg`` as the tuple that travels: ``(kind, field, ...)``, records as plain tuples."""
    out: list = [msg.kind]
    for f in fields(msg):
        value = getattr(msg, f.name)
        out.append([_as_tuple(r) for r in value] if "record" in f.metadata else value)
    return tuple(out)


def decode(wire: tuple) -> Message:
    """The message that :func:`encode` turned into ``wire``."""
    kind = wire[0] if isinstance(wire, tuple) and wire else None
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownMessage(f"not a parameter-server message: {wire!r:.80} "
                             f"(known kinds: {', '.join(sorted(_BY_KIND))})")
    args = []
    for f, value in zip(fields(cls), wire[1:]):
        record = f.metadata.get("record")
        args.append(value if record is None else [record(*r) for r in value])
    return cls(*args)


def handler_for(handlers: Mapping[type, Callable], msg: Message, receiver: str) -> Callable:
    """The handler of ``msg`` in a receiver's dispatch table; a clear error naming it if there is none."""
    try:
        return handlers[type(msg)]
    except KeyError:
        known = ", ".join(t.__name__ for t in handlers)
        raise UnknownMessage(f"{receiver} has no handler for {type(msg).__name__} messages "
                             f"(it handles {known})") from None


__all__ = ["Tag", "UnknownMessage", "Slice", "RangeSum", "SliceValues", "Message", "SliceRequest", "Push", "Pull",
           "Forward", "Aggregate", "Ack", "Answer", "Clock", "Flush", "Done", "JoinRequest", "Precopy", "Delta",
           "CopyBack", "Switch", "Switched", "HandoffDone", "JoinAbort", "Bye", "NextTask", "TaskFinished",
           "MESSAGE_TYPES", "encode", "decode", "handler_for"]
