"""What runs in the background of a rank: queued sends and non-blocking collectives.

**Sends.** ``isend``/``issend`` never block the caller (as in mpi4py): each peer has a
:class:`PeerSender`, a queue of messages and one thread that writes them into that peer's
Pipe in the order they were queued, so order per (source, destination, tag) is kept. A
Pipe holds about 200 KiB: two ranks that each isend more than that to the other before
receiving would otherwise both block in the write. A blocking ``send`` to a peer whose queue
is not empty joins the queue (it must not overtake the isends before it) and waits for its
turn; otherwise it writes in the caller, with no thread in the way. The thread starts with
the first queued message of a run and ends with the run (:meth:`PeerSender.finish`).

**Collectives.** ``iallreduce`` progresses in a background thread. MPI's ``MPI_Iallreduce``
returns at once with a request; the reduction goes on while the caller computes, and ``wait``
returns when it is done. PyTorch DDP relies on exactly this to overlap a bucket's allreduce
with the rest of backward (Li et al., "PyTorch Distributed", VLDB 2020). An MPI library
progresses such operations in its own calls or in a progress thread; NCCL on a separate CUDA
stream. course_lib does as a progress thread would: every rank's engine has one background
thread that runs the started collectives **one at a time, in the order they were started** (as
a stream does), with the same algorithms, tags and byte counts as the blocking ones. Every rank
must start its non-blocking collectives in the same order, as MPI requires.

What course_lib lacks: while a request is pending, the thread that started it may compute,
start more ``iallreduce`` and ``test``/``wait``, but any other communication on that rank
raises :class:`PendingCollective` (a NotImplementedError): MPI allows it, but here it would let
two threads read the same Pipes. Wait for the requests first.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .p2p import Request, _Operation

#: Seconds between checks of the cancel flag while the progress thread waits for bytes.
CANCEL_POLL_S = 0.05


#: Seconds a rank that returns waits for its queued sends to leave (its peers may still be
#: receiving them); after that the unsent ones are reported as an error.
SEND_DRAIN_S = 1.0


# -- queued sends ---------------------------------------------------------------------------
@dataclass(eq=False)
class QueuedSend:
    """One message in a peer's send queue. ``wait()`` returns once its bytes are in the Pipe and
    raises what the write hit (``test()``: is it done?). ``context`` is the engine's
    ``ACK_CONTEXT`` for the acknowledgement of a synchronous message."""

    obj: object
    tag: int
    context: int
    sync_id: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    waited: bool = False  # a failure nobody waited for is reported at the end of the run

    def test(self) -> bool:
        return self.done.is_set()

    def wait(self) -> None:
        self.done.wait()
        self.waited = True
        if self.error is not None:
            raise self.error


class UnfinishedSends(RuntimeError):
    """A rank returned while messages it queued were unsent, or had failed with nobody waiting."""


class PeerSender:
    """The messages queued for one peer and the thread that writes them, in order.

    ``write(job)`` puts one message in the Pipe (it takes the peer's send lock). ``queue`` is
    not empty from the moment a message is queued until its bytes are written, so a blocking
    send that finds it empty cannot overtake a queued one."""

    def __init__(self, rank: int, dest: int, write: Callable[[QueuedSend], None]):
        self.rank, self.dest, self._write = rank, dest, write
        self.queue: deque[QueuedSend] = deque()
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failed: list[QueuedSend] = []

    def put(self, job: QueuedSend) -> QueuedSend:
        with self._changed:
            self.queue.append(job)
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"rank{self.rank}-send-to-{self.dest}")
                self._thread.start()
            self._changed.notify_all()
        return job

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self.queue and not self._stopping:
                    self._changed.wait()
                if not self.queue:
                    return
                job = self.queue[0]
            try:
                self._write(job)
            except BaseException as exc:  # noqa: BLE001  (raised by the request's wait())
                job.error = exc
                self._failed.append(job)
                if hasattr(exc, "add_note"):
                    exc.add_note(f"rank {self.rank}: isend to rank {self.dest} (tag {job.tag}) failed "
                                 "in the background thread that writes it")
            with self._changed:
                self.queue.popleft()
                self._changed.notify_all()
            job.done.set()

    def finish(self, grace: float) -> list[str]:
        """End of a run: let the queue empty for up to ``grace`` seconds, stop the thread;
        return what went wrong unseen (sends still unsent, failures nobody waited for)."""
        deadline = time.monotonic() + grace
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
            while self.queue and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            unsent = len(self.queue)
        problems = []
        if unsent:
            # The thread is stuck in a write the peer never reads: the worker reports this
            # error and exits, which ends the thread with the process.
            problems.append(f"{unsent} isend(s) to rank {self.dest} still unsent {grace:g} s after the "
                            f"function returned (rank {self.dest} never received them)")
        elif self._thread is not None:
            self._thread.join()
        self._thread = None
        for job in self._failed:
            if not job.waited:
                problems.append(f"isend to rank {self.dest} (tag {job.tag}) failed and nobody waited for "
                                f"it: {type(job.error).__name__}: {job.error}")
        self._failed = []
        return problems


# -- non-blocking collectives ----------------------------------------------------------------
class PendingCollective(NotImplementedError):
    """Communication by the caller while its non-blocking collectives are still in progress."""


class Cancelled(RuntimeError):
    """The progress thread was told to give up (the run ended with requests unfinished)."""


class _CollectiveOp(_Operation):
    """One started collective: done when the progress thread has run it."""

    def __init__(self, job: Callable[[], object], what: str):
        self.job, self.what = job, what
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.value = None

    def poll(self) -> bool:
        if not self.done.is_set():
            return False
        if self.error is not None:
            raise self.error
        return True

    def block(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error

    @property
    def obj(self):
        return self.value


class ProgressThread:
    """The background thread of one rank's engine: runs started collectives in order.

    ``owner`` is the thread that starts them (the worker's main thread): only it is barred
    from other communication while some are pending. After a failure (a peer lost, say) the
    collectives queued behind fail with the same error, as they could not match on the peers."""

    def __init__(self, rank: int):
        self.rank = rank
        self.owner = threading.get_ident()
        self.cancelled = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[_CollectiveOp] = []
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"rank{rank}-collectives", daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, job: Callable[[], object], what: str) -> Request:
        op = _CollectiveOp(job, what)
        self._pending.append(op)
        self._queue.put(op)
        return Request(op)

    def pending(self) -> list[_CollectiveOp]:
        """The started collectives not finished yet (finished ones are dropped)."""
        self._pending = [op for op in self._pending if not op.done.is_set()]
        return self._pending

    def _loop(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            if self._failed is not None:
                op.error = self._failed
            else:
                try:
                    op.value = op.job()
                except BaseException as exc:  # noqa: BLE001  (handed to the waiting caller)
                    op.error = self._failed = exc
            op.done.set()

    def check_caller(self, what: str) -> None:
        """Raise if the owner communicates while collectives are pending (see the module doc)."""
        if threading.get_ident() == self.owner and self.pending():
            raise PendingCollective(
                f"rank {self.rank}: {what} while {len(self._pending)} non-blocking collective(s) "
                f"({self._pending[0].what}, ...) are in progress; course_lib runs them in a background "
                "thread and cannot communicate beside it: wait() for the requests first")

    def finish_run(self) -> int:
        """End of a run: give up on what is still pending; returns how many were. The thread
        stops reading within CANCEL_POLL_S; a new thread serves the next run."""
        unfinished = len(self.pending())
        self.cancelled.set()
        self._queue.put(None)
        self._thread.join(timeout=1.0)
        return unfinished
