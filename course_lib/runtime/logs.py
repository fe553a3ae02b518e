"""Worker logs in the notebook cell, tagged with the rank.

Workers are separate processes: their ``logging`` records and ``print`` output must
travel to the parent to be seen. They travel on the worker's control Pipe, under every
start method, interleaved with the control messages in the order they were made:

* the worker sends each record (each complete line of ``print``) as it is made, as a
  :class:`LogLine`, and the send returns only once the line is in the Pipe: there is no
  queue or feeder thread that a stopped worker could leave holding records, no thread in
  the parent to leak, and no descriptor besides the control Pipe;
* after each run the worker flushes a last partial line, then sends its result: every
  line of the run is ahead of the result in the Pipe, so the parent has shown them all
  by the time ``run()`` returns. A stopping worker ends with the marker ``LogEnd()``;
* the parent reads these messages in the loop that waits for control messages, and
  writes each line to ``sys.stdout`` *as it arrives*, so in Jupyter the lines appear in
  the cell that is running, while the run is still going.

A worker thread also waits for the launching process to die, on the sentinel that
multiprocessing gives every child (a pipe whose other end the launcher holds): it
becomes readable when the launcher exits, even if it stays a zombie that nobody reaps
(:func:`exit_when_parent_leaves`).
"""
from __future__ import annotations

import io
import logging
import multiprocessing as mp
import os
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for


# ------------------------------------------------------------------ what travels
@dataclass(frozen=True)
class LogLine:
    """One log record, or one line a worker printed (``is_print``), as text."""
    level: str
    text: str
    is_print: bool = False


@dataclass(frozen=True)
class LogEnd:
    """The last message of a stopping worker: every line it printed or logged is ahead of it."""


def format_line(rank: int, line: LogLine) -> str:
    return f"[rank {rank}] {line.text}" if line.is_print else f"[rank {rank}] {line.level} {line.text}"


# ------------------------------------------------------------------ parent side
def show(rank: int, line: LogLine) -> None:
    """Write a worker's line to whatever ``sys.stdout`` is now (the running cell in Jupyter)."""
    try:
        sys.stdout.write(format_line(rank, line) + "\n")
        sys.stdout.flush()
    except Exception:  # a closed or broken stdout in the parent must not stop the run
        pass


# ------------------------------------------------------------------ worker side
class ControlPipe:
    """A worker's end of its control Pipe, safe to send on from several threads.

    Log lines are sent by whichever thread prints, control messages (a barrier, progress)
    by whichever thread calls the communicator: one lock keeps two messages from mixing
    their bytes. Receiving is the main loop's and the communicator's, one at a time.
    """

    def __init__(self, conn):
        self._conn = conn
        # Reentrant: a line logged while a message is being pickled is sent whole, before it
        self._send_lock = threading.RLock()

    def send(self, msg) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def send_bytes(self, data) -> None:
        with self._send_lock:
            self._conn.send_bytes(data)

    def recv(self):
        return self._conn.recv()

    def recv_bytes(self) -> bytes:
        return self._conn.recv_bytes()

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self._conn.poll(timeout)

    def close(self) -> None:
        self._conn.close()


class ChannelHandler(logging.Handler):
    """A worker's logging handler: each record goes to the parent at once, on the control Pipe."""

    def __init__(self, pipe: ControlPipe, rank: int):
        super().__init__()
        self._pipe = pipe
        self._parent_gone = False
        self.addFilter(_RankFilter(rank))

    def emit(self, record):
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
        except Exception:
            text = f"<a log record that cannot be formatted: {record.msg!r}>"
        self.send(LogLine(record.levelname, text, getattr(record, "is_print", False)))

    def send(self, msg) -> None:
        if self._parent_gone:
            return
        try:
            self._pipe.send(msg)
        except (OSError, ValueError):
            # The parent is gone: nobody can see the line. Never handleError() here: it
            # writes to sys.stderr, which leads back here.
            self._parent_gone = True


class _RankFilter(logging.Filter):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def filter(self, record):
        record.rank = self.rank
        return True


class PrintToLog(io.TextIOBase):
    """A worker's sys.stdout/sys.stderr: each complete line becomes a log record."""

    def __init__(self, logger: logging.Logger, level: int):
        self._logger, self._level, self._buf = logger, level, ""

    def writable(self):
        return True

    def write(self, text):
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self._logger.log(self._level, line, extra={"is_print": True})
        return len(text)

    def flush(self):
        if self._buf:
            line, self._buf = self._buf, ""
            self._logger.log(self._level, line, extra={"is_print": True})


@dataclass
class WorkerOutput:
    """What a worker installed to route its output: put back before each run, flushed after."""
    handler: ChannelHandler
    stdout: PrintToLog
    stderr: PrintToLog

    def install(self) -> None:
        """(Re)install the worker's streams: the code of a run may have replaced or closed them."""
        sys.stdout, sys.stderr = self.stdout, self.stderr

    def flush(self) -> None:
        """Send a last partial line: everything printed so far is then in the Pipe."""
        self.stdout.flush()
        self.stderr.flush()

    def end(self) -> None:
        """The worker stops: its last lines, then the marker that nothing follows."""
        self.flush()
        self.handler.send(LogEnd())


def setup_worker_logging(pipe: ControlPipe, rank: int, level: int = logging.INFO) -> tuple[logging.Logger,
                                                                                           WorkerOutput]:
    """Worker side: route root-logger records and print() to the parent through ``pipe``."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = ChannelHandler(pipe, rank)
    root.addHandler(handler)
    root.setLevel(level)
    output = WorkerOutput(handler, PrintToLog(logging.getLogger("stdout"), logging.INFO),
                          PrintToLog(logging.getLogger("stderr"), logging.WARNING))
    output.install()
    return logging.getLogger(f"rank{rank}"), output


def exit_when_parent_leaves(on_exit) -> None:
    """Wait (in a thread of the worker) until the launching process is gone, then exit.

    multiprocessing gives each child a sentinel: the read end of a pipe whose write end only
    the launcher holds (under fork, spawn and forkserver alike). It becomes readable when
    the launcher exits, whether or not anybody reaps it; polling its pid would take a zombie
    for alive. ``on_exit`` frees what the worker owns first.
    """
    parent = mp.parent_process()
    if parent is None or parent.sentinel is None:
        return
    wait_for([parent.sentinel])
    on_exit()
    os._exit(1)
