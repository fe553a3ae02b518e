"""Running the checks of one question against a notebook namespace.

``check("ex00_1")`` is what a student calls in a notebook: it runs the visible checks of the
question against the notebook's current code and prints pass/fail with a hint.
The grader calls :func:`run_question` with ``hidden=True`` (visible + instructor checks).
"""
from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Optional

from .registry import Question, get_question
from .student import KernelLost, LocalCode, NotPlainData, StudentCode, StudentError

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
    #: For the instructor only (``feedback/<name>.json``), never shown to the student: what a hidden
    #: check's own message said (its inputs, expected and got), or the student's error text on a hidden input.
    detail: str = ""

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
            out += "\n   Last lines of the traceback:\n" + "\n".join("     " + line for line in tail)
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


def _other_exercise(exc, q: Question) -> str:
    """The other question whose missing answer stopped ``q``'s checks (a library stand-in's
    "... is what exercise exNN_k asks you to write"), or ""."""
    from ..standin import UNSOLVED_PATTERN

    found = UNSOLVED_PATTERN.search(getattr(exc, "message", "") or "")
    return found.group(1) if found and found.group(1) != q.qid else ""


def _classify(q: Question, exc: BaseException, timeout: Optional[float]):
    """(status, message) for an exception raised while checking question ``q``.

    The message is for the student: one sentence, no exception text from the grader's side
    (a check's own error could reveal what the hidden checks test).
    """
    if isinstance(exc, QuestionTimeout) or (isinstance(exc, StudentError) and "QuestionTimeout" in exc.kinds):
        return "timeout", (f"Timed out: the checks did not finish within {timeout:g} s. "
                           "Look for an infinite loop, or a recv() that no send() ever matches.")
    if isinstance(exc, KernelLost):
        return exc.status, f"While checking {q.qid}, your code {exc.message}."
    if isinstance(exc, AssertionError):
        return "failed", str(exc).strip() or "a check failed"
    if isinstance(exc, NotPlainData):
        return "failed", (f"{exc}. Return numbers, strings, numpy arrays, or lists, tuples and dicts "
                          "of them, as the question asks.")
    if isinstance(exc, StudentError):
        kinds = exc.kinds
        needed = _other_exercise(exc, q)
        if needed:
            return "failed", (f"These checks run your answer to {needed} too (the statement says so), and it is "
                              f"not written yet: solve {needed} first, then check {q.qid} again.")
        if "NotImplementedError" in kinds:
            return "not_implemented", ("Not implemented yet: replace the `raise NotImplementedError(...)` "
                                       "line with your code, run that cell, then check again.")
        if "WorkerTimeout" in kinds:
            return "timeout", ("A worker did not return in time: a deadlock? Every recv() needs a matching "
                               "send(), in the same order on both sides.")
        if "MemoryError" in kinds:
            return "error", f"`{exc.name}` ran out of memory."
        if "SystemExit" in kinds:
            return "error", f"`{exc.name}` called sys.exit(); return a value instead."
        text = exc.message.strip().splitlines()[0][:300] if exc.message.strip() else ""
        return "error", f"`{exc.name}` raised {exc.type_name}" + (f": {text}" if text else "") + "."
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return "error", "Interrupted."
    return "failed", (f"The check could not read your answer ({type(exc).__name__} while checking it): "
                      f"it does not have the form the question asks for. {q.title}: see the statement.")


def run_question(q: Question | str, ns, hidden: bool = False,
                 timeout: Optional[float] = None) -> QuestionResult:
    """Run the checks of ``q`` against the student's code ``ns``; never raises (except on Ctrl-C).

    ``ns`` is a :class:`~course_lib.grading.student.StudentCode` or a plain namespace dict.
    """
    if isinstance(q, str):
        q = get_question(q)
    code = ns if isinstance(ns, StudentCode) else LocalCode(ns)
    t0 = time.perf_counter()
    checks = list(q.visible) + (list(q.hidden) if hidden else [])

    def result(status, message, tb="", detail=""):
        pts = q.points if status == "passed" else 0
        return QuestionResult(q.qid, q.title, pts, q.points, status, message, tb,
                              round(time.perf_counter() - t0, 3), detail)

    missing = [n for n in q.names if n not in code]
    if missing:
        names = ", ".join(f"`{n}`" for n in missing)
        return result("missing", f"{names} not defined: run (or restore) the cell that defines it.")
    # Remote code enforces the limit on the student's side; an alarm here could cut a reply in half.
    limiter = time_limit(timeout) if isinstance(code, LocalCode) else contextlib.nullcontext()
    n_visible = len(q.visible)
    checks_passed = 0
    try:
        with limiter:
            for check_one in checks:
                check_one(code)
                checks_passed += 1
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - student code can raise anything
        status, msg = _classify(q, exc, timeout)
        tb = exc.traceback if isinstance(exc, StudentError) else ""
        in_hidden_check = checks_passed >= n_visible
        detail = ""
        if in_hidden_check and isinstance(exc, StudentError) and status == "error":
            # The student's own error text or traceback could carry the hidden inputs out.
            # So a worker's error is named by its type (ZeroDivisionError, not WorkerError), not its text.
            where = " in a worker" if "WorkerError" in exc.kinds and exc.type_name != "WorkerError" else ""
            detail = f"{msg}\n{tb}".strip()
            msg, tb = (f"`{exc.name}` raised {exc.type_name}{where} on one of the grader's own inputs "
                       "(the visible checks pass: make your code general)."), ""
        elif in_hidden_check and status == "failed":
            msg = f"On the grader's own inputs: {msg}"
            detail = getattr(exc, "detail", "") or ""
        return result(status, msg, tb, detail)
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
    if res.passed:
        # Not "full marks": the grader's hidden checks have not run yet.
        n = len(q.visible)
        print(f"\u2705 {q.qid} ({q.title}): the {n} visible check{'s' if n != 1 else ''} passed. When grading, "
              f"hidden checks also try other inputs; the {_fmt(q.points)} point{'s' if q.points != 1 else ''} "
              "count only if those pass too.")
    else:
        print(res.pretty())
    sys.stdout.flush()
    return None
