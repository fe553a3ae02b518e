"""Running the checks of one question against a notebook namespace.

``check("ex00_1")`` is what a student calls in a notebook: it runs the visible checks of the
question against the notebook's current code and prints pass/fail with a hint.
The grader calls :func:`run_question` with ``hidden=True`` (visible + instructor checks).
"""
from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Optional

from .registry import Question, get_question, load_lesson

#: Set in the grading subprocess: the notebook's own ``check()`` calls become no-ops there.
GRADING_ENV = "COURSE_GRADING"


class QuestionTimeout(BaseException):
    """Raised by the alarm when a question's checks run past their time limit.

    A BaseException (like KeyboardInterrupt) so that a student's ``except Exception`` does not
    swallow it.
    """


@dataclass
class QuestionResult:
    qid: str
    title: str
    points: float
    max_points: float
    status: str            # passed | failed | not_implemented | missing | error | timeout | crashed
    message: str
    traceback: str = ""
    elapsed: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)

    def pretty(self) -> str:
        head = f"{self.qid} ({self.title})"
        pts = f"{_fmt(self.points)}/{_fmt(self.max_points)} points"
        if self.passed:
            return f"\u2705 {head}: passed ({pts}). {self.message}".rstrip()
        mark = "\u270f\ufe0f " if self.status == "not_implemented" else "\u274c"
        out = f"{mark} {head}: not passed yet ({pts}).\n   {self.message}"
        if self.traceback and self.status in ("error", "crashed"):
            tail = self.traceback.rstrip().splitlines()[-8:]
            out += "\n   Last lines of the traceback:\n" + "\n".join("     " + l for l in tail)
        return out


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@contextmanager
def time_limit(seconds: Optional[float]):
    """Raise :class:`QuestionTimeout` in the main thread after ``seconds`` (Unix only).

    Elsewhere (Windows, non-main threads) it does nothing: the Cluster's own timeouts and the
    grader's watchdog still apply.
    """
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise QuestionTimeout(f"time limit of {seconds:g} s reached")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _remote_text(exc: BaseException) -> str:
    """The text of an exception, including a worker's remote traceback when there is one."""
    parts = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        rt = getattr(exc, "remote_traceback", None)
        if rt:
            parts.append(str(rt))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def _classify(q: Question, exc: BaseException, tb: str, timeout: Optional[float]):
    """(status, message) for an exception raised while checking question ``q``."""
    text = _remote_text(exc)
    if isinstance(exc, QuestionTimeout):
        return "timeout", (f"Timed out: the checks did not finish within {timeout:g} s. "
                           "Look for an infinite loop, or a recv() that no send() ever matches.")
    if isinstance(exc, NotImplementedError) or "NotImplementedError" in text:
        return "not_implemented", ("Not implemented yet: replace the `raise NotImplementedError(...)` "
                                   "line with your code, run that cell, then check again.")
    if type(exc).__name__ == "WorkerTimeout":
        return "timeout", (f"Your worker function did not return in time ({exc}). "
                           "Deadlock? Every recv() needs a matching send().")
    if isinstance(exc, AssertionError):
        msg = str(exc).strip() or "a check failed (no hint given)"
        return "failed", msg
    if isinstance(exc, SystemExit):
        return "error", f"Your code called sys.exit({exc.code!r}); return a value instead."
    if isinstance(exc, KeyboardInterrupt):
        return "error", "Interrupted."
    if isinstance(exc, MemoryError):
        return "error", "Your code ran out of memory (MemoryError)."
    where = ""
    if getattr(exc, "remote_traceback", None):
        last = [l for l in str(exc.remote_traceback).strip().splitlines() if l.strip()]
        where = f" In a worker: {last[-1].strip()}" if last else ""
    return "error", f"Your code raised {type(exc).__name__}: {exc}.{where}".replace("..", ".")


def run_question(q: Question | str, ns: dict, hidden: bool = False,
                 timeout: Optional[float] = None) -> QuestionResult:
    """Run the checks of ``q`` against namespace ``ns``; never raises (except on Ctrl-C)."""
    if isinstance(q, str):
        q = get_question(q)
    t0 = time.perf_counter()
    checks = list(q.visible) + (list(q.hidden) if hidden else [])

    def result(status, message, tb=""):
        pts = q.points if status == "passed" else 0
        return QuestionResult(q.qid, q.title, pts, q.points, status, message, tb,
                              round(time.perf_counter() - t0, 3))

    missing = [n for n in q.names if n not in ns]
    if missing:
        names = ", ".join(f"`{n}`" for n in missing)
        return result("missing", f"{names} not defined: run (or restore) the cell that defines it.")
    try:
        with time_limit(timeout):
            for fn in checks:
                fn(ns)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - student code can raise anything
        tb = traceback.format_exc()
        status, msg = _classify(q, exc, tb, timeout)
        return result(status, msg, tb)
    n = len(checks)
    return result("passed", f"All {n} check{'s' if n != 1 else ''} passed.")


def check(qid: str, ns: Optional[dict] = None) -> None:
    """Run the visible checks of question ``qid`` on your notebook's code and print the verdict.

    ``ns`` defaults to the namespace of the caller (the notebook), so ``check("ex00_1")`` is
    all you need in a cell.
    """
    if os.environ.get(GRADING_ENV) == "1":
        print(f"check({qid!r}): skipped while grading (the grader runs every check itself).")
        return None
    if ns is None:
        frame = inspect.currentframe().f_back
        ns = frame.f_globals
    q = get_question(qid)
    res = run_question(q, ns, hidden=False, timeout=q.timeout)
    print(res.pretty())
    sys.stdout.flush()
    return None
