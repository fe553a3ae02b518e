"""The key-value server of the parameter server (ps-lite's KVServer; ps-lite is the open-source implementation
of the design of Li et al., OSDI 2014): its store, its message
handlers and its read gate.

A server holds ``store[key]`` for every key (it answers only for the ranges it is in the chain
of). It receives one message at a time and hands it to the handler that its dispatch table
:attr:`Server.HANDLERS` names for the message's type. After each message it answers the pulls
that the bounded-delay gate lets through (:func:`.consistency.may_answer_pull`).

Writes follow the model: with ``tau = 0`` (sequential) an update of iteration ``c`` is staged
until every worker has finished iteration ``c``, so a read at clock ``t`` sees exactly the
iterations before ``t``. Otherwise it is applied at once, with the updater of ``cfg.updater``:
``w += v`` (sum) or the proximal l1 step ``w <- soft(w - eta v, eta lam)``, with
``soft(x, t) = sign(x) max(|x| - t, 0)`` (a user-defined function on the server, the paper's section 3.3).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, ClassVar

import numpy as np

from course_lib.runtime.comm import PeerLost

from .config import PSConfig
from .consistency import INF, Read, may_answer_pull
from .filters import soft_threshold
from .join import JoinSide, check_config
from .messages import (
    Ack,
    Aggregate,
    Answer,
    Bye,
    Clock,
    CopyBack,
    Delta,
    Done,
    Flush,
    Forward,
    HandoffDone,
    JoinAbort,
    JoinRequest,
    Message,
    Precopy,
    Pull,
    Push,
    Slice,
    SliceRequest,
    SliceValues,
    Switched,
    Tag,
    decode,
    encode,
    handler_for,
)
from .payload import ReceivedKeyLists, pack, unpack
from .replication import Replicator, successor
from .vclock import RangeClock


@dataclass(frozen=True)
class DeferredPull:
    """A pull waiting for the read gate (its key lists already resolved)."""
    pull: Pull
    arrived: float


class Server:
    """Server rank ``comm.rank``: ``Server(comm, cfg).run()`` serves until every worker is done."""

    def __init__(self, comm, cfg: PSConfig):
        check_config(cfg)
        if cfg.replicate == "aggregate" and cfg.replicas > 1:
            raise ValueError("replicate='aggregate' is supported with replicas <= 1")
        self.comm, self.cfg, self.me = comm, cfg, comm.rank
        self.rings = cfg.rings()
        W = cfg.n_workers
        self.store = np.zeros((cfg.n_keys, cfg.val_len))
        self.clocks = np.zeros(W)              # latest clock heard from each worker (INF once done)
        self.done = np.zeros(W, dtype=bool)
        self.dead: set[int] = set()
        self.applied: set[Tag] = set()         # tags of the updates in the store (a re-sent one is applied once)
        self.deferred: list[DeferredPull] = []
        self.reads: list[Read] = []
        self.staged: dict[int, list] = {}      # tau = 0: iteration -> updates (keys, values) not yet visible
        self.key_lists = ReceivedKeyLists()
        self.vclock = RangeClock(cfg.n_keys, W)
        self.clock_ticks = 0
        self.n_push = self.n_dup = 0
        self.replicator = Replicator(self)
        self.join = JoinSide(self, cfg, self.rings)

    # -- the loop
    def run(self) -> dict:
        """Serve until every worker is done (and, for a joiner, every server has said bye)."""
        self.join.on_clock(self.clocks)
        while not self.join.may_exit(self.done.all()):
            try:
                msg = self._next_message()
            except PeerLost as exc:
                if exc.rank < 0:               # no live neighbour left
                    break
                self._peer_died(exc.rank)
            else:
                if msg is None:
                    continue
                handler_for(self.HANDLERS, msg, f"server {self.me}")(self, msg)
            self._answer_pulls()
        self._release_staged()
        self.join.bye()
        return {"rank": self.me, "store": self.store, "reads": self.reads, "clocks": self.clocks,
                "n_push": self.n_push, "n_dup": self.n_dup, "n_fwd": self.replicator.n_forwarded,
                "vclock_segments": len(self.vclock), "vclock": self.vclock.segments,
                "dead_seen": sorted(self.dead), "join": self.join.stats}

    def _next_message(self) -> Message | None:
        """The next message; None if a snapshot chunk went out and nothing is waiting yet."""
        if self.join.streaming():              # a joiner's snapshot goes out one chunk between two messages
            self.join.send_chunk()
            if not self.comm.iprobe():
                return None
        _, wire = self.comm.recv_any()
        return decode(wire)

    def send(self, msg: Message, dest: int) -> bool:
        """Send ``msg``; False (and the peer is dead to us) if ``dest`` has died."""
        try:
            self.comm.send(encode(msg), dest)
            return True
        except PeerLost:
            self._peer_died(dest)
            return False

    def _peer_died(self, rank: int) -> None:
        if rank in self.dead:
            return
        self.dead.add(rank)
        if rank < self.cfg.n_servers:          # if it was our successor, we are the tail of what we sent it
            self.replicator.successor_died(rank)
            self.join.on_peer_died(rank)
        elif rank < self.cfg.n_servers + self.cfg.n_workers:    # a dead worker holds no one back
            self.done[rank - self.cfg.n_servers] = True
            self.clocks[rank - self.cfg.n_servers] = INF
            self.join.check_handoff()

    # -- messages from workers
    def on_push(self, msg: Push) -> None:
        push = replace(msg, slices=self._readable(msg))
        with self.comm.compute("apply"):       # faults fire here: a server dies between two pushes
            self._apply(push, from_worker=True)

    def on_forward(self, msg: Forward) -> None:
        with self.comm.compute("apply"):
            self._apply(msg, from_worker=False)

    def on_pull(self, msg: Pull) -> None:
        self.deferred.append(DeferredPull(replace(msg, slices=self._readable(msg)), time.perf_counter()))

    def on_clock(self, msg: Clock) -> None:
        self.clocks[msg.worker] = max(self.clocks[msg.worker], msg.clock)
        self.join.on_clock(self.clocks)
        self.clock_ticks += 1
        if self.replicator.aggregating and self.clock_ticks % (self.cfg.aggregate_every or self.cfg.n_workers) == 0:
            self.replicator.flush()

    def on_flush(self, msg: Flush) -> None:
        self.replicator.flush()

    def on_aggregate(self, msg: Aggregate) -> None:
        with self.comm.compute("apply"):
            self.replicator.apply_aggregate(msg.sums)

    def on_done(self, msg: Done) -> None:
        self.done[msg.worker] = True
        self.clocks[msg.worker] = INF
        if self.replicator.aggregating:
            self.replicator.flush()
        self.join.check_handoff()

    # -- a server joins (:mod:`.join`); each step is a labelled compute phase, so a test can fail it
    def on_join_request(self, msg: JoinRequest) -> None:
        with self.comm.compute("join_req"):
            self.join.on_join_req(msg.keys)

    def on_precopy(self, msg: Precopy) -> None:
        with self.comm.compute("precopy"):
            self.join.on_precopy(msg.server, msg.keys, msg.values, msg.tags, msg.last)

    def on_delta(self, msg: Delta) -> None:
        self.join.on_delta(msg.tag, msg.clock, msg.keys, msg.values)

    def on_copy_back(self, msg: CopyBack) -> None:
        self._update(msg.keys, msg.values)

    def on_switched(self, msg: Switched) -> None:
        with self.comm.compute("switched"):
            self.join.on_switched(msg.worker)

    def on_handoff_done(self, msg: HandoffDone) -> None:
        self.join.handed.add(msg.server)

    def on_join_abort(self, msg: JoinAbort) -> None:
        self.join.on_abort()

    def on_bye(self, msg: Bye) -> None:
        self.join.byes.add(msg.server)

    HANDLERS: ClassVar[dict[type[Message], Callable[[Server, Message], None]]] = {
        Push: on_push, Forward: on_forward, Pull: on_pull, Clock: on_clock, Flush: on_flush,
        Aggregate: on_aggregate, Done: on_done, JoinRequest: on_join_request, Precopy: on_precopy,
        Delta: on_delta, CopyBack: on_copy_back, Switched: on_switched, HandoffDone: on_handoff_done,
        JoinAbort: on_join_abort, Bye: on_bye}

    # -- applying updates
    def _readable(self, msg: SliceRequest) -> list[Slice]:
        """The slices with their key lists (key caching sends a digest for a list sent before) and their
        values uncompressed."""
        slices = msg.slices
        if self.cfg.key_cache:
            slices = [self.key_lists.restore(msg.worker, s) for s in slices]
        if self.cfg.compress and isinstance(msg, Push):
            slices = [replace(s, values=unpack(s.values)) for s in slices]
        return slices

    def _apply(self, push: Push | Forward, from_worker: bool) -> None:
        """Apply the new slices of ``push``; pass each on down its chain; the tail acknowledges."""
        ring = self.rings[push.epoch]
        onward: dict[int, list[Slice]] = {}
        tail_of: list[int] = []
        for s in push.slices:
            chain = ring.chain(s.arc, self.cfg.replicas, self.dead)
            self._apply_slice(push, s, chain, from_worker)
            nxt = successor(chain, self.me)
            if nxt is None:
                tail_of.append(s.pid)
            else:
                onward.setdefault(nxt, []).append(s)
        tail_of += self.replicator.pass_on(push, onward)
        if tail_of:
            self.send(Ack(push.ts, tail_of), self.cfg.worker_rank(push.worker))

    def _apply_slice(self, push: Push | Forward, s: Slice, chain: list[int], from_worker: bool) -> None:
        tag = (push.worker, push.ts, s.pid)
        if tag in self.applied:
            self.n_dup += 1
            return
        self.applied.add(tag)
        self.n_push += 1
        values = s.values.reshape(-1, self.cfg.val_len)
        if from_worker:                        # we act as its head; a joiner hears of it before the chain does
            self.join.after_apply(tag, push.clock, s.keys, values, push.epoch, chain)
        self.write(s.keys, values, push.clock)
        self.replicator.note_applied(tag, s.arc, s.keys, values, push.epoch)
        if s.keys.size:
            self.vclock.update(int(s.keys[0]), int(s.keys[-1]) + 1, push.worker, push.clock + 1)

    def write(self, keys: np.ndarray, values: np.ndarray, clock: int) -> None:
        """Apply an update of iteration ``clock``, or stage it (sequential model) until every worker is past it."""
        if self.cfg.tau == 0 and clock >= np.min(self.clocks):
            self.staged.setdefault(clock, []).append((keys, values))
        else:
            self._update(keys, values)

    def _update(self, keys: np.ndarray, values: np.ndarray) -> None:
        if self.cfg.updater == "l1":
            self.store[keys] = soft_threshold(self.store[keys] - self.cfg.eta * values, self.cfg.eta * self.cfg.lam)
        else:
            self.store[keys] += values

    def _release_staged(self) -> None:
        """Apply the staged updates of every iteration that all workers have finished."""
        slowest = np.min(self.clocks) if self.cfg.n_workers else INF
        for clock in sorted(self.staged):
            if clock < slowest:
                for keys, values in self.staged.pop(clock):
                    self._update(keys, values)

    # -- answering reads
    def _answer_pulls(self) -> None:
        """Answer every deferred pull that the read gate lets through now."""
        self._release_staged()
        if not self.join.reads_allowed():
            return                             # a joiner answers reads once it holds every change
        heard = self.clocks.tolist()           # the clocks as they are now: a death below re-opens nothing this pass
        slowest = min(heard, default=INF)
        waiting = []
        for deferred in self.deferred:
            if may_answer_pull(deferred.pull.clock, heard, self.cfg.tau):
                self._answer(deferred, slowest)
            else:
                waiting.append(deferred)
        self.deferred[:] = waiting

    def _answer(self, deferred: DeferredPull, slowest: float) -> None:
        pull = deferred.pull
        self.reads.append(Read(pull.worker, pull.clock, slowest, time.perf_counter() - deferred.arrived))
        # indexing by a key array copies, so the answer does not change with the store after it is sent
        answers = [SliceValues(s.pid, pack(self.store[s.keys].ravel(), self.cfg.compress)) for s in pull.slices]
        self.send(Answer(pull.ts, answers), self.cfg.worker_rank(pull.worker))


def serve(comm, cfg: PSConfig) -> dict:
    """Server loop of rank ``comm.rank``; returns its store and what it recorded."""
    return Server(comm, cfg).run()


__all__ = ["Server", "serve", "DeferredPull"]
