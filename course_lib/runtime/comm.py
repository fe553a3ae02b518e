"""The communicator each worker gets: point-to-point messages over Pipes, traced and counted.

Names follow mpi4py's lowercase object interface (``send``, ``recv``, ``sendrecv``,
``isend``, ``iprobe``, ``barrier``), so programs read like MPI programs. Collective
operations (``bcast``, ``allreduce``, ...) come from :class:`CollectivesMixin`.

Every message carries an envelope ``(run_id, context, tag, ready_at)``:
``context`` separates sub-communicators, ``tag`` lets a receiver pick a message,
``ready_at`` is when the emulated network delivers it. Messages that arrive before
anyone asks for them wait in ``_pending`` (as MPI's unexpected-message queue).
"""
from __future__ import annotations

import logging
import selectors
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import wait as wait_for

from . import wire
from .collective_api import CollectivesMixin
from .constants import ANY_SOURCE, ANY_TAG, MAX_TAG
from .groups import GroupMethods
from .netem import Network
from .trace import Stats, Tracer



class PeerLost(ConnectionError):
    """The peer at the other end of a Pipe died (its process is gone); ``.rank`` names it."""

    def __init__(self, rank: int, during: str = "recv"):
        super().__init__(f"rank {rank} is gone (its Pipe closed during {during})")
        self.rank = rank


class Status:
    """Filled by ``recv(..., status=s)``: the ``source`` and ``tag`` of the message."""

    def __init__(self):
        self.source = ANY_SOURCE
        self.tag = ANY_TAG

    def Get_source(self):
        return self.source

    def Get_tag(self):
        return self.tag


class Request:
    """A background send; ``wait()`` returns when the bytes are in the Pipe."""

    def __init__(self, thread: threading.Thread, box: list):
        self._thread, self._box = thread, box

    def wait(self):
        self._thread.join()
        if self._box:
            raise self._box[0]

    def test(self) -> bool:
        return not self._thread.is_alive()


class _Message:
    __slots__ = ("source", "context", "tag", "obj", "ready_at", "nbytes", "read_start", "read_end")

    def __init__(self, source, context, tag, obj, ready_at, nbytes, read_start, read_end):
        self.source, self.context, self.tag = source, context, tag
        self.obj, self.ready_at, self.nbytes = obj, ready_at, nbytes
        self.read_start, self.read_end = read_start, read_end


class Comm(CollectivesMixin, GroupMethods):
    """One rank's view of the cluster.

    Parameters are set by the runtime, not by students: ``links`` maps each neighbour's
    rank to a duplex Connection, ``control`` is the Pipe to the launching process.
    """

    def __init__(self, rank: int, size: int, links: dict, control, logger: logging.Logger | None = None):
        self.rank, self.size = rank, size
        self._links = links
        self._send_locks = {r: threading.Lock() for r in links}
        self._control = control
        self._dead: set[int] = set()
        self._selector = None
        if links and hasattr(links[next(iter(links))], "fileno") and sys.platform != "win32":
            self._selector = selectors.DefaultSelector()
            for peer, conn in links.items():
                self._selector.register(conn, selectors.EVENT_READ, peer)
        self.logger = logger or logging.getLogger(f"rank{rank}")
        self._begin_run(0, time.perf_counter(), Network(), {}, {}, True)

    # -- run bookkeeping (called by the runtime) ------------------------------
    def _begin_run(self, run_id, t0, network, slow, faults, trace):
        self._run_id, self._t0 = run_id, t0
        self._network = network
        self._instant = network.is_instant
        self._slow = float(slow.get(self.rank, 1.0))
        self._fault = faults.get(self.rank)
        self._pending: deque[_Message] = deque()
        # plain Python counters per destination: cheaper per message than numpy items
        self._sent_bytes = [0] * self.size
        self._sent_msgs = [0] * self.size
        self._sent_header = [0] * self.size
        self._tracer = Tracer(self.rank, t0, enabled=trace)
        self._last_progress = 0.0
        self.step = 0
        self._label_steps: dict = {}      # label -> compute phases so far, for Fault(label=...)

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

    # -- validation ------------------------------------------------------------
    def _check_peer(self, peer, what: str, allow_any: bool = False) -> None:
        if type(peer) is int and (peer in self._links or (allow_any and peer == ANY_SOURCE)):
            return  # the common case, checked first because every message pays for it
        if isinstance(peer, bool) or not isinstance(peer, int):
            raise TypeError(f"rank {self.rank}: {what} must be an int rank, got {peer!r}")
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {what}={peer} is not a rank (0..{self.size - 1})")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank}: cannot {what.split('=')[0]} to/from itself (rank {peer})")
        if peer not in self._links:
            raise ValueError(
                f"rank {self.rank}: rank {peer} is not a neighbour in this topology "
                f"(neighbours: {self.neighbors}); messages only travel along graph edges"
            )

    @staticmethod
    def _check_tag(tag, allow_any: bool = False) -> None:
        if type(tag) is int and (0 <= tag < MAX_TAG or (allow_any and tag == ANY_TAG)):
            return
        if isinstance(tag, bool) or not isinstance(tag, int) or (tag < 0 and not (allow_any and tag == ANY_TAG)):
            raise ValueError(f"tag must be an int in [0, {MAX_TAG}), got {tag!r}")

    # -- point to point --------------------------------------------------------
    def send(self, obj, dest: int, tag: int = 0) -> None:
        """Send ``obj`` to rank ``dest`` (blocks until the bytes are in the Pipe)."""
        self._check_peer(dest, "dest")
        self._check_tag(tag)
        self._send(obj, dest, tag, 0)

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None):
        """Receive the next message from ``source`` (any neighbour by default) with ``tag``."""
        if buf is not None and not isinstance(buf, (bytearray, memoryview)):
            # mpi4py's first positional argument is a buffer; catch recv(1) meaning recv(source=1).
            raise TypeError("recv(source) must be given by keyword: comm.recv(source=1)")
        self._check_peer(source, "source", allow_any=True)
        self._check_tag(tag, allow_any=True)
        src, got_tag, obj = self._recv(source, tag, 0)
        if status is not None:
            status.source, status.tag = src, got_tag
        return obj

    def recv_any(self, tag: int = ANY_TAG):
        """Receive from whichever neighbour sends first; return ``(source, obj)``."""
        self._check_tag(tag, allow_any=True)
        src, _, obj = self._recv(ANY_SOURCE, tag, 0)
        return src, obj

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> bool:
        """True if a matching message can be received now (never blocks)."""
        self._check_peer(source, "source", allow_any=True)
        self._check_tag(tag, allow_any=True)
        if self._match(source, tag, 0, pop=False) is not None:
            return True
        if source == ANY_SOURCE:
            self._drain_available()
        elif source not in self._dead:
            # only this link: a dead *other* neighbour must not disturb a poll of this one
            while self._links[source].poll(0):
                self._read_one(source)
                if self._match(source, tag, 0, pop=False) is not None:
                    return True
        return self._match(source, tag, 0, pop=False) is not None

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        """Send in a background thread; call ``.wait()`` on the result."""
        self._check_peer(dest, "dest")
        self._check_tag(tag)
        return self._isend(obj, dest, tag, 0)

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None):
        """Send to ``dest`` and receive from ``source`` at once, without deadlock."""
        self._check_peer(dest, "dest")
        self._check_peer(source, "source", allow_any=True)
        req = self._isend(sendobj, dest, sendtag, 0)
        src, got_tag, obj = self._recv(source, recvtag, 0)
        req.wait()
        if status is not None:
            status.source, status.tag = src, got_tag
        return obj

    def barrier(self) -> None:
        """Wait until every rank has called ``barrier()``.

        Served by the launching process over the control Pipes, so it works on any
        topology. (Lesson 02 builds barriers from messages: token ring, dissemination.)
        """
        start = time.perf_counter()
        self._control.send(("barrier", self.rank))
        reply = self._control.recv()
        if reply != ("barrier_go",):  # pragma: no cover - protocol error
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
                self._control.send(("progress", self.rank, int(done), int(total)))

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

    # -- internals used by collectives ----------------------------------------
    def _stamp(self, dest: int, start: float, busy_until: list):
        if self._instant:
            return None

        def stamp(nbytes):
            transmit, latency = self._network.cost(self.rank, dest, nbytes)
            busy_until.append(start + transmit)
            return start + transmit + latency

        return stamp

    def _send(self, obj, dest: int, tag: int, context: int) -> None:
        conn = self._links[dest]
        tracer = self._tracer
        with self._send_locks[dest]:
            # the clock is read only when a trace or the emulated network needs it
            start = _now() if tracer.enabled or not self._instant else 0.0
            busy_until: list = []
            try:
                payload, header = wire.send(conn, self._run_id, context, tag, obj,
                                            None if self._instant else self._stamp(dest, start, busy_until))
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
                self._mark_dead(dest)
                raise PeerLost(dest, "send") from exc
            if busy_until:  # the emulated link is busy for nbytes / bandwidth
                _sleep_until(busy_until[0])
            self._sent_bytes[dest] += payload
            self._sent_msgs[dest] += 1
            self._sent_header[dest] += header
            if tracer.enabled:
                tracer.add("send", start, _now(), "", dest, payload)

    def _isend(self, obj, dest: int, tag: int, context: int) -> Request:
        box: list = []

        def run():
            try:
                self._send(obj, dest, tag, context)
            except BaseException as exc:  # re-raised in wait()
                box.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return Request(thread, box)

    def _match(self, source, tag, context, pop=True):
        for i, m in enumerate(self._pending):
            if (source == ANY_SOURCE or m.source == source) and (tag == ANY_TAG or m.tag == tag) \
                    and m.context == context:
                if pop:
                    del self._pending[i]
                return m
        return None

    def _read_one(self, peer: int) -> None:
        """Read one message from ``peer`` into the pending queue."""
        msg = self._read_message(peer)
        if msg is not None:
            self._pending.append(msg)

    def _read_message(self, peer: int) -> _Message | None:
        """Read one message from ``peer`` (None if it is a straggler from an earlier run)."""
        try:
            run_id, context, tag, ready_at, obj, nbytes, read_start = wire.recv(self._links[peer])
        except (EOFError, ConnectionResetError, OSError) as exc:
            self._mark_dead(peer)
            raise PeerLost(peer) from exc
        if run_id == self._run_id:  # drop stragglers from an earlier, aborted run
            return _Message(peer, context, tag, obj, ready_at, nbytes, read_start, _now())
        return None

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
        return [live[c] for c in wait_for(list(live), timeout=timeout)]

    def _drain_available(self) -> None:
        for peer in self._ready(0):
            self._read_one(peer)

    def _recv(self, source: int, tag: int, context: int):
        """Block until a matching message is delivered; return (source, tag, obj)."""
        tracer = self._tracer
        if not tracer.enabled:  # the same, minus the bookkeeping of the timeline
            msg = self._wait_for_match(source, tag, context)
            if msg.ready_at and msg.ready_at > _now():  # the emulated network has not delivered it yet
                _sleep_until(msg.ready_at)
            return msg.source, msg.tag, msg.obj
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
            _sleep_until(msg.ready_at)
            tracer.add("wait", read_end, _now(), "network", msg.source)
        return msg.source, msg.tag, msg.obj

    def _wait_for_match(self, source: int, tag: int, context: int) -> _Message:
        if source != ANY_SOURCE and not self._pending and source not in self._dead:
            # The common case: nothing queued, one named source. Its next message is
            # returned straight away if it matches (no other message could match first).
            msg = self._read_message(source)
            if msg is not None and (tag == ANY_TAG or msg.tag == tag) and msg.context == context:
                return msg
            if msg is not None:
                self._pending.append(msg)
        msg = self._match(source, tag, context)
        while msg is None:
            if source == ANY_SOURCE:
                if len(self._dead) == len(self._links):
                    raise PeerLost(-1, "recv: no live neighbour left")
                for peer in self._ready(None):
                    self._read_one(peer)
            else:
                if source in self._dead:
                    raise PeerLost(source)
                self._read_one(source)  # a blocking read: the time until bytes arrive is "wait"
            msg = self._match(source, tag, context)
        return msg


_now = time.perf_counter


def _sleep_until(t: float) -> None:
    """Sleep until perf_counter() reaches t (sleep, then spin the last half millisecond)."""
    remaining = t - time.perf_counter()
    if remaining > 1e-3:
        time.sleep(remaining - 5e-4)
    while time.perf_counter() < t:
        pass
