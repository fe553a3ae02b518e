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
base64. Limits on nesting depth and on total size keep a hostile value from exhausting memory.
"""
from __future__ import annotations

import base64
import json
import math
from fractions import Fraction
from typing import Any

import numpy as np

MAX_DEPTH = 32
MAX_BYTES = 64 * 1024 * 1024   # of one encoded message
MAX_INT_DIGITS = 4000


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
    if abs(x).bit_length() > MAX_INT_DIGITS * 3.33:
        raise PlainDataError("an integer with thousands of digits")
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
        raise PlainDataError(f"the value is nested more than {MAX_DEPTH} levels deep")
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
        raise PlainDataError(f"the value is too large to send to the grader ({len(text) >> 20} MiB encoded)")
    return text


def _dtype(spec) -> np.dtype:
    try:
        dt = np.dtype([tuple(f) for f in spec] if isinstance(spec, list) else str(spec))
    except (TypeError, ValueError) as e:
        raise PlainDataError(f"bad dtype {spec!r}: {e}") from None
    if dt.hasobject:
        raise PlainDataError("object arrays are not plain data")
    return dt


def _nonfinite_float(x: dict, depth: int) -> float:
    v = float(x["v"])
    if math.isfinite(v):
        raise PlainDataError("a tagged float must be nan or inf")
    return v


def _fraction(x: dict, depth: int) -> Fraction:
    n, d = x["n"], x["d"]
    if type(n) is not int or type(d) is not int or d == 0:
        raise PlainDataError("bad fraction")
    return Fraction(n, d)


def _array(x: dict, depth: int):
    dt = _dtype(x["dtype"])
    shape = tuple(x["shape"])
    if not all(type(s) is int and s >= 0 for s in shape) or len(shape) > 32:
        raise PlainDataError("bad array shape")
    raw = base64.b64decode(x["v"], validate=True)
    if len(raw) != dt.itemsize * math.prod(shape):
        raise PlainDataError("array bytes do not match its shape and dtype")
    a = np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    return a if x["__t"] == "nd" else a[()]


_DECODERS = {
    "float": _nonfinite_float,
    "complex": lambda x, depth: complex(float(_from_json(x["re"], depth + 1)), float(_from_json(x["im"], depth + 1))),
    "tuple": lambda x, depth: tuple(_from_json(v, depth + 1) for v in x["v"]),
    "set": lambda x, depth: {_from_json(v, depth + 1) for v in x["v"]},
    "dict": lambda x, depth: {_from_json(k, depth + 1): _from_json(v, depth + 1) for k, v in x["v"]},
    "bytes": lambda x, depth: base64.b64decode(x["v"], validate=True),
    "fraction": _fraction,
    "nd": _array,
    "np": _array,
}


def _from_json(x: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PlainDataError("nested too deep")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [_from_json(v, depth + 1) for v in x]
    if not isinstance(x, dict) or not isinstance(x.get("__t"), str):
        raise PlainDataError("malformed plain data")
    tag = x["__t"]
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise PlainDataError(f"unknown tag {tag!r}")
    try:
        return decoder(x, depth)
    except PlainDataError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise PlainDataError(f"malformed plain data ({tag}): {e}") from None


def decode(text: str | bytes) -> Any:
    """The value encoded by :func:`encode`; raises :class:`PlainDataError` on anything malformed."""
    if len(text) > MAX_BYTES:
        raise PlainDataError("message too large")
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise PlainDataError(f"not JSON: {e}") from None
    return _from_json(raw, 0)


def roundtrip(x: Any) -> Any:
    """``decode(encode(x))``: what the grader would see of ``x`` (a deep copy of plain data)."""
    return decode(encode(x))
