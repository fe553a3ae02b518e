"""The worker side of the parameter server: ``push``, ``pull`` and ``wait`` over key ranges (ps-lite style).

ps-lite is the open-source implementation of the design of Li et al. (OSDI 2014); range push and
pull are the paper's section 3.2.

Non-blocking, as in ps-lite::

    ts = kv.push(keys, values)   # sorted distinct keys; sliced by range; returns a timestamp
    ts = kv.pull(keys)
    vals = kv.wait(ts)           # block until every slice of request ts is answered
    ts = kv.pull(keys, after=[push_ts])   # a task that depends on an earlier one (:mod:`.tasks`)
    kv.advance()                 # finished one iteration: tell every server my new clock

A request is cut into one slice per key range and each slice goes to the head of its range's
chain. When a server dies (``PeerLost``) the worker re-sends every unanswered slice to the new
head; the servers apply a re-sent update once (they remember its tag).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar

import numpy as np

from course_lib.runtime.comm import PeerLost

from .config import PSConfig
from .keys import check_request, slice_request
from .messages import (
    Ack,
    Answer,
    Clock,
    Done,
    Flush,
    JoinAbort,
    Message,
    Pull,
    Push,
    Slice,
    Switch,
    Switched,
    decode,
    encode,
    handler_for,
)
from .payload import SentKeyLists, pack, unpack


@dataclass
class PendingRequest:
    """A push or pull sent and not yet complete."""
    message_type: type[Push] | type[Pull]
    slices: list[Slice]
    todo: set[int]                   # slice ids not answered (pull) or acknowledged (push) yet
    epoch: int                       # the ring its arcs refer to
    answers: dict[int, np.ndarray] = field(default_factory=dict)   # pull: slice id -> values


class KVWorker:
    """The worker side: ``push``, ``pull``, ``wait`` over key ranges (one per worker rank)."""

    def __init__(self, comm, cfg: PSConfig):
        self.comm, self.cfg = comm, cfg
        self.w = comm.rank - cfg.n_servers
        self.rings = cfg.rings()
        self.epoch = 0               # 1 once a joining server has told us to use the new ring
        self.join_aborted = False
        self.clock = 0
        self.dead: set[int] = set()
        self.pending: dict[int, PendingRequest] = {}
        self.next_ts = 0
        self.wait_time = 0.0
        self.resent = 0
        self.key_lists = SentKeyLists()
        self.log: list = []          # every push (keys, values): the update sequence, for replay

    # -- API
    def push(self, keys, values, after=()) -> int:
        """Send ``values`` to be added to ``keys``; ``after``: timestamps it depends on (see :meth:`pull`)."""
        self.wait_for(after)
        return self._request(Push, keys, values)

    def pull(self, keys, after=()) -> int:
        """Ask for the values of ``keys``. ``after``: timestamps of earlier requests this one depends on
        (Li et al., OSDI 2014, section 3.4, asynchronous tasks and dependency): it is sent once they
        are complete. This worker has one thread, which makes progress only while it waits, so it
        waits for them here."""
        self.wait_for(after)
        return self._request(Pull, keys)

    def wait_for(self, timestamps) -> None:
        """Block until every request of ``timestamps`` is complete (their pull values are dropped)."""
        for ts in timestamps:
            self.wait(ts)

    def wait(self, ts):
        """Block until request ``ts`` is complete; a pull returns its values in key order."""
        start = time.perf_counter()
        while ts in self.pending and self.pending[ts].todo:
            self._handle_one(ts)
        self.wait_time += time.perf_counter() - start
        req = self.pending.pop(ts, None)
        if req is None or req.message_type is Push:
            return None
        parts = [req.answers[s.pid] for s in req.slices]
        return np.concatenate(parts) if parts else np.zeros(0)

    def wait_all(self):
        """Block until every request sent so far is complete."""
        if self.cfg.replicate == "aggregate" and self.pending:
            self._tell_servers(Flush())          # ask heads to replicate what they hold, so acks come
        for ts in sorted(self.pending):
            self.wait(ts)

    def advance(self):
        """Finished an iteration: the clock goes up and every live server hears it."""
        self.clock += 1
        self._tell_servers(Clock(self.w, self.clock))

    def finish(self):
        """Wait for every request, then tell every live server that we will send nothing more."""
        self.wait_all()
        self._tell_servers(Done(self.w))

    @property
    def join_settled(self) -> bool:
        """No join, or it ended: we switched to the new ring, or it was abandoned, or the joiner died."""
        J = self.cfg.joiner
        return J < 0 or self.epoch == 1 or self.join_aborted or J in self.dead

    # -- sending
    def _request(self, message_type: type[Push] | type[Pull], keys, values=None) -> int:
        keys, values = check_request(keys, values, self.cfg.n_keys, self.cfg.val_len)
        ring = self.rings[self.epoch]
        slices = [Slice(pid, arc, k, v)
                  for pid, (arc, k, v) in enumerate(slice_request(ring.points, keys, values, self.cfg.val_len))]
        ts = self.next_ts
        self.next_ts += 1
        self.pending[ts] = PendingRequest(message_type, slices, {s.pid for s in slices}, self.epoch)
        if message_type is Push:
            self.log.append((keys, values))
        self._send_slices(message_type, ts, slices, self.epoch)
        return ts

    def _head(self, arc: int, epoch: int) -> int:
        chain = self.rings[epoch].chain(arc, self.cfg.replicas, self.dead)
        if not chain:
            raise RuntimeError(f"worker {self.w}: every replica of key range {arc} is dead "
                               f"(replicas={self.cfg.replicas}, dead servers {sorted(self.dead)})")
        return chain[0]

    def _send_slices(self, message_type: type[Push] | type[Pull], ts: int, slices: list[Slice], epoch: int):
        """One message per head server, with the slices of the ranges it heads."""
        by_server: dict[int, list[Slice]] = {}
        for s in slices:
            by_server.setdefault(self._head(s.arc, epoch), []).append(s)
        for server, mine in by_server.items():
            if self.cfg.key_cache:
                mine = [self.key_lists.shorten(server, s) for s in mine]
            if self.cfg.compress:
                mine = [replace(s, values=pack(s.values, True)) for s in mine]
            try:
                self.comm.send(encode(message_type(self.w, ts, self.clock, mine, epoch)), server)
            except PeerLost:
                self._lost(server)       # re-sends everything unanswered, these slices included
                return

    def _tell_servers(self, msg: Message, skip: int = -1) -> None:
        """Send ``msg`` to every live server (but ``skip``)."""
        for server in range(self.cfg.n_servers):
            if server != skip and server not in self.dead:
                try:
                    self.comm.send(encode(msg), server)
                except PeerLost:
                    self._lost(server)

    def _lost(self, server: int) -> None:
        """A server died: re-send every unanswered slice, to the next live server of its chain."""
        if server in self.dead:
            return
        self.dead.add(server)
        for ts, req in list(self.pending.items()):
            again = [s for s in req.slices if s.pid in req.todo]
            if again:
                self.resent += len(again)
                self._send_slices(req.message_type, ts, again, req.epoch)

    # -- receiving
    def _handle_one(self, ts=None) -> None:
        try:
            _, wire = self.comm.recv_any()
        except PeerLost as exc:
            if exc.rank < 0 or exc.rank == self.cfg.scheduler_rank:
                raise RuntimeError(f"worker {self.w}: lost rank {exc.rank} while waiting for request {ts}") from exc
            if exc.rank < self.cfg.n_servers:  # another worker's death is not our business
                self._lost(exc.rank)
            return
        msg = decode(wire)
        handler_for(self.HANDLERS, msg, f"worker {self.w}")(self, msg)

    def on_ack(self, msg: Ack) -> None:
        req = self.pending.get(msg.ts)
        if req is not None:                  # else a late duplicate
            req.todo -= set(msg.pids)

    def on_answer(self, msg: Answer) -> None:
        req = self.pending.get(msg.ts)
        if req is None:
            return                           # a late duplicate
        for s in msg.slices:
            if s.pid in req.todo:
                req.answers[s.pid] = unpack(s.values)
                req.todo.discard(s.pid)

    def on_switch(self, msg: Switch) -> None:
        """A server joined: slice new requests with the new ring, and tell the others (not the joiner)."""
        self.epoch = 1
        self._tell_servers(Switched(self.w), skip=self.cfg.joiner)

    def on_join_abort(self, msg: JoinAbort) -> None:
        self.join_aborted = True

    HANDLERS: ClassVar[dict[type[Message], Callable[[KVWorker, Message], None]]] = {
        Ack: on_ack, Answer: on_answer, Switch: on_switch, JoinAbort: on_join_abort}


__all__ = ["KVWorker", "PendingRequest"]
