"""Visible checks of the exercise questions, one module per lesson: ``exNN.py``.

Each module registers its questions with :func:`course_lib.grading.question`. A check takes the
student's code ``ns`` (a :class:`~course_lib.grading.student.StudentCode`: ``ns["f"]`` calls the
student's ``f`` with plain data) and raises ``AssertionError("hint")`` when the answer is wrong.
Students can read these files: they hold examples with their expected values and the properties
an answer must have, never the answer itself.

The helpers below turn whatever came back into the form a question asks for, or fail with one
sentence that says what was expected and what was got.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from fractions import Fraction
from numbers import Integral, Real

import numpy as np

from course_lib.grading.student import harness

#: Key of the marker a harness returns in place of a value that cannot cross to the grader.
NOT_PLAIN = "__not_plain__"
SHOWN_CHARS = 80


def unnamed(kind: str):
    """The default ``within=`` of a visible assert: each kind of assertion ("helper", "collective",
    "inputs", "result", "dtype", "traffic") runs as is, with its own rich message. The grader's
    hidden checks pass :func:`course_lib.grading.registry.named_kinds` instead, which names the
    property of the kind that failed and nothing of the inputs."""
    return nullcontext()


def readable(x):
    """``x`` if it is plain data, else a marker naming its type (harnesses return this)."""
    from course_lib.grading.plain import PlainDataError, encode

    try:
        encode(x)
        return x
    except (PlainDataError, TypeError, ValueError, RecursionError):
        t = type(x)
        name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        return {NOT_PLAIN: name}


def num(x, digits: int = 6) -> str:
    """A number in a message: 6 significant digits, never rounded to a misleading integer."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (Integral, np.integer)):
        return str(int(x))
    if isinstance(x, Fraction):
        return str(x) if x.denominator == 1 else f"{x} (= {float(x):.{digits}g})"
    if isinstance(x, np.floating) and np.finfo(x.dtype).precision < 15:
        # "should be 0.428571, got 0.428571" would hide that a float32 keeps about 7 digits
        return f"{float(x):.{digits}g} (a numpy {x.dtype}: about {np.finfo(x.dtype).precision} significant digits)"
    try:
        return f"{float(x):.{digits}g}"
    except (TypeError, ValueError):
        return shown(x)


def shown(x, limit: int = SHOWN_CHARS, _nested: bool = False) -> str:
    """A short description of a value the student's code returned (at most ``limit`` characters of
    values; an array is named with its dtype and shape, ``ndarray float64 shape (2,): [2e-05, 2e+09]``,
    so that it cannot be taken for a list)."""
    if isinstance(x, dict) and set(x) == {NOT_PLAIN}:
        text = f"an object of type {x[NOT_PLAIN]} (not plain data)"
    elif x is None:
        text = "None"
    elif isinstance(x, (bool, np.bool_)):
        text = str(bool(x))
    elif isinstance(x, (float, np.floating)):
        text = num(x)
    elif isinstance(x, np.ndarray):
        if not _nested:
            return _named_array_text(x, limit)
        text = _array_text(x, limit)
    elif isinstance(x, (list, tuple)):
        open_, close = ("[", "]") if isinstance(x, list) else ("(", ")")
        parts, n = [], 2
        for v in x:
            s = shown(v, limit, _nested=True)
            n += len(s) + 2
            parts.append(s)
            if n > limit:
                break
        text = open_ + ", ".join(parts) + ("," if isinstance(x, tuple) and len(x) == 1 else "") + close
    elif isinstance(x, dict):
        text = "{" + ", ".join(f"{shown(k, _nested=True)}: {shown(v, _nested=True)}"
                               for k, v in list(x.items())[:8]) + "}"
    else:
        text = repr(x)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _named_array_text(x: np.ndarray, limit: int) -> str:
    """``ndarray float64 shape (2,): [2e-05, 2e+09]``: what it is, then (numbers only) its values."""
    kind = f"ndarray {x.dtype} shape {tuple(x.shape)}"
    if x.dtype.kind not in "biufc":
        return kind
    text = _array_text(x, limit)
    if text.endswith(f" (shape {tuple(x.shape)})"):
        text = text[: -len(f" (shape {tuple(x.shape)})")]
    return f"{kind}: {text[: limit - 3] + '...' if len(text) > limit else text}"


def _array_text(x: np.ndarray, limit: int) -> str:
    if x.dtype.kind not in "biufc":
        return f"array of {x.dtype} (shape {tuple(x.shape)})"
    if x.ndim == 0:
        return num(x[()])

    def nested(a):
        if a.ndim == 1:
            return "[" + ", ".join(num(v, 5) for v in a) + "]"
        return "[" + ", ".join(nested(r) for r in a) + "]"

    text = nested(x) if x.size <= 24 else ""
    if text and len(text) <= limit:
        return text
    flat = x.ravel()
    head = ", ".join(num(v, 5) for v in flat[:4])
    return f"[{head}, ...] (shape {tuple(x.shape)})"


def off_by(got, want, rtol: float = 0.02) -> str:
    """How a number differs from the one a formula question expects, without the expected value
    (a student could work back from it to the formula): "too large by a factor of about 2",
    "too small", "negative where it should be positive", "not zero where it should be zero".

    A factor is named only when it is a whole number from 2 to 8 (within ``rtol``): a term counted
    twice, or p times, or missing, shows as one; any finer ratio would hand the value back."""
    got, want = float(got), float(want)
    if want == 0:
        return "not zero where it should be zero"
    if got == 0:
        return "zero where it should not be"
    if (got > 0) != (want > 0):
        return f"{'negative' if got < 0 else 'positive'} where it should be {'positive' if want > 0 else 'negative'}"
    ratio = got / want
    size = "too large" if ratio > 1 else "too small"
    big = ratio if ratio > 1 else 1 / ratio
    if abs(round(big) - big) <= rtol * big and 2 <= round(big) <= 8:
        return f"{size} by a factor of about {round(big)}"
    if big > 16:
        return f"{size} by orders of magnitude"
    return size


def formula_mismatch(message: str, want) -> AssertionError:
    """The failure of a formula question: ``message`` for the student, which names what is off without
    the expected value (see :func:`off_by`), and, as its ``detail``, the same with the expected value,
    for the instructor only (a hidden check keeps it in ``feedback/<name>.json``)."""
    exc = AssertionError(message)
    exc.detail = f"{message} [expected {num(want) if is_number(want) else shown(want)}]"
    return exc


def is_number(x) -> bool:
    return isinstance(x, (Real, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def as_number(x, what: str) -> float:
    """``x`` as a float, or fail: '<what> should be a number, got ...'."""
    if isinstance(x, np.ndarray) and x.shape == () and x.dtype.kind in "iuf":
        x = x[()]
    if not is_number(x):
        raise AssertionError(f"{what} should be a number, got {shown(x)}.")
    v = float(x)
    if math.isnan(v):
        raise AssertionError(f"{what} should be a number, got nan.")
    return v


def as_int(x, what: str) -> int:
    """``x`` as an int (an int or numpy integer, not a float or a bool), or fail."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (Integral, np.integer)):
        raise AssertionError(f"{what} should be an int, got {shown(x)}"
                             + (f" of type {type(x).__name__}" if is_number(x) else "") + ".")
    return int(x)


def as_array(x, what: str, shape=None, kinds: str = "iuf") -> np.ndarray:
    """``x`` as a numpy array of numbers (a list of numbers is accepted), of ``shape`` if given."""
    if isinstance(x, dict) or x is None or isinstance(x, (str, bytes)):
        raise AssertionError(f"{what} should be a numpy array"
                             + (f" of shape {tuple(shape)}" if shape is not None else "") + f", got {shown(x)}.")
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):
        a = None
    if a is None or (a.dtype.kind not in kinds and not (a.size == 0 and a.dtype.kind in "iuf")):
        raise AssertionError(f"{what} should be a numpy array of numbers"
                             + (f" of shape {tuple(shape)}" if shape is not None else "") + f", got {shown(x)}.")
    if shape is not None and a.shape != tuple(shape):
        raise AssertionError(f"{what} should have shape {tuple(shape)}, got shape {a.shape}: {shown(x)}.")
    return a


def as_sequence(x, n: int, what: str, kinds=(tuple,)) -> tuple:
    """``x`` as a tuple of ``n`` items (a tuple, or a list when ``kinds`` allows it), or fail."""
    if not isinstance(x, kinds) or len(x) != n:
        kind = " or ".join(k.__name__ for k in kinds)
        raise AssertionError(f"{what} should be a {kind} of {n} items, got {shown(x)}.")
    return tuple(x)


def same(a, b) -> bool:
    """Deep equality of plain data (arrays: same shape, dtype and values, nan equal to nan)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def first_difference(before, after, path: str = ""):
    """``(where, was, now)`` of the first place two plain values differ, or None."""
    if isinstance(before, np.ndarray) and isinstance(after, np.ndarray) and before.shape == after.shape:
        if before.dtype != after.dtype:
            return path, f"of dtype {before.dtype}", f"of dtype {after.dtype}"
        diff = np.argwhere(~((before == after) | (before != before) & (after != after)))
        if not len(diff):
            return None
        k = tuple(int(i) for i in diff[0])
        return f"{path}[{', '.join(map(str, k))}]", num(before[k]), num(after[k])
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and len(before) == len(after) \
            and type(before) is type(after):
        for i, (b, a) in enumerate(zip(before, after)):
            d = first_difference(b, a, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(before, dict) and isinstance(after, dict) and before.keys() == after.keys():
        for k in before:
            d = first_difference(before[k], after[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    return None if same(before, after) else (path, shown(before, 50), shown(after, 50))


def assert_unchanged(fn_name: str, names, before, after, on: str = "") -> None:
    """Fail if an argument came back from the call changed: the function overwrote its input.

    ``on`` says where the call ran, e.g. "on rank 2"."""
    for name, b, a in zip(names, before, after):
        d = first_difference(b, a)
        if d:
            where, was, now = d
            raise AssertionError(
                f"`{fn_name}` changed its argument `{name}` in place{' ' + on if on else ''} "
                f"({name}{where} was {was}, after the call "
                f"it is {now}): the caller still needs it, so compute on a copy or into new arrays.")


def call_keeping_inputs(fn, args: tuple, names):
    """Call the student's ``fn(*args)``; fail if it changed any of its arguments; return the result."""
    from course_lib.grading.plain import roundtrip

    before = roundtrip(tuple(args))
    obs = fn.call_observed(*args)
    assert_unchanged(getattr(fn, "name", "your function"), names, before, obs.args)
    return obs.result


def close(got, want, rtol: float = 1e-9, atol: float = 1e-12) -> bool:
    return bool(np.allclose(got, want, rtol=rtol, atol=atol))


def worst(got, want, name: str = "entry") -> str:
    """Where two arrays differ most: 'entry (i, j) should be a, got b'."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    if got.shape != want.shape or not got.size:
        return f"{name} should be {shown(want)}, got {shown(got)}"
    k = np.unravel_index(int(np.argmax(np.abs(got - want))), got.shape)
    at = ", ".join(str(int(i)) for i in k)
    return f"{name}[{at}] should be {num(want[k])}, got {num(got[k])}"


# ------------------------------------------------------------------ library helpers that answer
# Some functions of the course library, shipped with it because lessons use them, do part of what
# a question asks (the gossip runtime's exchange of values with the neighbours, the shard bounds of
# ``np.array_split``, ...). A question whose work such a helper does lists it as ``(module,
# function)`` pairs, and its checks run the student's function watching for a call into one of them
# (at any depth, in the process where it runs), as ex02's checks refuse the communicator's collectives.

def watch_helpers(helpers):
    """Start noting, in this thread, the first call into one of ``helpers`` ((module, function) pairs).

    Returns the list the name of that function ("module.function") is appended to; stop with
    ``sys.setprofile(None)``."""
    import importlib
    import sys

    targets = {}
    for module, function in helpers:
        path = importlib.import_module(module).__file__
        targets.setdefault(path, {})[function] = f"{module}.{function}"
    seen = []

    def spy(frame, event, arg):
        if event == "call" and not seen:
            names = targets.get(frame.f_code.co_filename)
            if names and frame.f_code.co_name in names:
                seen.append(names[frame.f_code.co_name])
        return None

    sys.setprofile(spy)
    return seen


@harness
def call_watching(fn, helpers, args):
    """``fn(*args)`` watching ``helpers``: (its result as plain data, the first helper it called or "")."""
    import sys

    seen = watch_helpers(helpers)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    return readable(out), (seen[0] if seen else "")


def assert_no_helper(name: str, used: str, where: str = "") -> None:
    """Fail if the student's ``name`` called a library helper that does the question's work."""
    assert not used, (
        f"{name} should do this question's work itself, but it called the course library's {used}"
        f"{' ' + where if where else ''}, which does that work for you: write it from the statement "
        "(numpy and the communicator's send and recv are fine).")


def refuse_helpers(fn, args, helpers, name: str):
    """Call the student's ``fn(*args)`` once watching ``helpers``; fail if it called one; return the result."""
    out, used = call_watching(fn, [list(h) for h in helpers], list(args))
    assert_no_helper(name, used)
    return out
