"""The communicator each worker gets: point-to-point messages over Pipes, traced and counted.

Names and semantics follow mpi4py 4.1's lowercase object interface: the point-to-point
methods come from :class:`p2p.PointToPoint` (``send``, ``recv``, ``sendrecv``, ``isend``,
``irecv``, ``ssend``, ``issend``, ``probe``, ``iprobe``), the collectives (``bcast``,
``allreduce``, ...) from :class:`CollectivesMixin`, sub-communicators (``Split``,
``Dup``, ``Create_group``) from :class:`GroupMethods`. What mpi4py's communicator offers
and course_lib does not raises NotImplementedError saying so.

This class is also the *engine* under every communicator of the process: it moves
messages between world ranks. Every message carries an envelope ``(run_id, context,
tag, ready_at)``: ``context`` separates communicators, ``tag`` lets a receiver pick a
message, ``ready_at`` is when the emulated network delivers it. A message that arrives
is first offered to the receives posted with ``irecv`` (in the order they were posted);
if none wants it, it waits in ``_pending`` (MPI's unexpected-message queue), in arrival
order, which keeps each sender's messages in the order they were sent.

Synchronous sends (``ssend``/``issend``) carry an id; the receiver, once it has matched
such a message, sends the id back in the :data:`ACK_CONTEXT`. Acknowledgements are not
user messages: they are not counted in ``bytes``/``messages``, only in ``header_bytes``
of the rank that sends them. Sends to yourself never touch a Pipe and are not counted.

``isend``/``issend`` never block: each peer's messages are queued and written by a sender
thread (:class:`nonblocking.PeerSender`). Any thread may receive: each link is read by one
thread at a time (see the receiving section). When a rank's function returns, it writes a
last note in the :data:`RETURNED_CONTEXT` to each neighbour, so a rank still waiting for it
raises :class:`PeerReturned` at once instead of waiting for the run's timeout.
"""
from __future__ import annotations

import functools
import itertools
import logging
import pickle
import select
import selectors
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import wait as wait_for

from . import wire
from .collective_api import CollectivesMixin
from .constants import ANY_SOURCE, ANY_TAG, PROC_NULL
from .control import BarrierArrived, BarrierFailed, BarrierRelease, Progress
from .groups import GroupMethods
from .mpi4py_methods import MPI4PY_COMM_METHODS
from .netem import Downlink, Network
from .nonblocking import CANCEL_POLL_S, SEND_DRAIN_S, Cancelled, PeerSender, ProgressThread, QueuedSend, UnfinishedSends
from .p2p import PointToPoint, Request, Status, as_rank
from .shm_sync import usable_cpus
from .trace import Stats, Tracer

__all__ = ["ANY_SOURCE", "ANY_TAG", "PROC_NULL", "Comm", "PeerLost", "PeerReturned", "Request", "Status",
           "Deadlock"]

ACK_CONTEXT = -1  # acknowledgements of synchronous sends (user and collective contexts are >= 0)
RETURNED_CONTEXT = -2  # a rank's last message of a run: its function returned, nothing more will come


class PeerLost(ConnectionError):
    """The peer at the other end of a Pipe died (its process is gone); ``.rank`` names it."""

    def __init__(self, rank: int, during: str = "recv"):
        super().__init__(f"rank {rank} is gone (its Pipe closed during {during})")
        self.rank = rank


class PeerReturned(RuntimeError):
    """A receive waits for ranks whose function has returned: nothing more can come from them.
    ``.ranks`` names them."""

    def __init__(self, rank: int, ranks: list[int], waiting_for: str):
        names = ", ".join(f"rank {r}" for r in ranks)
        its, it = ("its", "it") if len(ranks) == 1 else ("their", "them")
        super().__init__(f"rank {rank} waits in {waiting_for} for {names}, which returned from {its} function "
                         f"(what was sent before returning was delivered); nothing more can come from {it}")
        self.ranks = ranks


class Deadlock(RuntimeError):
    """A receive that nothing could ever satisfy (e.g. from yourself, with nothing sent to yourself)."""


class _PostedRecv:
    """A receive posted by ``irecv`` (world rank, tag, context); ``msg`` is set once matched."""

    __slots__ = ("source", "tag", "context", "msg")

    def __init__(self, source: int, tag: int, context: int):
        self.source, self.tag, self.context, self.msg = source, tag, context, None

    def matches(self, msg) -> bool:
        return ((self.source == ANY_SOURCE or msg.source == self.source) and msg.context == self.context
                and (self.tag == ANY_TAG or msg.tag == self.tag))


class Comm(PointToPoint, CollectivesMixin, GroupMethods):
    """One rank's view of the cluster (mpi4py's COMM_WORLD), and the engine of all its communicators.

    Parameters are set by the runtime, not by students: ``links`` maps each neighbour's
    rank to a duplex Connection, ``control`` is the Pipe to the launching process.
    """

    _ctx_p2p = 0  # context of the world's user messages (collectives use WORLD_COLL_CONTEXT)

    def __init__(self, rank: int, size: int, links: dict, control, logger: logging.Logger | None = None):
        self.rank, self.size = rank, size
        self._engine = self
        self._links = links
        self._send_locks = {r: threading.Lock() for r in links}  # held while one message is written
        self._senders = {r: PeerSender(rank, r, functools.partial(self._write_queued, r)) for r in links}
        self._read_locks = {r: threading.Lock() for r in links}  # held while one message is read
        self._inbox = threading.RLock()  # guards _pending, _posted and the matching of arrivals
        self._control = control
        self._dead: set[int] = set()
        self._selector = None
        self._sync_ids = itertools.count(1)
        if links and hasattr(links[next(iter(links))], "fileno") and sys.platform != "win32":
            self._selector = selectors.DefaultSelector()
            for peer, conn in links.items():
                self._selector.register(conn, selectors.EVENT_READ, peer)
        self.logger = logger or logging.getLogger(f"rank{rank}")
        self._nb: ProgressThread | None = None   # runs iallreduce in the background (nonblocking.py)
        self._begin_run(0, time.perf_counter(), Network(), {}, {}, True)

    # -- run bookkeeping (called by the runtime) ------------------------------
    def _begin_run(self, run_id, t0, network, slow, faults, trace):
        self._run_id, self._t0 = run_id, t0
        self._network = network
        self._instant = network.is_instant
        self._downlink = Downlink() if network.downlink and not network.is_instant else None
        # Spin out the end of an emulated wait only with a core per rank: with more ranks than cores
        # the spinning ranks take the cores the others need (16 gossip nodes on 2 cores beside other
        # work: a 26 s notebook took 270 s).
        self._spin_waits = self.size <= usable_cpus()
        self._slow = float(slow.get(self.rank, 1.0))
        self._fault = faults.get(self.rank)
        self._pending: deque[wire.Message] = deque()
        self._posted: list[_PostedRecv] = []  # irecvs not matched yet, in the order they were posted
        self._acked: set[int] = set()         # ids of my synchronous sends that were matched
        self._returned: set[int] = set()      # neighbours whose function returned in this run
        self._readers = _Readers()  # which threads read the links (see "receiving")
        # plain Python counters per destination: cheaper per message than numpy items
        self._sent_bytes = [0] * self.size
        self._sent_msgs = [0] * self.size
        self._sent_header = [0] * self.size
        self._tracer = Tracer(self.rank, t0, enabled=trace)
        self._last_progress = 0.0
        self.step = 0
        self._label_steps: dict = {}      # label -> compute phases so far, for Fault(label=...)

    def _progress_thread(self) -> ProgressThread:
        """This rank's background thread for non-blocking collectives (started on first use)."""
        if self._nb is None:
            self._nb = ProgressThread(self.rank)
        return self._nb

    def _end_nonblocking(self, failed: bool = False) -> int:
        """End of a run: stop the background threads; returns how many collectives were left
        unfinished. After a clean return, drains queued sends, raises :class:`UnfinishedSends` if
        some were left unsent or failed unseen, and tells the neighbours this rank returned.
        ``failed=True`` (the worker's ``except`` block) drops queued sends and tells nobody: the
        error that ended the run comes first, and a failing worker exits, so its peers get PeerLost."""
        nb, self._nb = self._nb, None
        unfinished = 0 if nb is None else nb.finish_run()
        problems = [p for sender in self._senders.values() for p in sender.finish(0.0 if failed else SEND_DRAIN_S)]
        if problems and not failed:
            raise UnfinishedSends(f"rank {self.rank}: " + "; ".join(problems) + ". wait() for every isend request")
        if not failed:
            self._announce_return()
        return unfinished

    def _announce_return(self) -> None:
        """Tell every neighbour that this rank's function returned, so a rank still waiting for it
        fails at once (PeerReturned) instead of at the run's timeout. Only where the note cannot
        block (a Pipe the peer has not emptied: it is far behind and finds out at the timeout)."""
        for peer, conn in self._links.items():
            if peer in self._dead or not hasattr(conn, "fileno"):
                continue
            with self._send_locks[peer]:
                try:
                    if select.select([], [conn], [], 0)[1]:
                        wire.send(conn, self._run_id, RETURNED_CONTEXT, 0, None)
                except (OSError, ValueError):  # the peer is gone: nobody to tell
                    self._mark_dead(peer)

    def _check_no_pending(self, what: str) -> None:
        if self._nb is not None:
            self._nb.check_caller(what)

    def _wait_readable(self, peer: int) -> None:
        """In the background thread, wait for bytes from ``peer`` in slices, so that the end of
        the run can cancel it (a blocking read could not be interrupted)."""
        nb = self._nb
        if nb is None or threading.get_ident() != nb.ident:
            return
        conn = self._links[peer]
        while not conn.poll(CANCEL_POLL_S):
            if nb.cancelled.is_set():
                raise Cancelled(f"rank {self.rank}: a non-blocking collective was still waiting for rank {peer} "
                                "when the run ended")

    def _ready_blocking(self) -> list:
        """Neighbours with bytes waiting, blocking until there is one, in slices: the end of the
        run can cancel the background thread, and once another thread receives too, the bytes
        this one waits for may already have been read for it (then this returns [])."""
        nb = self._nb
        in_background = nb is not None and nb.ident == threading.get_ident()
        while not (ready := self._ready(CANCEL_POLL_S if self._readers.alone() else THREADED_WAIT_S)):
            if in_background and nb.cancelled.is_set():
                raise Cancelled(f"rank {self.rank}: a non-blocking collective was still waiting when the run ended")
            if not self._readers.alone():
                return []
        return ready

    @property
    def stats(self) -> Stats:
        """This rank's traffic so far in the run (row ``rank`` of the cluster's Stats)."""
        out = Stats(self.size)
        out.bytes[self.rank] = self._sent_bytes
        out.messages[self.rank] = self._sent_msgs
        out.header_bytes[self.rank] = self._sent_header
        return out

    @property
    def neighbors(self) -> list[int]:
        return sorted(self._links)

    def now(self) -> float:
        """Seconds since the run started; the same clock on every rank."""
        return time.perf_counter() - self._t0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Free(self):
        raise ValueError("the world communicator cannot be freed (MPI: MPI_ERR_COMM)")

    def __getattr__(self, name):
        # only reached for names the class does not define
        if name in MPI4PY_COMM_METHODS:
            raise NotImplementedError(f"Comm.{name} is part of mpi4py but not of course_lib "
                                      "(see course_lib.runtime.mpi_names for what is)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- ranks of this communicator (world ranks: the identity) --------------------------------
    def _to_world(self, peer, what: str, any_source: bool = False) -> int:
        """Check a rank given by the program; return it as a plain int."""
        if type(peer) is int and peer in self._links:
            return peer  # the common case, checked first because every message pays for it
        peer = as_rank(peer, what, self.rank)
        if peer == PROC_NULL or (any_source and peer == ANY_SOURCE) or peer == self.rank:
            return peer
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {what}={peer} is not a rank (0..{self.size - 1})")
        if peer not in self._links:
            raise ValueError(
                f"rank {self.rank}: rank {peer} is not a neighbour in this topology "
                f"(neighbours: {self.neighbors}); messages only travel along graph edges"
            )
        return peer

    @staticmethod
    def _from_world(world_rank: int) -> int:
        return world_rank

    # -- course_lib's own point to point ------------------------------------------------
    def recv_any(self, tag: int = ANY_TAG):
        """Receive from whichever neighbour sends first; return ``(source, obj)``."""
        status = Status()
        obj = self.recv(source=ANY_SOURCE, tag=tag, status=status)
        return status.source, obj

    def barrier(self) -> None:
        """Wait until every rank has called ``barrier()``.

        Served by the launching process over the control Pipes, so it works on any
        topology. Raises :class:`PeerReturned` if a rank's function returned in this run
        (before or while the others wait): it can never arrive. (Lesson 02 builds barriers
        from messages: token ring, dissemination.)
        """
        start = time.perf_counter()
        self._control.send(BarrierArrived(self.rank))
        reply = self._control.recv()
        if isinstance(reply, BarrierFailed):  # a rank returned from its function: it cannot arrive
            raise PeerReturned(self.rank, list(reply.returned), "a barrier")
        if not isinstance(reply, BarrierRelease):  # pragma: no cover - protocol error
            raise RuntimeError(f"rank {self.rank}: unexpected control message {reply!r}")
        self._tracer.add("wait", start, time.perf_counter(), "barrier")

    def progress(self, done: int, total: int) -> None:
        """Report progress (``done`` of ``total`` steps); the caller's cell shows a progress bar.

        Cheap to call every step: updates reach the launching process at most ten times a second.
        """
        now = time.perf_counter()
        if done >= total or now - self._last_progress >= 0.1:
            self._last_progress = now
            if self._control is not None:
                self._control.send(Progress(self.rank, int(done), int(total)))

    @contextmanager
    def compute(self, label: str = "compute"):
        """Trace a compute phase. Stragglers are slowed here and faults fire here."""
        step = self.step
        self.step += 1
        fault = self._fault
        if fault is not None and fault.label is not None:
            if fault.label != label:
                fault = None
            else:
                step = self._label_steps.get(label, 0)
                self._label_steps[label] = step + 1
        if fault is not None and fault.step == step:
            self.logger.warning("injected fault %r at compute step %d (%s)", fault.kind, step, label)
            fault.trigger(self.rank)
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            if self._slow > 1.0:
                time.sleep((self._slow - 1.0) * (end - start))
                end = time.perf_counter()
            self._tracer.add("compute", start, end, label)

    # -- the engine: sending (world ranks) -----------------------------------------------
    def _stamp(self, dest: int, start: float, busy_until: list):
        if self._instant:
            return None

        def stamp(nbytes):
            transmit, latency = self._network.cost(self.rank, dest, nbytes)
            busy_until.append(start + transmit)
            return start + transmit + latency

        return stamp

    def _send(self, obj, dest: int, tag: int, context: int, sync_id: int | None = None) -> None:
        if self._senders[dest].queue:  # isends to dest are still queued: go after them
            self._isend(obj, dest, tag, context, sync_id).wait()
            return
        with self._send_locks[dest]:
            self._write(obj, dest, tag, context, sync_id)

    def _write(self, obj, dest: int, tag: int, context: int, sync_id: int | None) -> None:
        """Put one message in the Pipe to ``dest`` (the caller holds its send lock); count it."""
        self._check_no_pending("a send")
        conn = self._links[dest]
        tracer = self._tracer
        # the clock is read only when a trace or the emulated network needs it
        start = _now() if tracer.enabled or not self._instant else 0.0
        busy_until: list = []
        blocked = [] if tracer.enabled else None  # spells the write waited for dest to read
        try:
            payload, header = wire.send(conn, self._run_id, context, tag, obj,
                                        None if self._instant else self._stamp(dest, start, busy_until), sync_id,
                                        blocked)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
            self._mark_dead(dest)
            raise PeerLost(dest, "send") from exc
        if busy_until:  # the emulated link is busy for nbytes / bandwidth
            _sleep_until(busy_until[0], self._spin_waits)
        self._sent_bytes[dest] += payload
        self._sent_msgs[dest] += 1
        self._sent_header[dest] += header
        if tracer.enabled:
            self._trace_send(start, _now(), dest, payload, blocked)

    def _trace_send(self, start: float, end: float, dest: int, payload: int, blocked: list) -> None:
        """Trace one message's write: "send" while bytes move (or the emulated link transmits),
        "wait" (label "receiver") while the write was blocked because ``dest`` did not read.

        Without a blocked spell (the usual case) that is one "send" event. Otherwise the
        spells become "wait" events and the time around them "send" events, the first of
        which carries the payload's bytes (the others 0): the events never overlap.
        """
        tracer = self._tracer
        cursor, first = start, True
        for b_start, b_end in blocked:
            if b_start > cursor:
                tracer.add("send", cursor, b_start, "", dest, payload if first else 0)
                first = False
            tracer.add("wait", b_start, b_end, "receiver", dest)
            cursor = b_end
        if first or end > cursor:
            tracer.add("send", cursor, max(end, cursor), "", dest, payload if first else 0)

    def _isend(self, obj, dest: int, tag: int, context: int, sync_id: int | None = None) -> QueuedSend:
        """Queue a message for ``dest``'s sender thread and return at once (nonblocking.py)."""
        self._check_no_pending("a send")
        return self._senders[dest].put(QueuedSend(obj, tag, context, sync_id))

    def _write_queued(self, dest: int, job: QueuedSend) -> None:
        """Called by ``dest``'s sender thread for each queued message, in order."""
        with self._send_locks[dest]:
            if job.context == ACK_CONTEXT:
                self._write_ack(dest, job.obj)
            else:
                self._write(job.obj, dest, job.tag, job.context, job.sync_id)

    def _send_to_self(self, obj, tag: int, context: int, sync_id: int | None) -> None:
        """Buffer a message to my own rank (MPI does): a copy, as if it had crossed a Pipe."""
        self._check_no_pending("a send")
        body = wire.dumps(obj)
        msg = wire.Message(self._run_id, context, tag, 0.0, pickle.loads(body), len(body), len(body), sync_id,
                           _now())
        msg.source = self.rank
        with self._inbox:
            self._arrive(msg)

    def _new_sync_id(self) -> int:
        return next(self._sync_ids)

    def _acknowledge(self, msg) -> None:
        """The receiver matched a synchronous message: tell its sender."""
        if msg.source == self.rank:
            self._acked.add(msg.sync_id)
            return
        sender = self._senders[msg.source]
        if sender.queue:  # behind queued sends, without waiting: the receiver must not block here
            sender.put(QueuedSend(msg.sync_id, 0, ACK_CONTEXT))
            return
        with self._send_locks[msg.source]:
            self._write_ack(msg.source, msg.sync_id)

    def _write_ack(self, dest: int, sync_id: int) -> None:
        """Write an acknowledgement (the caller holds ``dest``'s send lock): counted as header bytes."""
        try:
            payload, header = wire.send(self._links[dest], self._run_id, ACK_CONTEXT, 0, sync_id)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
            self._mark_dead(dest)
            raise PeerLost(dest, "send") from exc
        self._sent_header[dest] += payload + header

    def _ack_arrived(self, sync_id: int, dest: int, block: bool) -> bool:
        """Has ``dest`` matched my synchronous send ``sync_id``? (``block``: wait until it has.)"""
        # Read every link, not only dest's: while we wait, our own posted irecvs must keep
        # matching (and acknowledging) what others send, or a ring of ssends would deadlock.
        if sync_id not in self._acked:
            self._read_from(ANY_SOURCE, block=False)
        while block and sync_id not in self._acked:
            if dest == self.rank:
                raise Deadlock(f"rank {self.rank}: a synchronous send to itself completes only once a "
                               "receive matches it; post an irecv first (MPI would block forever)")
            if dest in self._dead:
                raise PeerLost(dest, "ssend")
            if dest in self._returned:
                raise PeerReturned(self.rank, [dest], "a synchronous send")
            self._read_from(ANY_SOURCE, block=True)
        if sync_id in self._acked:
            self._acked.discard(sync_id)
            return True
        return False

    # -- the engine: receiving (world ranks) ----------------------------------------------
    # Any thread may receive (a threaded parameter server does). Each link is read by one thread
    # at a time, holding its read lock while it reads one whole message and lets it arrive, so a
    # sender's messages keep their order; _pending and _posted are guarded by _inbox. A thread
    # alone in reading may block in a read (the common case: no system call added). Once a second
    # thread has read (in this run), none waits for bytes holding a lock: each waits for bytes in
    # slices of THREADED_WAIT_S and looks again in _pending, where another thread may have put its
    # message. (Not "while two read": a thread that found itself alone and then waited for a
    # link's read lock may find its message already read by a thread now gone.)
    def _match(self, source, tag, context, pop=True):
        self._check_no_pending("a receive")
        if not self._pending:  # (a message another thread queues just now is found on the next look)
            return None
        with self._inbox:
            for i, m in enumerate(self._pending):
                if (source == ANY_SOURCE or m.source == source) and (tag == ANY_TAG or m.tag == tag) \
                        and m.context == context:
                    if pop:
                        del self._pending[i]
                    return m
        return None

    def _arrive(self, msg) -> None:
        """A message has arrived: the first posted irecv that matches it takes it, else it waits.
        (The caller holds ``_inbox``.)"""
        if self._posted:
            for i, posted in enumerate(self._posted):
                if posted.matches(msg):
                    del self._posted[i]
                    posted.msg = msg
                    if msg.sync_id is not None:
                        self._acknowledge(msg)
                    return
        self._pending.append(msg)

    def _read_one(self, peer: int, wait: bool = True) -> bool:
        """Read one message from ``peer`` and let it arrive; return whether one was read.

        With ``wait``, a thread alone in a receive blocks until the message comes; otherwise
        this reads only bytes that are there (waiting THREADED_WAIT_S for them with ``wait``)
        and gives up if another thread is reading the link (see the section's comment)."""
        self._readers.note()
        lock = self._read_locks[peer]
        if wait and self._readers.alone():
            with lock:
                if self._readers.alone():  # no other thread could take my message meanwhile
                    self._take(self._read_message(peer))
                    return True
        conn, slice_s = self._links[peer], (THREADED_WAIT_S if wait else 0)
        if not conn.poll(slice_s) or not lock.acquire(True, slice_s):
            return False
        try:
            if not conn.poll(0):  # another thread read them first
                return False
            self._take(self._read_message(peer))
            return True
        finally:
            lock.release()

    def _take(self, msg) -> None:
        """Let a message read from a link arrive (the caller holds that link's read lock)."""
        if msg is not None:
            with self._inbox:
                self._arrive(msg)

    def _read_message(self, peer: int):
        """Read one message from ``peer``: None if it was an acknowledgement or a straggler."""
        self._wait_readable(peer)
        try:
            msg = wire.recv(self._links[peer])
        except (EOFError, ConnectionResetError, OSError) as exc:
            self._mark_dead(peer)
            raise PeerLost(peer) from exc
        if msg.run_id != self._run_id:  # drop stragglers from an earlier, aborted run
            return None
        if msg.context == ACK_CONTEXT:
            self._acked.add(msg.obj)
            return None
        if msg.context == RETURNED_CONTEXT:  # the last message from peer in this run
            self._returned.add(peer)
            return None
        msg.source, msg.read_end = peer, _now()
        if self._downlink is not None and msg.ready_at:  # the emulated network stamped it
            # my downlink takes it after the messages read before it (incast, see netem.py)
            transmit, _ = self._network.cost(peer, self.rank, msg.nbytes)
            msg.ready_at = self._downlink.deliver(msg.ready_at, transmit)
        return msg

    def _mark_dead(self, peer: int) -> None:
        if peer not in self._dead:
            self._dead.add(peer)
            if self._selector is not None:
                try:
                    self._selector.unregister(self._links[peer])
                except (KeyError, ValueError, OSError):
                    pass

    def _ready(self, timeout):
        """Neighbours with bytes waiting (one select call on all live links)."""
        if self._selector is not None:
            return [key.data for key, _ in self._selector.select(timeout)]
        live = {self._links[p]: p for p in self._links if p not in self._dead}
        if not live:
            return []
        return [live[c] for c in wait_for(list(live), timeout=timeout)]

    def _drain_available(self) -> None:
        for peer in self._ready(0):
            self._read_one(peer, wait=False)

    def _progress(self, timeout: float) -> None:
        """Read whatever arrives within ``timeout`` seconds (used while waiting on many requests)."""
        for peer in self._ready(timeout):
            self._read_one(peer, wait=False)

    def _read_from(self, source: int, block: bool, until=None) -> bool:
        """Read from ``source`` (a world rank or ANY_SOURCE): if ``block``, one message (or one
        round of the ready links); else whatever is there now, stopping early once ``until()``.
        Raises Deadlock / PeerLost / PeerReturned when nothing can ever arrive. Returns whether
        ``until()``."""
        if not block:
            if source == ANY_SOURCE or self._posted:
                self._drain_available()
            elif source in self._links and source not in self._dead:
                # only this link: a dead *other* neighbour must not disturb a poll of this one
                while self._links[source].poll(0) and self._read_one(source, wait=False):
                    if until is not None and until():
                        return True
            return until is not None and until()
        self._check_something_can_come(source)
        if source != ANY_SOURCE and not self._posted:
            self._read_one(source)  # a blocking read: the time until bytes arrive is "wait"
            return until is not None and until()
        # Any link: with irecvs posted, a message from another rank may be the one they wait for.
        for peer in self._ready_blocking():
            self._read_one(peer)
        return until is not None and until()

    def _check_something_can_come(self, source: int) -> None:
        """Raise if no message can ever come from ``source`` (a world rank or ANY_SOURCE)."""
        if source == self.rank:
            raise Deadlock(f"rank {self.rank}: receive from itself, but no matching message was sent to "
                           "itself (MPI would block forever)")
        if source != ANY_SOURCE:
            if source in self._dead:
                raise PeerLost(source)
            if source in self._returned:
                raise PeerReturned(self.rank, [source], "a receive")
            return
        if not self._links:
            raise Deadlock(f"rank {self.rank}: nothing can arrive (no other rank, nothing sent to myself)")
        if len(self._dead) == len(self._links):
            raise PeerLost(-1, "recv: no live neighbour left")
        if self._returned and len(self._dead | self._returned) == len(self._links):
            raise PeerReturned(self.rank, sorted(self._returned), "a receive from any source")

    def _peek(self, source: int, tag: int, context: int, block: bool):
        """The message a receive would take now, without taking it (None if none, unless ``block``)."""
        msg = self._match(source, tag, context, pop=False)
        if msg is not None:
            return msg
        if not block:
            self._read_from(source, block=False,
                            until=lambda: self._match(source, tag, context, pop=False) is not None)
            return self._match(source, tag, context, pop=False)
        while msg is None:
            self._read_from(source, block=True)
            msg = self._match(source, tag, context, pop=False)
        return msg

    def _post_recv(self, source: int, tag: int, context: int) -> _PostedRecv:
        """irecv: take a waiting message now, or queue the receive for the next one that matches."""
        posted = _PostedRecv(source, tag, context)
        with self._inbox:  # a message read meanwhile by another thread goes to the posted receive
            msg = self._match(source, tag, context)
            if msg is None:
                self._posted.append(posted)
                return posted
        posted.msg = msg
        if msg.sync_id is not None:
            self._acknowledge(msg)
        return posted

    def _posted_done(self, posted: _PostedRecv, block: bool) -> bool:
        """Has the posted receive got its message? (``block``: read until it has.)"""
        if posted.msg is None:
            self._read_from(ANY_SOURCE, block=False)  # MPI's test makes progress on everything
        while block and posted.msg is None:
            self._read_from(posted.source, block=True)
        if posted.msg is not None and posted.msg.ready_at > _now():
            if not block:
                return False
            _sleep_until(posted.msg.ready_at, self._spin_waits)  # the emulated network has not delivered it yet
        return posted.msg is not None

    def _recv(self, source: int, tag: int, context: int):
        """Block until a matching message is delivered; return (source, tag, obj)."""
        msg = self._recv_message(source, tag, context)
        return msg.source, msg.tag, msg.obj

    def _recv_message(self, source: int, tag: int, context: int):
        """Block until a matching message is delivered; return it (a :class:`wire.Message`)."""
        tracer = self._tracer
        if not tracer.enabled:  # the same, minus the bookkeeping of the timeline
            msg = self._wait_for_match(source, tag, context)
            if msg.ready_at and msg.ready_at > _now():  # the emulated network has not delivered it yet
                _sleep_until(msg.ready_at, self._spin_waits)
            return msg
        start = _now()
        try:
            msg = self._wait_for_match(source, tag, context)
        except PeerLost as exc:  # the time spent waiting for a dead peer is still waiting
            tracer.add("wait", start, _now(), "peer lost", exc.rank)
            raise
        # Blocked until the bytes started to arrive: "wait"; reading them: "recv";
        # then, on an emulated network, waiting for the modelled delivery time: "wait".
        read_start, read_end = max(msg.read_start, start), max(msg.read_end, start)
        if read_start - start > 20e-6:
            tracer.add("wait", start, read_start, "", msg.source)
        tracer.add("recv", read_start, read_end, "", msg.source, msg.nbytes)
        if msg.ready_at > _now():  # the emulated network has not delivered it yet
            _sleep_until(msg.ready_at, self._spin_waits)
            tracer.add("wait", read_end, _now(), "network", msg.source)
        return msg

    def _wait_for_match(self, source: int, tag: int, context: int):
        msg = None
        if not self._pending and not self._posted and source in self._links:  # (checked first: cheap)
            msg = self._direct_read(source, tag, context)
        if msg is None:
            msg = self._match(source, tag, context)
        while msg is None:
            self._read_from(source, block=True)
            msg = self._match(source, tag, context)
        if msg.sync_id is not None:
            self._acknowledge(msg)
        return msg

    def _direct_read(self, source: int, tag: int, context: int):
        """The common case: one thread receiving, nothing queued, one named source (the caller
        checked the last two). Its next message is returned straight away if it matches (no
        other message could match first); None otherwise (then it has arrived in ``_pending``)."""
        self._readers.note()
        if source in self._dead or not self._readers.alone():
            return None
        with self._read_locks[source]:
            if self._pending or not self._readers.alone():  # changed while waiting for the lock
                return None
            msg = self._read_message(source)
            if msg is not None and (tag == ANY_TAG or msg.tag == tag) and msg.context == context:
                return msg
            self._take(msg)
        return None


_now = time.perf_counter

#: Seconds a thread waits for bytes before looking again for its message, while other threads
#: receive too (one of them may have read it).
THREADED_WAIT_S = 0.002


class _Readers:
    """Which threads read the links in this run: ``note()`` before every read. The first thread
    to read is alone until another reads too (at once or later); from then on ``alone()`` is
    False until the run ends (see the receiving section of Comm for why it never goes back)."""

    __slots__ = ("first", "_threaded", "_lock")

    def __init__(self):
        self.first: int | None = None
        self._threaded = False
        self._lock = threading.Lock()

    def note(self) -> None:
        me = threading.get_ident()
        if me != self.first:
            with self._lock:  # two threads reading first at once: one of them is the other
                if self.first is None:
                    self.first = me
                elif self.first != me:
                    self._threaded = True  # set before this thread reads a byte

    def alone(self) -> bool:
        return not self._threaded


def _sleep_until(t: float, spin: bool = True) -> None:
    """Sleep until perf_counter() reaches t: sleep, then, with ``spin``, spin the last half
    millisecond (a sleep may overshoot by tens of microseconds; a spin does not, but it holds
    a core, and yielding it instead hands it away for a whole time slice: 2 ms became 7 ms)."""
    remaining = t - time.perf_counter()
    if not spin:
        if remaining > 0:
            time.sleep(remaining)
        return
    if remaining > 1e-3:
        time.sleep(remaining - 5e-4)
    while time.perf_counter() < t:
        pass
