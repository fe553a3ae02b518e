"""Worker logs in the notebook cell, tagged with the rank.

Workers are separate processes: their ``logging`` records and ``print`` output must
travel to the parent to be seen. Two transports, because one does not work everywhere:

* fork: ``multiprocessing-logging`` (its handler is inherited by the forked child and
  ships records through a queue read by a thread in the parent);
* spawn / forkserver: nothing is inherited, and multiprocessing-logging raises or drops
  records there, so we use the standard library's ``QueueHandler`` in the worker and a
  ``QueueListener`` thread in the parent.

In the parent the records are written to ``sys.stdout`` *at emit time*, so in Jupyter
they appear in the cell that is running, while the run is still going.
"""
from __future__ import annotations

import io
import logging
import logging.handlers
import queue
import sys
import threading

FORMAT = "[rank %(rank)s] %(levelname)s %(message)s"


class CellHandler(logging.Handler):
    """Write records to whatever ``sys.stdout`` is now (the running cell in Jupyter)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(_RankFormatter())

    def emit(self, record):
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # pragma: no cover - never let logging kill the listener
            self.handleError(record)


class _RankFormatter(logging.Formatter):
    def format(self, record):
        rank = getattr(record, "rank", "?")
        if getattr(record, "is_print", False):
            return f"[rank {rank}] {record.getMessage()}"
        return f"[rank {rank}] {record.levelname} {record.getMessage()}" + (
            "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        )


class _RankFilter(logging.Filter):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def filter(self, record):
        record.rank = self.rank
        return True


class LogRouter:
    """Parent side: receives worker records and writes them to the cell.

    Closing never blocks for long: a worker killed while writing to the queue can leave
    it locked or its count wrong, so we drain for a bounded time and then let go.
    """

    def __init__(self, ctx, start_method: str):
        self.start_method = start_method
        self._sink = CellHandler()
        self._stop = threading.Event()
        if start_method == "fork":
            import multiprocessing_logging

            self._mp_handler = multiprocessing_logging.MultiProcessingHandler("course-logs", sub_handler=self._sink)
            self.channel = self._mp_handler  # inherited by the forked child
            self._thread = None
        else:
            self._mp_handler = None
            self.channel = ctx.Queue()
            self._thread = threading.Thread(target=self._pump, name="course-logs", daemon=True)
            self._thread.start()

    def _pump(self):
        while True:
            try:
                record = self.channel.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            except (EOFError, OSError, ValueError):
                return
            self._sink.handle(record)

    def close(self, wait: float = 1.0):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(wait)
            self.channel.cancel_join_thread()
            self.channel.close()
            self._thread = None
        if self._mp_handler is not None:
            self._mp_handler._is_closed = True  # its thread drains, then exits
            self._mp_handler._receive_thread.join(wait)
            self._mp_handler = None


class _PrintToLog(io.TextIOBase):
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


def setup_worker_logging(channel, rank: int, level: int = logging.INFO) -> logging.Logger:
    """Worker side: route root-logger records and print() to the parent."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    if isinstance(channel, logging.Handler):  # fork: the inherited multiprocessing-logging handler
        handler = channel
    else:
        handler = logging.handlers.QueueHandler(channel)
    handler.addFilter(_RankFilter(rank))
    root.addHandler(handler)
    root.setLevel(level)
    logger = logging.getLogger(f"rank{rank}")
    sys.stdout = _PrintToLog(logging.getLogger("stdout"), logging.INFO)
    sys.stderr = _PrintToLog(logging.getLogger("stderr"), logging.WARNING)
    return logger
