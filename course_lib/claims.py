"""What a lesson says about its own run, stated as data.

A notebook that prints "the ring sends 2(p-1)/p n bytes per rank" should be checked on the
numbers of the run that printed it, on the student's machine as in the course's tests. Each such
sentence goes through one of two calls:

* :func:`claim` -- a **fact**: it holds on any machine (an exact count of bytes or messages, a
  result equal bit for bit to the single-process one, a bound the theory gives). The notebook
  prints it with a check mark, or with a cross and "does not hold on this run" when it fails; the
  generic test (``tests/test_claims.py``) fails the lesson when a fact does not hold.
* :func:`verdict` -- a sentence about **this run's timings**, which depend on the machine and its
  load ("two lock-free processes were faster than one"). The notebook prints whichever of two
  sentences the run's numbers support; the generic test recomputes the comparison from the
  recorded numbers and checks that the printed sentence is the one they support.

A comparison is kept as data (:class:`Compare`, made by :func:`less`, :func:`at_most`,
:func:`equal`, :func:`close`, :func:`between`), so the test can recompute it; a fact that no
comparison expresses (two arrays equal) passes a plain bool.

Each sentence is formatted with its numbers (``str.format``), so the numbers a student reads are
the ones recorded. In Jupyter a sentence is one display output carrying both ``text/plain`` (what
the student reads) and :data:`MIME` (what the test reads); elsewhere it is printed.
"""
from __future__ import annotations

import math
import numbers as _numbers
import operator
from dataclasses import dataclass

MIME = "application/vnd.course.claim+json"
HOLDS, FAILS = "\u2713", "\u2717"   # check mark, cross

_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq}


@dataclass(frozen=True)
class Compare:
    """A comparison of numbers kept as data: ``op`` is one of ``<``, ``<=``, ``==``, ``close``
    (``|a - b| <= rel * max(|a|, |b|)``) or ``between`` (``lo <= x <= hi``)."""

    op: str
    args: tuple[float, ...]
    rel: float = 0.0

    def holds(self) -> bool:
        if self.op in _OPS:
            a, b = self.args
            return bool(_OPS[self.op](a, b))
        if self.op == "close":
            a, b = self.args
            return abs(a - b) <= self.rel * max(abs(a), abs(b))
        if self.op == "between":
            x, lo, hi = self.args
            return lo <= x <= hi
        raise ValueError(f"unknown comparison {self.op!r}; use less, at_most, equal, close or between")


def _number(x, what: str):
    if isinstance(x, bool) or not isinstance(x, _numbers.Real):
        raise TypeError(f"{what} must be a real number, got {type(x).__name__} {x!r}")
    x = int(x) if isinstance(x, _numbers.Integral) else float(x)
    if isinstance(x, float) and math.isnan(x):
        raise ValueError(f"{what} is NaN: a comparison with NaN says nothing")
    return x


def less(a, b) -> Compare:
    """a < b."""
    return Compare("<", (_number(a, "a"), _number(b, "b")))


def at_most(a, b) -> Compare:
    """a <= b."""
    return Compare("<=", (_number(a, "a"), _number(b, "b")))


def equal(a, b) -> Compare:
    """a == b (exact: counts, bytes, integers)."""
    return Compare("==", (_number(a, "a"), _number(b, "b")))


def close(a, b, rel: float) -> Compare:
    """|a - b| <= rel * max(|a|, |b|)."""
    return Compare("close", (_number(a, "a"), _number(b, "b")), _number(rel, "rel"))


def between(x, lo, hi) -> Compare:
    """lo <= x <= hi."""
    return Compare("between", (_number(x, "x"), _number(lo, "lo"), _number(hi, "hi")))


def _plain(value):
    """A JSON-ready copy of a number, a string or a (nested) list of them (numpy included)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, _numbers.Integral):
        return int(value)
    if isinstance(value, _numbers.Real):
        return float(value)
    raise TypeError(f"a claim's numbers must be numbers, strings or lists of them; got {type(value).__name__}")


def _show(text: str, record: dict) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": text, MIME: record}, raw=True)
    else:
        print(text)


def _as_record(check: Compare) -> dict:
    return {"op": check.op, "args": list(check.args), "rel": check.rel}


def _as_check(check) -> tuple[bool, dict | None]:
    if isinstance(check, Compare):
        return check.holds(), _as_record(check)
    if hasattr(check, "item"):    # a numpy bool from np.all(...), np.array_equal(...)
        check = check.item()
    if not isinstance(check, bool):
        raise TypeError(f"a claim's check must be a Compare (less, at_most, equal, close, between) or a "
                        f"bool, got {type(check).__name__}")
    return check, None


def claim(sentence: str, check, /, **numbers) -> bool:
    """State a fact that holds on any machine; prints it with its verdict and returns whether it
    holds. ``sentence`` is formatted with ``numbers``:
    ``claim("{sent} bytes sent = 2(p-1)/p n = {formula}", equal(sent, formula), sent=..., formula=...)``."""
    holds, compare = _as_check(check)
    plain = {k: _plain(v) for k, v in numbers.items()}   # what is shown is what is recorded
    text = sentence.format(**plain)
    shown = f"{HOLDS} {text}" if holds else f"{FAILS} does not hold on this run: {text}"
    _show(shown, {"kind": "claim", "sentence": sentence, "text": shown, "holds": holds, "check": compare,
                  "numbers": plain})
    return holds


def verdict(check: Compare, if_true: str, if_false: str, /, **numbers) -> bool:
    """Print the sentence this run's numbers support (``if_true`` when ``check`` holds, else
    ``if_false``, each formatted with ``numbers``) and return whether the check held. For what
    depends on the machine and its load: wall times, speedups, who finished first."""
    if not isinstance(check, Compare):
        raise TypeError("a verdict's check must be a Compare (less, at_most, equal, close, between), so "
                        "that it can be recomputed from the numbers it printed")
    holds = check.holds()
    plain = {k: _plain(v) for k, v in numbers.items()}
    text = (if_true if holds else if_false).format(**plain)
    _show(text, {"kind": "verdict", "if_true": if_true, "if_false": if_false, "text": text, "holds": holds,
                 "check": _as_record(check), "numbers": plain})
    return holds


def records(notebook) -> list[dict]:
    """The claims and verdicts an executed notebook (an nbformat node) shows, in order."""
    return [out["data"][MIME] for cell in notebook.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if MIME in out.get("data", {})]


def problems(record: dict) -> list[str]:
    """What is wrong with one recorded claim or verdict: a fact that fails, a comparison that
    does not recompute to what was shown, or a sentence that is not the one the numbers give."""
    found = []
    check = record.get("check")
    recomputed = Compare(check["op"], tuple(check["args"]), check["rel"]).holds() if check else record["holds"]
    if recomputed != record["holds"]:
        found.append(f"its comparison {check} recomputes to {recomputed}, but {record['holds']} was shown")
    if record["kind"] == "claim":
        expected = record["sentence"].format(**record["numbers"])
        if not record["holds"]:
            found.append("the fact does not hold on this run")
        if expected not in record["text"]:
            found.append(f"shown {record['text']!r}, but its numbers give {expected!r}")
    else:
        expected = (record["if_true"] if recomputed else record["if_false"]).format(**record["numbers"])
        if record["text"] != expected:
            found.append(f"shown {record['text']!r}, but its numbers support {expected!r}")
    return found
