"""A server joins the ring while training runs (Li et al., OSDI 2014, section 4.5, server management;
the ring itself is their section 4.3, consistent hashing).

Two rings: ``R0`` without the joiner ``J``, ``R1`` with it. Every request says which ring
(*epoch*) its worker sliced it with, so a server reads the key range of a slice in the right
ring. ``J`` will hold the keys of every ``R1`` chain it belongs to, as head or (with
``replicas > 0``) as a replica: the *moving* keys.

Phase 1, pre-copy
    When ``J`` hears a worker clock ``>= join_at`` it sends every live server a
    :class:`.messages.JoinRequest` naming the moving keys that server heads in ``R0`` (maybe
    none). A server that hears it has *started*. It streams a snapshot of those keys in chunks
    of ``cfg.precopy_chunk`` keys (:class:`.messages.Precopy`), one chunk between two messages
    it serves, so training goes on while it copies. Each chunk carries the tags
    ``(worker, ts, slice)`` of the updates applied since the previous chunk, so ``J`` knows
    which updates each chunk contains.
Phase 2, the changes made meanwhile
    A started server that applies an old-epoch update of a moving key as its head (it came
    straight from a worker) sends it to ``J`` (:class:`.messages.Delta`) *before* forwarding
    it down its chain, so whatever a replica holds, ``J`` holds too. ``J`` holds deltas back
    until the snapshots are in, then applies each one to the keys whose chunk was copied
    before the update (a key copied after it already has it).
Switch
    Once every live server has sent its last chunk, ``J`` applies the held deltas and tells
    the workers to use ``R1`` (:class:`.messages.Switch`). Each worker tells the servers
    (:class:`.messages.Switched`); links are FIFO, so a server has seen all of that worker's
    old-epoch requests when this arrives. A server whose workers have all switched (or
    finished) reports :class:`.messages.HandoffDone`; ``J`` answers reads only once every
    server has. Until then ``J`` copies its new-epoch updates of keys it now heads back to
    their old head if that head is not in the new chain (:class:`.messages.CopyBack`; only
    with ``replicas = 0``), so a worker that has not switched yet still reads them there.

Failures
    * A server dies before the switch: ``J`` abandons the join (:class:`.messages.JoinAbort`) and
      training goes on with ``R0`` and its replicas. ``J`` dying before the switch
      abandons it too.
    * After the switch every server had started, so a new head that takes over from a dead
      one sends its deltas as well (its re-sent updates are deduplicated by tag), and ``J``
      itself is an ordinary member of ``R1``: workers re-send to the next copy if it dies.

Limits (checked by :func:`check_config`): the summing updater (deltas arrive in any order),
``tau = inf`` (the bounded-delay gate would need clocks to order deltas and back-copies too),
and ``replicate="push"``.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .consistency import INF
from .messages import Bye, CopyBack, Delta, HandoffDone, JoinAbort, JoinRequest, Message, Precopy, Switch, Tag


def check_config(cfg) -> None:
    if cfg.joiner < 0:
        return
    if not 0 <= cfg.joiner < cfg.n_servers:
        raise ValueError(f"joiner must be a server rank 0..{cfg.n_servers - 1}, got {cfg.joiner}")
    if cfg.updater != "sum" or cfg.tau != INF or cfg.replicate != "push":
        raise ValueError("a joining server needs updater='sum', tau=INF and replicate='push' "
                         f"(got updater={cfg.updater!r}, tau={cfg.tau}, replicate={cfg.replicate!r})")


def moving_keys(cfg) -> np.ndarray:
    """Boolean mask over the key space: the keys the joiner holds in ``R1`` (head or replica)."""
    r1 = cfg.final_ring()
    holds = np.array([cfg.joiner in r1.chain(a, cfg.replicas) for a in range(len(r1.points))])
    return holds[r1.arcs(np.arange(cfg.n_keys))]


class ServerState(Protocol):
    """What the join needs of the server process it runs in (:class:`.kv_server.Server`)."""
    me: int                    # this server's rank
    store: np.ndarray          # (n_keys, val_len) parameters
    dead: set[int]             # ranks known dead
    done: np.ndarray           # per worker: finished (or dead)
    applied: set[Tag]          # tags of the updates in the store

    def send(self, msg: Message, dest: int) -> bool: ...

    def write(self, keys: np.ndarray, values: np.ndarray, clock: int) -> None: ...


class JoinSide:
    """What one server process does for the join, on the state of its ``server``."""

    def __init__(self, server: ServerState, cfg, rings):
        self.s, self.cfg, self.rings = server, cfg, rings
        self.J = cfg.joiner
        self.active = self.J >= 0
        self.is_joiner = server.me == self.J
        self.others = [r for r in range(cfg.n_servers) if r != self.J]
        if self.active:
            self.moving = moving_keys(cfg)
            self.joiner_heads = rings[1].lookup(np.arange(cfg.n_keys)) == self.J
            self.chunk_of = np.zeros(cfg.n_keys, dtype=np.int64)       # J: which chunk copied each key
            self.copied_from = np.full(cfg.n_keys, -1, dtype=np.int64)  # ... and from which server
        self.started = False        # this server has heard that the join began
        self.reported = False       # sent handoff_done
        self.switched: set = set()  # workers that use R1 now
        self.owed: set = set()      # J: servers whose last snapshot chunk has not come
        self.held: list = []        # J: deltas that came before the switch
        self.deltas_seen: set = set()  # J: tags of the deltas applied
        self.chunks: dict = {}      # J: server -> chunks received from it
        self.first_chunk: dict = {} # J: server -> {tag: first chunk of that server that contained it}
        self.outbox: list = []      # donor: snapshot chunks (keys) still to send
        self.sent_tags: set = set() # donor: tags already announced in a chunk
        self.handed: set = set()    # J: servers whose workers have all switched
        self.byes: set = set()      # J: servers that have finished (all their deltas are in)
        self.stats = {"requested": False, "switched": False, "aborted": False, "precopy_keys": 0,
                      "phase2_msgs": 0, "phase2_keys": 0, "back_msgs": 0}

    # -- the joiner
    def on_clock(self, clocks) -> None:
        if not self.is_joiner or self.stats["requested"] or self.stats["aborted"]:
            return
        heard = clocks[np.isfinite(clocks)]
        if not (heard.size and heard.max() >= self.cfg.join_at):
            return
        self.stats["requested"] = True
        keys = np.flatnonzero(self.moving)
        heads = self._old_heads(keys)
        if np.any(heads < 0):               # a range with every copy dead: nothing to take over
            self._abandon()
            return
        for r in self.others:
            if r not in self.s.dead:
                self.owed.add(r)
                self.s.send(JoinRequest(keys[heads == r]), r)

    def _old_heads(self, keys) -> np.ndarray:
        """Live R0 head of each key (-1: every copy is dead)."""
        r0, arcs = self.rings[0], self.rings[0].arcs(keys)
        first = {a: (r0.chain(a, self.cfg.replicas, self.s.dead) or [-1])[0] for a in np.unique(arcs).tolist()}
        return np.array([first[a] for a in arcs.tolist()], dtype=np.int64)

    def on_precopy(self, src, keys, values, new_tags, last) -> None:
        c = self.chunks[src] = self.chunks.get(src, 0) + 1
        first = self.first_chunk.setdefault(src, {})
        for tag in new_tags:
            first.setdefault(tag, c)
        self.s.store[keys] = values
        self.chunk_of[keys] = c
        self.copied_from[keys] = src
        self.stats["precopy_keys"] += len(keys)
        if last:
            self.owed.discard(src)
            if not self.owed and not self.stats["aborted"]:
                self._switch()

    def _switch(self) -> None:
        for delta in self.held:            # phase 2: now every chunk is in, we know what each one lacks
            self._apply_delta(*delta)
        self.held.clear()
        self.stats["switched"] = True
        for w in range(self.cfg.n_workers):
            if not self.s.done[w]:
                self.s.send(Switch(), self.cfg.worker_rank(w))

    def on_delta(self, tag, clock, keys, values) -> None:
        if self.stats["aborted"]:
            return
        if not self.stats["switched"]:
            self.held.append((tag, clock, keys, values))   # a chunk of these keys may still be on its way
        else:
            self._apply_delta(tag, clock, keys, values)

    def _apply_delta(self, tag, clock, keys, values) -> None:
        """Add an update to the keys whose chunk was copied before the update was applied there.

        Chunk ``c`` of donor ``d`` contains the update iff its tag came with chunk ``c`` or an
        earlier one of ``d``. Each tag counts once: a worker may re-send an update to a new head,
        which passes it on again; and the donor that copied a key may not be the one sending."""
        if tag in self.deltas_seen:
            return
        self.deltas_seen.add(tag)
        first = np.full(len(keys), np.inf)
        src = self.copied_from[keys]
        for d in np.unique(src).tolist():
            c = self.first_chunk.get(d, {}).get(tag)
            if c is not None:
                first[src == d] = c
        missing = self.chunk_of[keys] < first
        self.s.write(keys[missing], values[missing], clock)

    def reads_allowed(self) -> bool:
        return not (self.active and self.is_joiner) or (
            self.stats["switched"] and all(r in self.handed or r in self.s.dead for r in self.others))

    # -- every server
    def on_join_req(self, keys) -> None:
        self.started = True
        step = self.cfg.precopy_chunk
        self.outbox = [keys[i:i + step] for i in range(0, len(keys), step)] or [keys]
        self.check_handoff()

    def streaming(self) -> bool:
        return bool(self.outbox)

    def send_chunk(self) -> None:
        """Send the next chunk of the snapshot, with the tags applied since the previous one."""
        keys = self.outbox.pop(0)
        new = self.s.applied - self.sent_tags
        self.sent_tags |= new
        if self.J in self.s.dead or self.stats["aborted"]:
            self.outbox.clear()
            return
        self.s.send(Precopy(self.s.me, keys, self.s.store[keys].copy(), new, not self.outbox), self.J)

    def after_apply(self, tag, clock, keys, values, epoch, chain) -> None:
        """Called as a server applies a new update that came straight from a worker, before it goes
        down its chain. (Not "if I am the head": a worker re-sending to a new head may be faster
        than the news that the old head died, and the new head must pass the update on anyway.)"""
        if not self.active or not keys.size or self.J in self.s.dead:
            return
        if epoch == 0 and self.started and not self.is_joiner:
            m = self.moving[keys]
            if m.any():
                self.s.send(Delta(tag, clock, keys[m], values[m]), self.J)
                self.stats["phase2_msgs"] += 1
                self.stats["phase2_keys"] += int(m.sum())
        elif epoch == 1 and self.is_joiner and len(self.handed) < len(self.others):
            m = self.joiner_heads[keys]
            heads = self._old_heads(keys[m])
            for h in np.unique(heads).tolist():
                if h >= 0 and h not in chain and h not in self.handed:
                    sel = heads == h
                    self.s.send(CopyBack(keys[m][sel], values[m][sel]), h)
                    self.stats["back_msgs"] += 1

    def on_switched(self, w) -> None:
        self.switched.add(w)
        self.check_handoff()

    def check_handoff(self) -> None:
        if (self.active and not self.is_joiner and self.started and not self.reported
                and all(self.s.done[w] or w in self.switched for w in range(self.cfg.n_workers))):
            self.reported = True
            self.s.send(HandoffDone(self.s.me), self.J)

    def on_peer_died(self, p) -> None:
        if (self.active and self.is_joiner and p < self.cfg.n_servers and self.stats["requested"]
                and not self.stats["switched"] and not self.stats["aborted"]):
            self._abandon()

    def _abandon(self) -> None:
        """The joiner gives up before the switch: R0 and its replicas carry on without it."""
        self.stats["aborted"] = True
        self.owed.clear()
        self.held.clear()
        for r in self.others + [self.cfg.worker_rank(w) for w in range(self.cfg.n_workers)]:
            if r not in self.s.dead:
                self.s.send(JoinAbort(), r)

    def on_abort(self) -> None:
        self.started = False                       # no more deltas, no snapshot, no hand-off report
        self.reported = True
        self.outbox.clear()

    def may_exit(self, all_done: bool) -> bool:
        """The joiner also waits for every server's ``bye``: deltas are not on the acknowledgement
        path, so a worker can finish while its last deltas are still on their way to ``J``."""
        if not (self.active and self.is_joiner):
            return all_done
        return all_done and all(r in self.byes or r in self.s.dead for r in self.others)

    def bye(self) -> None:
        if self.active and not self.is_joiner and self.J not in self.s.dead:
            self.s.send(Bye(self.s.me), self.J)
