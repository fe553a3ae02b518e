"""What a run tells you: traffic per link (Stats) and a timeline of phases (Timeline)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

KINDS = ("compute", "send", "recv", "wait")


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

    @property
    def span(self) -> float:
        return max((e.end for e in self), default=0.0) - min((e.start for e in self), default=0.0)


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
