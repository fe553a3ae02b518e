"""What a run tells you: traffic per link (Stats) and a timeline of phases (Timeline).

The four kinds of phase a rank is traced in:

* ``compute``: a block the program marked with ``with comm.compute(label):`` (its label kept);
* ``send``: bytes being written into a Pipe, or the emulated link transmitting them;
* ``recv``: bytes being read out of a Pipe;
* ``wait``: blocked on another rank: a receive before the message's bytes arrive (or, on the
  emulated network, before its delivery time), a barrier, and a send blocked because its
  receiver does not read (label ``"receiver"``: the Pipe is full).

Within one thread the events never overlap. A rank with several threads (``isend``/``sendrecv``
send from a background thread) can be in two phases at once: :meth:`Timeline.exclusive` puts each
instant of a rank's run in exactly one kind, which is what plots and shares of the run use.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

KINDS = ("compute", "send", "recv", "wait")
#: Which kind an instant belongs to when a rank's threads overlap: work first, waiting last.
PRIORITY = ("compute", "recv", "send", "wait")


class Event(NamedTuple):
    """One traced phase of one rank; times are seconds since the run started."""

    rank: int
    kind: str  # "compute" | "send" | "recv" | "wait"
    start: float
    end: float
    label: str = ""
    peer: int = -1  # the other rank of a send/recv/wait, -1 otherwise
    nbytes: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


class Stats:
    """Payload bytes and message counts per directed link ``src -> dst``.

    ``bytes[i, j]`` counts what rank i sent to rank j (arrays count ``nbytes``,
    other objects their pickle plus out-of-band buffers). Framing headers are
    counted apart, in ``header_bytes``, so textbook formulas can be checked exactly.
    """

    def __init__(self, size: int):
        self.size = size
        self.bytes = np.zeros((size, size), dtype=np.int64)
        self.messages = np.zeros((size, size), dtype=np.int64)
        self.header_bytes = np.zeros((size, size), dtype=np.int64)

    def record(self, src: int, dst: int, payload: int, header: int = 0) -> None:
        self.bytes[src, dst] += payload
        self.messages[src, dst] += 1
        self.header_bytes[src, dst] += header

    def merge(self, other: "Stats") -> None:
        self.bytes += other.bytes
        self.messages += other.messages
        self.header_bytes += other.header_bytes

    def bytes_sent(self, rank: int) -> int:
        return int(self.bytes[rank].sum())

    def bytes_received(self, rank: int) -> int:
        return int(self.bytes[:, rank].sum())

    def messages_sent(self, rank: int) -> int:
        return int(self.messages[rank].sum())

    def messages_received(self, rank: int) -> int:
        return int(self.messages[:, rank].sum())

    @property
    def total_bytes(self) -> int:
        return int(self.bytes.sum())

    @property
    def total_messages(self) -> int:
        return int(self.messages.sum())

    def copy(self) -> "Stats":
        out = Stats(self.size)
        out.merge(self)
        return out

    def __sub__(self, other: "Stats") -> "Stats":
        out = self.copy()
        out.bytes -= other.bytes
        out.messages -= other.messages
        out.header_bytes -= other.header_bytes
        return out

    def table(self) -> str:
        """A readable per-rank summary."""
        lines = [f"{'rank':>4} {'sent B':>12} {'recv B':>12} {'msgs out':>9} {'msgs in':>8}"]
        for r in range(self.size):
            lines.append(
                f"{r:>4} {self.bytes_sent(r):>12,} {self.bytes_received(r):>12,} "
                f"{self.messages_sent(r):>9} {self.messages_received(r):>8}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Stats(size={self.size}, total_bytes={self.total_bytes}, total_messages={self.total_messages})"


class Timeline(list):
    """A list of :class:`Event`, sorted by start time, with small query helpers."""

    def __init__(self, events: Iterable[Event] = ()):
        super().__init__(sorted(events, key=lambda e: (e.start, e.rank)))

    def of(self, rank: int | None = None, kind: str | None = None) -> "Timeline":
        return Timeline(e for e in self if (rank is None or e.rank == rank) and (kind is None or e.kind == kind))

    def total(self, kind: str, rank: int | None = None) -> float:
        """Seconds spent in phases of ``kind`` (by one rank, or summed over ranks)."""
        return float(sum(e.duration for e in self.of(rank, kind)))

    def exclusive(self, priority=PRIORITY) -> "Timeline":
        """The same run with each instant of a rank's run in exactly one kind.

        Where a rank's threads overlap (say its main thread waits for a message while a
        background thread sends), the instant goes to the first kind in ``priority``
        (work before waiting: compute, recv, send, wait), and, within a kind, to the event that
        started first. Events are clipped or split to what is left of them; a piece keeps its
        label and peer, the first piece its bytes. So for every rank,
        ``sum(t.total(kind, rank) for kind in KINDS)`` is at most the rank's traced span, and
        equals the union of its phases. (The events themselves stay as traced; the overlap of
        communication and computation that lesson 08 measures is read from them.)
        """
        rank_of = {kind: i for i, kind in enumerate(priority)}
        out: list[Event] = []
        for rank in sorted({e.rank for e in self}):
            taken: list[list[float]] = []  # sorted, disjoint [start, end] spans already given to a kind
            mine = sorted((e for e in self if e.rank == rank),
                          key=lambda e: (rank_of.get(e.kind, len(priority)), e.start, e.end))
            for e in mine:
                first = True
                for a, b in _uncovered(taken, e.start, e.end):
                    out.append(e._replace(start=a, end=b, nbytes=e.nbytes if first else 0))
                    first = False
                _claim(taken, e.start, e.end)
        return Timeline(out)

    def busy(self, rank: int) -> float:
        """Seconds of ``rank``'s run covered by some phase (the union of its events)."""
        spans: list[list[float]] = []
        for e in self.of(rank):
            _claim(spans, e.start, e.end)
        return float(sum(b - a for a, b in spans))

    @property
    def span(self) -> float:
        return max((e.end for e in self), default=0.0) - min((e.start for e in self), default=0.0)


def _uncovered(taken: list, start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end] outside the sorted disjoint spans ``taken``.

    A zero-length phase is kept unless it lies strictly inside a taken span.
    """
    if end <= start:
        i = bisect.bisect_right(taken, [start, float("inf")]) - 1
        inside = i >= 0 and taken[i][0] < start < taken[i][1]
        return [] if inside else [(start, end)]
    pieces, cursor = [], start
    i = max(0, bisect.bisect_right(taken, [start, float("inf")]) - 1)
    while i < len(taken) and taken[i][0] < end:
        a, b = taken[i]
        if b > cursor:
            if a > cursor:
                pieces.append((cursor, a))
            cursor = max(cursor, b)
        i += 1
    if cursor < end:
        pieces.append((cursor, end))
    return pieces


def _claim(taken: list, start: float, end: float) -> None:
    """Add [start, end] to the sorted disjoint spans ``taken``, merging what it touches."""
    if end <= start:
        return
    i = bisect.bisect_left(taken, [start, start])
    if i > 0 and taken[i - 1][1] >= start:
        i -= 1
    j = i
    while j < len(taken) and taken[j][0] <= end:
        start, end = min(start, taken[j][0]), max(end, taken[j][1])
        j += 1
    taken[i:j] = [[start, end]]


@dataclass
class Tracer:
    """Per-rank recorder used inside a worker."""

    rank: int
    t0: float
    enabled: bool = True

    def __post_init__(self):
        self.events: list[Event] = []

    def add(self, kind: str, start: float, end: float, label: str = "", peer: int = -1, nbytes: int = 0) -> None:
        if self.enabled:
            self.events.append(Event(self.rank, kind, start - self.t0, end - self.t0, label, peer, nbytes))
