"""Non-blocking collectives: ``iallreduce`` progressing in a background thread.

MPI's ``MPI_Iallreduce`` returns at once with a request; the reduction goes on while the
caller computes, and ``wait`` returns when it is done. PyTorch DDP relies on exactly this to
overlap a bucket's allreduce with the rest of backward (Li et al., "PyTorch Distributed",
VLDB 2020). An MPI library progresses such operations in its own calls or in a progress thread;
NCCL on a separate CUDA stream. course_lib does as a progress thread would: every rank's engine
has one background thread that runs the started collectives **one at a time, in the order they
were started** (as a stream does), with the same algorithms, tags and byte counts as the
blocking ones. Every rank must start its non-blocking collectives in the same order, as MPI
requires.

What course_lib lacks: while a request is pending, the thread that started it may compute,
start more ``iallreduce`` and ``test``/``wait``, but any other communication on that rank
raises :class:`PendingCollective` (a NotImplementedError): MPI allows it, but here it would let
two threads read the same Pipes. Wait for the requests first.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

from .p2p import Request, _Operation

#: Seconds between checks of the cancel flag while the progress thread waits for bytes.
CANCEL_POLL_S = 0.05


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
