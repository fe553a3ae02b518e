"""Plain data: the only thing that crosses the grading boundary.

Student code runs in a sandbox; the checks that decide a grade run in the grader's own
process. What the student's functions return travels between the two as *plain data*:
``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``,
``dict``, ``set``, :class:`fractions.Fraction`, numpy arrays of numbers, booleans or strings
(structured dtypes included) and numpy scalars. Nothing else can be sent, so nothing the
student built (an object with a patched ``__eq__``, a pickle that runs code when loaded) ever
reaches the grader: :func:`decode` rebuilds values from JSON and raw bytes and checks every
field, and never imports or calls anything named by the data.

Encoding is JSON with tagged objects for the non-JSON types; arrays carry their bytes in
base64. :func:`decode` reads whatever the sandbox sends, so it is bounded in every direction: the
size of the text, nesting depth, the number of values, the digits of an integer, keys of a set or
dict sharing one hash (which would make building it quadratic), and time; past a bound it raises
:class:`PlainDataError` with a sentence for the student ("it is nested deeper than 32 levels"),
never another exception.
"""
from __future__ import annotations

import base64
import binascii
import collections
import json
import math
import re
import time
from fractions import Fraction
from typing import Any, Optional

import numpy as np

MAX_DEPTH = 32
MAX_BYTES = 64 * 1024 * 1024   # of one encoded message
MAX_INT_DIGITS = 4000
MAX_INT_BITS = int(MAX_INT_DIGITS * 3.33)
MAX_VALUES = 2_000_000          # numbers, strings, lists... in one message (an array counts once)
MAX_EQUAL_HASHES = 1000         # keys of one set or dict with the same hash (more: quadratic to build)
DECODE_SECONDS = 10.0           # reading one message (64 MiB of JSON takes about 1 s)


class PlainDataError(ValueError):
    """A value that is not plain data (see the module doc), or a malformed encoding."""


def _type_name(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _dtype_spec(dt: np.dtype):
    if dt.hasobject:
        raise PlainDataError("an array of Python objects (dtype=object) is not plain data: use numbers or strings")
    return dt.descr if dt.fields is not None else dt.str


def _int_to_json(x: int, depth: int) -> int:
    if abs(x).bit_length() > MAX_INT_BITS:
        raise PlainDataError(f"it holds an integer of more than {MAX_INT_DIGITS} digits")
    return x


def _array_to_json(x, depth: int) -> dict:
    a = np.asarray(x)
    spec = _dtype_spec(a.dtype)
    return {"__t": "nd" if type(x) is np.ndarray else "np", "dtype": spec, "shape": list(a.shape),
            "v": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")}


# Exact types only (``type(x) is ...``): a subclass of list or dict could carry methods of its own.
_ENCODERS = {
    type(None): lambda x, depth: x,
    bool: lambda x, depth: x,
    str: lambda x, depth: x,
    int: _int_to_json,
    float: lambda x, depth: x if math.isfinite(x) else {"__t": "float", "v": repr(x)},
    complex: lambda x, depth: {"__t": "complex", "re": _to_json(x.real, depth + 1),
                               "im": _to_json(x.imag, depth + 1)},
    list: lambda x, depth: [_to_json(v, depth + 1) for v in x],
    tuple: lambda x, depth: {"__t": "tuple", "v": [_to_json(v, depth + 1) for v in x]},
    set: lambda x, depth: {"__t": "set", "v": [_to_json(v, depth + 1) for v in x]},
    frozenset: lambda x, depth: {"__t": "set", "v": [_to_json(v, depth + 1) for v in x]},
    dict: lambda x, depth: {"__t": "dict", "v": [[_to_json(k, depth + 1), _to_json(v, depth + 1)]
                                                 for k, v in x.items()]},
    bytes: lambda x, depth: {"__t": "bytes", "v": base64.b64encode(x).decode("ascii")},
    Fraction: lambda x, depth: {"__t": "fraction", "n": x.numerator, "d": x.denominator},
    np.ndarray: _array_to_json,
}


def _to_json(x: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PlainDataError(f"it is nested deeper than {MAX_DEPTH} levels")
    encoder = _ENCODERS.get(type(x))
    if encoder is None and isinstance(x, np.generic):
        encoder = _array_to_json
    if encoder is None:
        raise PlainDataError(f"a {_type_name(x)} cannot cross to the grader: return numbers, strings, "
                             "numpy arrays, or lists, tuples and dicts of them")
    return encoder(x, depth)


def encode(x: Any) -> str:
    """JSON text of the plain value ``x``; raises :class:`PlainDataError` for anything else."""
    text = json.dumps(_to_json(x, 0), allow_nan=False, separators=(",", ":"))
    if len(text) > MAX_BYTES:
        raise PlainDataError(f"it is too large to send to the grader ({len(text) >> 20} MiB encoded, "
                             f"over the limit of {MAX_BYTES >> 20} MiB)")
    if _count_tokens(text.encode("utf-8", "surrogatepass")) > MAX_VALUES:
        raise PlainDataError(f"it holds more than {MAX_VALUES} values")
    return text


def _dtype(spec) -> np.dtype:
    try:
        dt = np.dtype([tuple(f) for f in spec] if isinstance(spec, list) else str(spec))
    except (TypeError, ValueError, RecursionError, OverflowError, MemoryError) as e:
        raise PlainDataError(f"bad dtype {str(spec)[:80]!r}: {e}") from None
    if dt.hasobject:
        raise PlainDataError("object arrays are not plain data")
    return dt


class _Budget:
    """What one :func:`decode` may still spend: values and time (checked every few values)."""

    def __init__(self, deadline: Optional[float]):
        self.values, self.ticks, self.deadline = 0, 0, deadline

    def spend(self, n: int = 1) -> None:
        self.values += n
        self.ticks += 1
        if self.values > MAX_VALUES:
            raise PlainDataError(f"it holds more than {MAX_VALUES} values")
        if self.deadline is not None and (self.ticks & 255) == 0 and time.monotonic() > self.deadline:
            raise PlainDataError(f"it took more than {DECODE_SECONDS:g} s to read")


def _check_int(x: int) -> int:
    if x.bit_length() > MAX_INT_BITS:
        raise PlainDataError(f"it holds an integer of more than {MAX_INT_DIGITS} digits")
    return x


def _nonfinite_float(x: dict, depth: int, budget: _Budget) -> float:
    v = float(x["v"])
    if math.isfinite(v):
        raise PlainDataError("a tagged float must be nan or inf")
    return v


def _fraction(x: dict, depth: int, budget: _Budget) -> Fraction:
    n, d = x["n"], x["d"]
    if type(n) is not int or type(d) is not int or d == 0:
        raise PlainDataError("bad fraction")
    return Fraction(_check_int(n), _check_int(d))


def _complex(x: dict, depth: int, budget: _Budget) -> complex:
    re_, im = _from_json(x["re"], depth + 1, budget), _from_json(x["im"], depth + 1, budget)
    if type(re_) not in (int, float) or type(im) not in (int, float):
        raise PlainDataError("bad complex number")
    return complex(float(re_), float(im))


def _array(x: dict, depth: int, budget: _Budget):
    dt = _dtype(x["dtype"])
    shape = x["shape"]
    if not isinstance(shape, list) or len(shape) > 32 or not all(type(s) is int and s >= 0 for s in shape):
        raise PlainDataError("bad array shape")
    shape = tuple(shape)
    if not isinstance(x["v"], str):
        raise PlainDataError("bad array bytes")
    raw = base64.b64decode(x["v"], validate=True)
    if len(raw) != dt.itemsize * math.prod(shape):
        raise PlainDataError("array bytes do not match its shape and dtype")
    a = np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    return a if x["__t"] == "nd" else a[()]


def _items(x: dict, depth: int, budget: _Budget) -> list:
    v = x["v"]
    if not isinstance(v, list):
        raise PlainDataError("malformed plain data")
    return [_from_json(item, depth + 1, budget) for item in v]


def _hashed(keys: list, what: str, budget: _Budget) -> None:
    """Refuse keys that would make building a set or dict slow: many with one same hash (each
    insertion then compares with all of them, so building is quadratic)."""
    counts = collections.Counter(hash(k) for k in keys)
    if counts and max(counts.values()) > MAX_EQUAL_HASHES:
        raise PlainDataError(f"it holds a {what} of {len(keys)} keys, {max(counts.values())} of them with the "
                             "same hash (the grader would take too long to read it)")


def _set(x: dict, depth: int, budget: _Budget) -> set:
    items = _items(x, depth, budget)
    _hashed(items, "set", budget)
    out = set()
    for k in items:
        out.add(k)
        budget.spend(0)
    return out


def _dict(x: dict, depth: int, budget: _Budget) -> dict:
    pairs = x["v"]
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise PlainDataError("malformed plain data")
    keys = [_from_json(k, depth + 1, budget) for k, _ in pairs]
    _hashed(keys, "dict", budget)
    out = {}
    for k, (_, v) in zip(keys, pairs):
        out[k] = _from_json(v, depth + 1, budget)
    return out


_DECODERS = {
    "float": _nonfinite_float,
    "complex": _complex,
    "tuple": lambda x, depth, budget: tuple(_items(x, depth, budget)),
    "set": _set,
    "dict": _dict,
    "bytes": lambda x, depth, budget: base64.b64decode(x["v"], validate=True),
    "fraction": _fraction,
    "nd": _array,
    "np": _array,
}


def _from_json(x: Any, depth: int, budget: _Budget) -> Any:
    if depth > MAX_DEPTH:
        raise PlainDataError(f"it is nested deeper than {MAX_DEPTH} levels")
    budget.spend()
    if x is None or isinstance(x, (bool, float, str)):
        return x
    if isinstance(x, int):
        return _check_int(x)
    if isinstance(x, list):
        return [_from_json(v, depth + 1, budget) for v in x]
    if not isinstance(x, dict) or not isinstance(x.get("__t"), str):
        raise PlainDataError("malformed plain data")
    tag = x["__t"]
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise PlainDataError(f"unknown tag {tag[:40]!r}")
    try:
        return decoder(x, depth, budget)
    except PlainDataError:
        raise
    except OverflowError:
        raise PlainDataError("it holds a number too large for a float") from None
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise PlainDataError(f"malformed plain data ({tag}): {str(e)[:200]}") from None


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _count_tokens(data: bytes) -> int:
    """About how many values a JSON text holds (its commas and brackets outside strings), read
    before ``json.loads`` builds them: an upper bound on what parsing it would allocate."""
    bare = _STRING.sub(b'""', data)
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{")


def decode(text: str | bytes, timeout: Optional[float] = DECODE_SECONDS) -> Any:
    """The value encoded by :func:`encode`; raises :class:`PlainDataError` on anything malformed
    or past a limit (size, nesting, number of values, digits, ``timeout`` seconds): never any other
    exception, whatever the text."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if len(text) > MAX_BYTES:
        raise PlainDataError(f"it is {len(text) >> 20} MiB encoded, over the limit of {MAX_BYTES >> 20} MiB")
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if _count_tokens(data) > MAX_VALUES:
        raise PlainDataError(f"it holds more than {MAX_VALUES} values")
    try:
        raw = json.loads(data)
    except RecursionError:
        raise PlainDataError(f"it is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError, an int past int_max_str_digits
        if "digits" in str(e):
            raise PlainDataError(f"it holds an integer of more than {MAX_INT_DIGITS} digits") from None
        raise PlainDataError(f"not JSON: {str(e)[:200]}") from None
    except MemoryError:
        raise PlainDataError("it is too large to read") from None
    try:
        return _from_json(raw, 0, _Budget(deadline))
    except PlainDataError:
        raise
    except RecursionError:
        raise PlainDataError(f"it is nested deeper than {MAX_DEPTH} levels") from None
    except MemoryError:
        raise PlainDataError("it is too large to read") from None
    except Exception as e:  # noqa: BLE001 - whatever else a crafted text triggers is a refusal, not a crash
        raise PlainDataError(f"malformed plain data ({type(e).__name__})") from None


def roundtrip(x: Any) -> Any:
    """``decode(encode(x))``: what the grader would see of ``x`` (a deep copy of plain data)."""
    return decode(encode(x))
