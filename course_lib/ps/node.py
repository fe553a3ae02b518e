"""Server and worker nodes of a small parameter server (after Li et al., OSDI 2014 and ps-lite).

Ranks ``0 .. S-1`` are servers, ranks ``S .. S+W-1`` workers (worker id ``w = rank - S``).
Keys live on a consistent-hashing ring (:mod:`.ring`); the arc of point ``i`` is key range
``i``, held by its chain: the owner of point ``i`` then the next ``k`` distinct live servers.

Worker API (ps-lite style, non-blocking)::

    ts = kv.push(keys, values)   # sorted distinct keys; sliced by range; returns a timestamp
    ts = kv.pull(keys)
    vals = kv.wait(ts)           # block until every slice of request ts is answered
    kv.advance()                 # finished one iteration: tell every server my new clock

Messages (tuples; numpy arrays travel as raw bytes)::

    worker -> head:   ("push", w, ts, clock, pieces, epoch)   pieces = [(pid, arc, keys, values), ...]
                      ("pull", w, ts, clock, pieces, epoch)   pieces = [(pid, arc, keys, None), ...]
    worker -> all:    ("clock", w, c)   ("done", w)
    server -> next:   ("fwd",  w, ts, clock, pieces, epoch)   chain replication, once per push
    tail   -> worker: ("ack", ts, pids)
    head   -> worker: ("vals", ts, [(pid, values), ...])

(``pid`` numbers the slices of one request: the wrapping arc 0 can give two slices. ``epoch`` says
which ring the worker sliced it with: 0 before a server joined, 1 after.)

A server joining (``cfg.joiner``, :mod:`.join`) adds::

    joiner -> servers: ("join_req", keys)  ("join_abort",)      servers -> joiner: ("precopy", s, keys, values, tags, last)
    old head -> joiner: ("delta", tag, clock, keys, values)     joiner -> old head: ("back", keys, values)
    joiner -> workers: ("switch",)  ("join_abort",)              worker -> servers: ("switched", w)
    servers -> joiner: ("handoff_done", s)  ("bye", s)

Key caching (``cfg.key_cache``): a worker that sends a server a key list it has sent before sends
only its 8-byte hash (``bytes``) in place of the keys; the server keeps ``(worker, hash) -> keys``.
A pull followed by a push on the same keys (every SGD step) sends the keys once.

With ``replicate="aggregate"`` a head buffers what it would forward and sends its successor, every
``aggregate_every`` clock ticks (or when a worker asks, ``("flush",)``), one summed update per range:
``("agg", [(arc, keys, summed values, tags, clock), ...])``; fewer and smaller messages, later acks
(the paper's trade-off between replicating every push and replicating after aggregation).

A push is acknowledged by the *tail* of each range's chain, so an acknowledged update is on
every replica. A worker re-sends every unanswered slice to the new head when a server dies
(``PeerLost``); servers remember ``(worker, ts, pid)`` so a re-sent push is applied once.
Reads are deferred by the server until the bounded-delay gate holds (:mod:`.consistency`).
"""
from __future__ import annotations

import hashlib
import time
import zlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from course_lib.runtime.comm import PeerLost

from .consistency import INF, may_answer_pull
from .filters import soft_threshold
from .join import JoinSide, check_config
from .keys import check_request, slice_request
from .ring import HashRing
from .vclock import RangeClock


@dataclass
class PSConfig:
    n_servers: int = 2
    n_workers: int = 2
    n_keys: int = 1 << 16
    val_len: int = 1
    vnodes: int = 4
    replicas: int = 0          # k: each range also lives on the next k servers
    tau: float = INF           # bounded delay; 0 sequential, INF eventual
    updater: str = "sum"       # "sum": w += v ; "l1": w <- soft(w - eta v, eta lam)
    eta: float = 0.1
    lam: float = 0.0
    key_cache: bool = False    # send a key list a server has seen before as its 8-byte hash
    scheduler: bool = False    # one more rank (the last) hands out data tasks (:mod:`.scheduler`)
    n_tasks: int = 0           # with a scheduler: the data is cut into this many blocks
    replicate: str = "push"    # "push": forward every push; "aggregate": forward summed updates in batches
    aggregate_every: int = 0   # "aggregate": flush after this many worker clock ticks (0: n_workers)
    compress: bool = False     # values travel zlib-compressed (lossless; sparse models have many zeros)
    joiner: int = -1           # a server rank that is off the ring until it joins (:func:`serve`)
    join_at: int = 0           # ... when it hears a worker clock >= join_at
    join_vnodes: int = 1       # points the joiner takes (1: it takes one range from one server)
    precopy_chunk: int = 4096  # keys per message of a joiner's snapshot, sent between two served messages

    def ring(self) -> HashRing:
        """The ring at the start (without the joiner)."""
        return HashRing([s for s in range(self.n_servers) if s != self.joiner], self.n_keys, self.vnodes)

    def rings(self) -> tuple:
        """The rings by epoch: ``(R0,)``, or ``(R0, R1)`` with a joiner."""
        return (self.ring(), self.final_ring()) if self.joiner >= 0 else (self.ring(),)

    def final_ring(self) -> HashRing:
        """The ring at the end (with the joiner, if any)."""
        r = self.ring()
        if self.joiner >= 0:
            r.add(self.joiner, self.join_vnodes)
        return r

    def __post_init__(self):
        check_config(self)

    @property
    def size(self) -> int:
        return self.n_servers + self.n_workers + int(self.scheduler)

    @property
    def scheduler_rank(self) -> int:
        return self.n_servers + self.n_workers if self.scheduler else -1


def pack(values, on: bool):
    """Values as zlib-compressed bytes when ``on`` (what the paper does with Snappy)."""
    if not on or values is None:
        return values
    return zlib.compress(np.ascontiguousarray(values, dtype=np.float64).tobytes(), 1)


def unpack(values):
    if isinstance(values, bytes):
        return np.frombuffer(zlib.decompress(values), dtype=np.float64)
    return values


def key_digest(keys) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(keys, dtype=np.int64).tobytes(), digest_size=8).digest()


# ---------------------------------------------------------------------------- server
def serve(comm, cfg: PSConfig) -> dict:
    """Server loop of rank ``comm.rank``; returns its store and what it recorded."""
    me, S, W = comm.rank, cfg.n_servers, cfg.n_workers
    check_config(cfg)
    rings = cfg.rings()
    store = np.zeros((cfg.n_keys, cfg.val_len))
    clocks = np.zeros(W)                  # latest clock heard from each worker (INF once done)
    dead: set = set()
    applied: set = set()                  # (worker, ts, pid) already in the store
    deferred: list = []                   # pulls waiting for the gate
    reads: list = []                      # (worker, t, min clock when served, seconds deferred)
    vclock = RangeClock(cfg.n_keys, W)
    staged: dict = {}                     # tau = 0: iteration -> updates not yet visible
    forwarded: dict = {}                  # next server -> [(worker, ts, pid)] we forwarded to it
    aggregating = cfg.replicate == "aggregate"
    agg: dict = {}                        # next server -> buffered updates (replicate after aggregation)
    direct: dict = {}                     # tag -> (keys, values) applied as a stand-in head
    ticks = 0
    n_push = n_dup = n_fwd = 0
    done = np.zeros(W, dtype=bool)
    if aggregating and cfg.replicas > 1:
        raise ValueError("replicate='aggregate' is supported with replicas <= 1")

    def send(obj, dest):
        try:
            comm.send(obj, dest)
            return True
        except PeerLost:
            peer_died(dest)
            return False

    def peer_died(p):
        if p in dead:
            return
        dead.add(p)
        if p < S:                          # our successor died: we are the tail of what we sent it
            by = {}
            for w, ts, clock, pid, arc, keys, vals in agg.pop(p, []):
                by.setdefault((w, ts), []).append(pid)
            for w, ts, pid in forwarded.pop(p, []):
                by.setdefault((w, ts), []).append(pid)
            for (w, ts), pids in by.items():
                send(("ack", ts, pids), S + w)
            join.on_peer_died(p)
        elif p < S + W:                    # a worker died: it no longer holds anyone back
            done[p - S] = True
            clocks[p - S] = INF
            join.check_handoff()

    def apply(w, ts, clock, pieces, epoch=0, from_worker=False):
        """Apply new pieces; forward them along each chain; the tail acknowledges."""
        nonlocal n_push, n_dup, n_fwd
        onward, acks = {}, []
        ring = rings[epoch]
        for pid, arc, keys, vals in pieces:
            tag = (w, ts, pid)
            chain = ring.chain(arc, cfg.replicas, dead)
            if tag in applied:
                n_dup += 1
            else:
                applied.add(tag)
                n_push += 1
                v = vals.reshape(-1, cfg.val_len)
                if from_worker:            # we act as its head; a joiner hears of it before the chain does
                    join.after_apply(tag, clock, keys, v, epoch, chain)
                write(keys, v, clock)
                if aggregating and ring.chain(arc, cfg.replicas)[0] != me:
                    direct[tag] = (keys, v)   # may also come inside an aggregate
                if keys.size:
                    vclock.update(int(keys[0]), int(keys[-1]) + 1, w, clock + 1)
            nxt = chain[chain.index(me) + 1] if me in chain and chain.index(me) + 1 < len(chain) else None
            if nxt is None:
                acks.append(pid)
            else:
                onward.setdefault(nxt, []).append((pid, arc, keys, vals))
        for dest, ps in onward.items():
            if aggregating:                # replicate after aggregation: acknowledged at the next flush
                agg.setdefault(dest, []).extend((w, ts, clock) + tuple(p) for p in ps)
                continue
            if send(("fwd", w, ts, clock, ps, epoch), dest):
                n_fwd += 1
                forwarded.setdefault(dest, []).extend((w, ts, p[0]) for p in ps)
            else:                          # the next replica died: we may be the tail now
                acks_more = apply_again(w, ts, clock, ps, epoch)
                acks.extend(acks_more)
        if acks:
            send(("ack", ts, acks), S + w)

    def flush_agg():
        """Send each successor the sum of the updates buffered for it, one entry per range."""
        nonlocal n_fwd
        for dest in list(agg):
            entries = agg.pop(dest)
            by_arc = {}
            for w, ts, clock, pid, arc, keys, vals in entries:
                by_arc.setdefault(arc, []).append((w, ts, clock, pid, keys, vals))
            out = []
            for arc, es in by_arc.items():
                allk = np.concatenate([e[4] for e in es])
                u, inv = np.unique(allk, return_inverse=True)
                total = np.zeros((len(u), cfg.val_len))
                np.add.at(total, inv, np.concatenate([np.asarray(e[5]).reshape(-1, cfg.val_len) for e in es]))
                out.append((arc, u, total, [(e[0], e[1], e[3]) for e in es], max(e[2] for e in es)))
            if send(("agg", out), dest):
                n_fwd += 1
                forwarded.setdefault(dest, []).extend(t for o in out for t in o[3])
            else:                          # it died before we sent: we are the tail now
                for w, ts, clock, pid, arc, keys, vals in entries:
                    for a in apply_again(w, ts, clock, [(pid, arc, keys, vals)], 0):
                        send(("ack", ts, [a]), S + w)

    def apply_agg(out):
        """A successor applies a summed batch once; updates it already got directly are taken back out."""
        acks = {}
        for arc, keys, total, tags, clock in out:
            write(keys, total, clock)
            for tag in tags:
                if tag in applied and tag in direct:     # re-sent to us after a failure, then arrived again here
                    k, v = direct.pop(tag)
                    write(k, -v, clock)
                applied.add(tag)
            for w, ts, pid in tags:        # replicas <= 1: the successor is the tail
                acks.setdefault((w, ts), []).append(pid)
        for (w, ts), pids in acks.items():
            send(("ack", ts, pids), S + w)

    def apply_again(w, ts, clock, pieces, epoch):
        out = []
        for piece in pieces:
            chain = rings[epoch].chain(piece[1], cfg.replicas, dead)
            if me not in chain or chain[-1] == me:
                out.append(piece[0])
            else:
                nxt = chain[chain.index(me) + 1]
                if send(("fwd", w, ts, clock, [piece], epoch), nxt):
                    forwarded.setdefault(nxt, []).append((w, ts, piece[0]))
                else:
                    out.extend(apply_again(w, ts, clock, [piece], epoch))
        return out

    key_cache: dict = {}                  # (worker, hash) -> keys

    def resolve(w, pieces):
        out = []
        for pid, arc, keys, vals in pieces:
            if isinstance(keys, bytes):
                keys = key_cache[(w, keys)]
            else:
                key_cache[(w, key_digest(keys))] = keys
            out.append((pid, arc, keys, vals))
        return out

    def update(keys, v):
        if cfg.updater == "l1":
            store[keys] = soft_threshold(store[keys] - cfg.eta * v, cfg.eta * cfg.lam)
        else:
            store[keys] += v

    def write(keys, v, clock):
        # Sequential (tau = 0): an update of iteration c becomes visible only once every worker has
        # finished iteration c, so every read at clock t sees exactly the iterations before t.
        if cfg.tau == 0 and clock >= np.min(clocks):
            staged.setdefault(clock, []).append((keys, v))
        else:
            update(keys, v)

    def flush():
        lo = np.min(clocks) if W else INF
        for c in sorted(staged):
            if c < lo:
                for keys, v in staged.pop(c):
                    update(keys, v)

    def try_reads():
        flush()
        if not join.reads_allowed():
            return                         # a joiner answers reads once it holds every change
        heard = clocks.tolist()            # the clocks as they are now: a death below re-opens nothing this pass
        lo = min(heard, default=INF)
        keep = []
        for w, ts, t, pieces, arrived in deferred:
            if may_answer_pull(t, heard, cfg.tau):
                reads.append((w, t, lo, time.perf_counter() - arrived))
                send(("vals", ts, [(pid, pack(store[keys].ravel(), cfg.compress) if cfg.compress else store[keys].ravel().copy())
                                   for pid, _, keys, _ in pieces]), S + w)
            else:
                keep.append((w, ts, t, pieces, arrived))
        deferred[:] = keep

    join = JoinSide(SimpleNamespace(me=me, store=store, dead=dead, done=done, applied=applied, send=send,
                                    write=write), cfg, rings)
    join.on_clock(clocks)
    while not join.may_exit(done.all()):
        try:
            if join.streaming():           # a joiner's snapshot goes out one chunk between two messages
                join.send_chunk()
                if not comm.iprobe():
                    continue
            src, msg = comm.recv_any()
        except PeerLost as exc:
            p = exc.rank
            if p < 0:
                break
            peer_died(p)
            try_reads()
            continue
        kind = msg[0]
        if kind in ("push", "pull") and cfg.key_cache:
            msg = msg[:4] + (resolve(msg[1], msg[4]),) + msg[5:]
        if kind == "push" and cfg.compress:
            msg = msg[:4] + ([(pid, arc, keys, unpack(v)) for pid, arc, keys, v in msg[4]],) + msg[5:]
        if kind == "push" or kind == "fwd":
            _, w, ts, clock, pieces, epoch = msg
            with comm.compute("apply"):    # faults fire here: a server dies between two pushes
                apply(w, ts, clock, pieces, epoch, from_worker=kind == "push")
        elif kind == "pull":
            _, w, ts, t, pieces, epoch = msg
            deferred.append((w, ts, t, pieces, time.perf_counter()))
        elif kind == "clock":
            clocks[msg[1]] = max(clocks[msg[1]], msg[2])
            join.on_clock(clocks)
            ticks += 1
            if aggregating and ticks % (cfg.aggregate_every or W) == 0:
                flush_agg()
        elif kind == "flush":
            flush_agg()
        elif kind == "agg":
            with comm.compute("apply"):
                apply_agg(msg[1])
        elif kind == "done":
            done[msg[1]] = True
            clocks[msg[1]] = INF
            if aggregating:
                flush_agg()
            join.check_handoff()
        # a server joins (:mod:`.join`); each step is a labelled compute phase, so a test can fail it
        elif kind == "join_req":
            with comm.compute("join_req"):
                join.on_join_req(msg[1])
        elif kind == "precopy":
            with comm.compute("precopy"):
                join.on_precopy(*msg[1:])
        elif kind == "delta":
            join.on_delta(*msg[1:])
        elif kind == "back":
            update(msg[1], msg[2])
        elif kind == "switched":
            with comm.compute("switched"):
                join.on_switched(msg[1])
        elif kind == "handoff_done":
            join.handed.add(msg[1])
        elif kind == "join_abort":
            join.on_abort()
        elif kind == "bye":
            join.byes.add(msg[1])
        try_reads()
    flush()
    join.bye()
    return {"rank": me, "store": store, "reads": reads, "clocks": clocks, "n_push": n_push, "n_dup": n_dup,
            "n_fwd": n_fwd, "vclock_segments": len(vclock), "vclock": vclock.segments,
            "dead_seen": sorted(dead), "join": join.stats}


# ---------------------------------------------------------------------------- worker
@dataclass
class _Request:
    kind: str
    keys: np.ndarray
    pieces: list                     # [(pid, arc, keys, values)]
    todo: set                        # pids not answered yet
    epoch: int                       # the ring its arcs refer to
    answers: dict = field(default_factory=dict)
    values: np.ndarray = None


class KVWorker:
    """The worker side: ``push``, ``pull``, ``wait`` over key ranges (one per worker rank)."""

    def __init__(self, comm, cfg: PSConfig):
        self.comm, self.cfg = comm, cfg
        self.w = comm.rank - cfg.n_servers
        self.rings = cfg.rings()
        self.epoch = 0               # 1 once a joining server has told us to use the new ring
        self.join_aborted = False
        self.clock = 0
        self.dead: set = set()
        self.pending: dict = {}
        self.next_ts = 0
        self.wait_time = 0.0
        self.resent = 0
        self.key_lists: dict = {}    # server -> hashes of key lists it has received from us
        self.log: list = []          # every push (keys, values): the update sequence, for replay

    # -- helpers
    def _head(self, arc, epoch):
        chain = self.rings[epoch].chain(arc, self.cfg.replicas, self.dead)
        if not chain:
            raise RuntimeError(f"worker {self.w}: every replica of key range {arc} is dead "
                               f"(replicas={self.cfg.replicas}, dead servers {sorted(self.dead)})")
        return chain[0]

    def _send_pieces(self, kind, ts, pieces, epoch):
        by_server = {}
        for p in pieces:
            by_server.setdefault(self._head(p[1], epoch), []).append(p)
        for s, ps in by_server.items():
            if self.cfg.key_cache:
                ps = [self._cached(s, p) for p in ps]
            if self.cfg.compress:
                ps = [(pid, arc, keys, pack(v, True)) for pid, arc, keys, v in ps]
            try:
                self.comm.send((kind, self.w, ts, self.clock, ps, epoch), s)
            except PeerLost:
                self._lost(s)            # re-sends everything unanswered, these pieces included
                return

    def _cached(self, s, piece):
        pid, arc, keys, vals = piece
        d = key_digest(keys)
        seen = self.key_lists.setdefault(s, set())
        if d in seen:
            return (pid, arc, d, vals)
        seen.add(d)
        return piece

    def _lost(self, s):
        if s in self.dead:
            return
        self.dead.add(s)
        for ts, req in list(self.pending.items()):
            again = [p for p in req.pieces if p[0] in req.todo]
            if again:
                self.resent += len(again)
                self._send_pieces(req.kind, ts, again, req.epoch)

    def _request(self, kind, keys, values=None):
        keys, values = check_request(keys, values, self.cfg.n_keys, self.cfg.val_len)
        ring = self.rings[self.epoch]
        pieces = [(i, *p) for i, p in enumerate(slice_request(ring.points, keys, values, self.cfg.val_len))]
        ts = self.next_ts
        self.next_ts += 1
        self.pending[ts] = _Request(kind, keys, pieces, {p[0] for p in pieces}, self.epoch)
        if kind == "push":
            self.log.append((keys, values))
        self._send_pieces(kind, ts, pieces, self.epoch)
        return ts

    @property
    def join_settled(self) -> bool:
        """No join, or it ended: we switched to the new ring, or it was abandoned, or the joiner died."""
        J = self.cfg.joiner
        return J < 0 or self.epoch == 1 or self.join_aborted or J in self.dead

    # -- API
    def push(self, keys, values) -> int:
        return self._request("push", keys, values)

    def pull(self, keys) -> int:
        return self._request("pull", keys)

    def wait(self, ts):
        """Block until request ``ts`` is complete; a pull returns its values in key order."""
        start = time.perf_counter()
        while ts in self.pending and self.pending[ts].todo:
            self._handle_one(ts)
        self.wait_time += time.perf_counter() - start
        req = self.pending.pop(ts, None)
        if req is None or req.kind == "push":
            return None
        parts = [req.answers[p[0]] for p in req.pieces]
        return np.concatenate(parts) if parts else np.zeros(0)

    def _handle_one(self, ts=None):
        try:
            src, msg = self.comm.recv_any()
        except PeerLost as exc:
            if exc.rank < 0 or exc.rank == self.cfg.scheduler_rank:
                raise RuntimeError(f"worker {self.w}: lost rank {exc.rank} while waiting for request {ts}") from exc
            if exc.rank < self.cfg.n_servers:  # another worker's death is not our business
                self._lost(exc.rank)
            return
        if msg[0] == "switch":            # a server joined: slice new requests with the new ring
            self.epoch = 1
            for s in range(self.cfg.n_servers):
                if s != self.cfg.joiner and s not in self.dead:
                    try:
                        self.comm.send(("switched", self.w), s)
                    except PeerLost:
                        self._lost(s)
            return
        if msg[0] == "join_abort":
            self.join_aborted = True
            return
        kind, rts = msg[0], msg[1]
        req = self.pending.get(rts)
        if req is None:
            return                         # a late duplicate answer
        if kind == "ack":
            req.todo -= set(msg[2])
        elif kind == "vals":
            for pid, v in msg[2]:
                if pid in req.todo:
                    req.answers[pid] = unpack(v)
                    req.todo.discard(pid)

    def wait_all(self):
        if self.cfg.replicate == "aggregate" and self.pending:
            for s in range(self.cfg.n_servers):    # ask heads to replicate what they hold, so acks come
                if s not in self.dead:
                    try:
                        self.comm.send(("flush",), s)
                    except PeerLost:
                        self._lost(s)
        for ts in sorted(self.pending):
            self.wait(ts)

    def advance(self):
        """Finished an iteration: the clock goes up and every live server hears it."""
        self.clock += 1
        for s in range(self.cfg.n_servers):
            if s not in self.dead:
                try:
                    self.comm.send(("clock", self.w, self.clock), s)
                except PeerLost:
                    self._lost(s)

    def finish(self):
        self.wait_all()
        for s in range(self.cfg.n_servers):
            if s not in self.dead:
                try:
                    self.comm.send(("done", self.w), s)
                except PeerLost:
                    self.dead.add(s)


def ps_node(comm, cfg: PSConfig, worker_fn, *args):
    """SPMD entry point: servers serve, workers run ``worker_fn(kv, *args)`` then finish."""
    if comm.size != cfg.size:
        raise ValueError(f"the cluster has {comm.size} ranks, the config needs {cfg.size} "
                         f"({cfg.n_servers} servers + {cfg.n_workers} workers)")
    if comm.rank < cfg.n_servers:
        return serve(comm, cfg)
    if comm.rank == cfg.scheduler_rank:
        from .scheduler import schedule
        return schedule(comm, range(cfg.n_servers, cfg.n_servers + cfg.n_workers), cfg.n_tasks)
    kv = KVWorker(comm, cfg)
    try:
        out = worker_fn(kv, *args)
        kv.finish()
    except BaseException:
        kv.pending.clear()               # failing: release the servers, then report the error
        kv.finish()
        raise
    return {"result": out, "wait_time": kv.wait_time, "log": kv.log, "resent": kv.resent,
            "dead_seen": sorted(kv.dead), "epoch": kv.epoch}


def gather_store(results, cfg: PSConfig):
    """Final parameters: each key from the first surviving server of its chain, in the ring the
    workers ended with (the new one if a joining server switched any of them)."""
    workers = [r for r in results[cfg.n_servers:cfg.n_servers + cfg.n_workers] if r is not None]
    ring = cfg.final_ring() if any(r.get("epoch", 0) for r in workers) else cfg.ring()
    dead = {r for r in range(cfg.n_servers) if results[r] is None}
    out = np.zeros((cfg.n_keys, cfg.val_len))
    arcs = ring.arcs(np.arange(cfg.n_keys))
    for a in range(len(ring.points)):
        chain = ring.chain(a, cfg.replicas, dead)
        if not chain:
            raise RuntimeError(f"key range {a} was lost: all {cfg.replicas + 1} copies died")
        m = arcs == a
        out[m] = results[chain[0]]["store"][m]
    return out


__all__ = ["PSConfig", "serve", "KVWorker", "ps_node", "gather_store"]
