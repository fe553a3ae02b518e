"""Chain replication of pushes, seen from one server (Li et al., OSDI 2014, section 4.4,
after van Renesse and Schneider 2004).

A key range lives on a *chain*: its owner in the ring (the head) and the next ``replicas``
distinct live servers. A push goes to the head, each member applies it and sends it on to its
successor (:class:`.messages.Forward`), and the *tail* acknowledges it to the worker, so an
acknowledged update is on every replica. When a successor dies its predecessor is the tail of
what it had sent it, and acknowledges that (duplicate acknowledgements are harmless: the
worker ignores an answer to a request that is complete).

With ``replicate="aggregate"`` a head buffers what it would forward and sends its successor, every
``aggregate_every`` clock ticks, one summed update per range (:class:`.messages.Aggregate`): fewer
and smaller messages, later acknowledgements (the paper's replication after aggregation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .config import PSConfig
from .messages import Ack, Aggregate, Forward, Message, Push, RangeSum, Slice, Tag


class ChainMember(Protocol):
    """What replication needs of the server process it runs in (:class:`.kv_server.Server`)."""
    cfg: PSConfig
    me: int                    # this server's rank
    rings: tuple               # the ring of each epoch
    dead: set[int]             # ranks known dead
    applied: set[Tag]          # tags of the updates in the store

    def send(self, msg: Message, dest: int) -> bool: ...

    def write(self, keys: np.ndarray, values: np.ndarray, clock: int) -> None: ...


def successor(chain: list[int], me: int) -> int | None:
    """The server after ``me`` in ``chain``; None if ``me`` is its tail (or not in it)."""
    if me not in chain:
        return None
    i = chain.index(me) + 1
    return chain[i] if i < len(chain) else None


@dataclass(frozen=True)
class BufferedUpdate:
    """One slice of a push that a head holds for its successor until the next aggregate."""
    worker: int
    ts: int
    clock: int
    slice: Slice

    @property
    def tag(self) -> Tag:
        return (self.worker, self.ts, self.slice.pid)


def sum_by_range(updates: list[BufferedUpdate], val_len: int) -> list[RangeSum]:
    """The buffered updates summed per key range: ``total[k] = sum of the values pushed to key k``."""
    by_arc: dict[int, list[BufferedUpdate]] = {}
    for u in updates:
        by_arc.setdefault(u.slice.arc, []).append(u)
    sums = []
    for arc, group in by_arc.items():
        keys, where = np.unique(np.concatenate([u.slice.keys for u in group]), return_inverse=True)
        total = np.zeros((len(keys), val_len))
        np.add.at(total, where, np.concatenate([np.asarray(u.slice.values).reshape(-1, val_len) for u in group]))
        sums.append(RangeSum(arc, keys, total, [u.tag for u in group], max(u.clock for u in group)))
    return sums


class Replicator:
    """What one server sends down its chains, and the acknowledgements it owes for it."""

    def __init__(self, server: ChainMember):
        self.server = server
        self.aggregating = server.cfg.replicate == "aggregate"
        self.forwarded: dict[int, list[Tag]] = {}                 # successor -> tags sent to it
        self.buffered: dict[int, list[BufferedUpdate]] = {}       # successor -> updates for its next aggregate
        # aggregating: tags applied here as a stand-in head (the ring's head was dead to the worker), which
        # an aggregate from the real head may bring again
        self.applied_directly: dict[Tag, tuple[np.ndarray, np.ndarray]] = {}
        self.n_forwarded = 0

    def note_applied(self, tag: Tag, arc: int, keys: np.ndarray, values: np.ndarray, epoch: int) -> None:
        """Remember an update that came here straight from a worker although we do not head its range."""
        if self.aggregating and self.server.rings[epoch].chain(arc, self.server.cfg.replicas)[0] != self.server.me:
            self.applied_directly[tag] = (keys, values)

    def pass_on(self, push: Push | Forward, onward: dict[int, list[Slice]]) -> list[int]:
        """Send each successor its slices of ``push`` (or buffer them for the next aggregate).

        Returns the slice ids we are now the tail of, because their successor died."""
        tail_of: list[int] = []
        for dest, slices in onward.items():
            if self.aggregating:        # replicate after aggregation: acknowledged at the next flush
                self.buffered.setdefault(dest, []).extend(
                    BufferedUpdate(push.worker, push.ts, push.clock, s) for s in slices)
            elif self.server.send(Forward(push.worker, push.ts, push.clock, slices, push.epoch), dest):
                self.n_forwarded += 1
                self.forwarded.setdefault(dest, []).extend((push.worker, push.ts, s.pid) for s in slices)
            else:
                tail_of += self.reroute(push.worker, push.ts, push.clock, slices, push.epoch)
        return tail_of

    def reroute(self, worker: int, ts: int, clock: int, slices: list[Slice], epoch: int) -> list[int]:
        """Send each slice to our successor in the chain of the live servers, one by one, skipping the dead;
        the ids of the slices we are the tail of come back."""
        tail_of: list[int] = []
        for s in slices:
            nxt = successor(self.server.rings[epoch].chain(s.arc, self.server.cfg.replicas, self.server.dead),
                            self.server.me)
            if nxt is None:
                tail_of.append(s.pid)
            elif self.server.send(Forward(worker, ts, clock, [s], epoch), nxt):
                self.forwarded.setdefault(nxt, []).append((worker, ts, s.pid))
            else:                       # it died too: try the next one
                tail_of += self.reroute(worker, ts, clock, [s], epoch)
        return tail_of

    def flush(self) -> None:
        """Send each successor the sum of the updates buffered for it, one entry per key range."""
        for dest in list(self.buffered):
            updates = self.buffered.pop(dest)
            sums = sum_by_range(updates, self.server.cfg.val_len)
            if self.server.send(Aggregate(sums), dest):
                self.n_forwarded += 1
                self.forwarded.setdefault(dest, []).extend(tag for s in sums for tag in s.tags)
                continue
            for u in updates:           # it died before we sent: we are the tail now (no join: epoch 0)
                for pid in self.reroute(u.worker, u.ts, u.clock, [u.slice], 0):
                    self.server.send(Ack(u.ts, [pid]), self.server.cfg.worker_rank(u.worker))

    def apply_aggregate(self, sums: list[RangeSum]) -> None:
        """A successor applies a summed batch once; updates it already got directly are taken back out.
        With ``replicas <= 1`` the successor is the tail: it acknowledges every update in the batch."""
        server = self.server
        acks: dict[tuple[int, int], list[int]] = {}
        for s in sums:
            server.write(s.keys, s.total, s.clock)
            for tag in s.tags:
                if tag in server.applied and tag in self.applied_directly:   # re-sent to us after a failure
                    keys, values = self.applied_directly.pop(tag)
                    server.write(keys, -values, s.clock)
                server.applied.add(tag)
            for worker, ts, pid in s.tags:
                acks.setdefault((worker, ts), []).append(pid)
        self._acknowledge(acks)

    def successor_died(self, dead: int) -> None:
        """We are the tail of everything we sent (or meant to send) ``dead``: acknowledge it."""
        acks: dict[tuple[int, int], list[int]] = {}
        for u in self.buffered.pop(dead, []):
            acks.setdefault((u.worker, u.ts), []).append(u.slice.pid)
        for worker, ts, pid in self.forwarded.pop(dead, []):
            acks.setdefault((worker, ts), []).append(pid)
        self._acknowledge(acks)

    def _acknowledge(self, acks: dict[tuple[int, int], list[int]]) -> None:
        for (worker, ts), pids in acks.items():
            self.server.send(Ack(ts, pids), self.server.cfg.worker_rank(worker))


__all__ = ["Replicator", "ChainMember", "BufferedUpdate", "successor", "sum_by_range"]
