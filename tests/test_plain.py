"""The plain-data codec: the only thing that crosses the grading boundary (course_lib/grading/plain.py)."""
import json
import math
import time
from fractions import Fraction

import numpy as np
import pytest

from course_lib.grading.plain import MAX_BYTES, MAX_DEPTH, PlainDataError, decode, encode, roundtrip

VALUES = [
    None, True, False, 0, -7, 2**100, 1.5, -0.0, complex(1, -2), "text", b"\x00\xff",
    [1, [2, [3]]], (1, "a", (2.5,)), {1, 2, 3}, frozenset({"a"}), {"k": [1, 2], 3: (4,)},
    Fraction(-3, 7), np.arange(6, dtype=np.int16).reshape(2, 3), np.array(["ab", "c"]),
    np.zeros(0, dtype=np.float32), np.array([(1, 2.5)], dtype=[("a", "i4"), ("b", "f8")]),
    np.float32(3.25), np.int64(-4), np.bool_(True),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_every_plain_type_comes_back_equal_and_of_the_same_type(value):
    got = roundtrip(value)
    want_type = set if type(value) is frozenset else type(value)
    assert type(got) is want_type
    if isinstance(value, np.ndarray):
        assert got.dtype == value.dtype and got.shape == value.shape and np.array_equal(got, value)
        assert got.flags.writeable  # a copy of its own, not a view of the message
    else:
        assert got == value


def test_non_finite_floats_travel_tagged():
    assert math.isnan(roundtrip(float("nan")))
    assert roundtrip(float("inf")) == float("inf") and roundtrip(-float("inf")) == -float("inf")
    with pytest.raises(PlainDataError, match="nan or inf"):
        decode(json.dumps({"__t": "float", "v": "1.0"}))


class Sneaky(list):
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [Sneaky([1]), object(), np.array([object()]), lambda: 1, range(3)],
                         ids=["list subclass", "object", "object array", "function", "range"])
def test_anything_else_is_refused_by_name(value):
    with pytest.raises(PlainDataError, match="cannot cross|dtype=object"):
        encode(value)


def test_nesting_and_size_are_capped():
    deep = []
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(PlainDataError, match="nested deeper than"):
        encode(deep)
    with pytest.raises(PlainDataError, match="more than 4000 digits"):
        encode(10 ** 20000)
    with pytest.raises(PlainDataError, match="more than 2000000 values"):
        encode([None] * 2_000_001)


@pytest.mark.parametrize("text, match", [
    ('{"__t": "nope"}', "unknown tag"),
    ('{"a": 1}', "malformed"),
    ('{"__t": "fraction", "n": 1, "d": 0}', "bad fraction"),
    ('{"__t": "nd", "dtype": "<f8", "shape": [3], "v": "AAAA"}', "do not match"),
    ('{"__t": "nd", "dtype": "|O", "shape": [1], "v": ""}', "object"),
    ('{"__t": "nd", "dtype": "<f8", "shape": [-1], "v": ""}', "bad array shape"),
    ('{"__t": "tuple"}', "malformed plain data \\(tuple\\)"),
    ("not json", "not JSON"),
])
def test_malformed_messages_are_refused(text, match):
    with pytest.raises(PlainDataError, match=match):
        decode(text)


# -- decoding is bounded: whatever the sandbox sends, a PlainDataError with a sentence, in time --

_M61 = 2**61 - 1   # multiples of 2**61 - 1 all hash to 0: a set of them is quadratic to build


@pytest.mark.parametrize("text, match", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 32 levels"),       # RecursionError in json.loads before
    ("[" * 500 + "]" * 500, "nested deeper than 32 levels"),
    (json.dumps({"__t": "complex", "re": 10**400, "im": 0}), "too large for a float"),  # OverflowError before
    ("1" + "0" * 4100, "integer of more than 4000 digits"),
    ("1" + "0" * 5000, "integer of more than 4000 digits"),
    (json.dumps({"__t": "fraction", "n": 10**4100, "d": 3}), "integer of more than 4000 digits"),
    (json.dumps([0] * 2_000_001), "more than 2000000 values"),
    (json.dumps({"__t": "set", "v": [k * _M61 for k in range(50_000)]}), "same hash"),
    (json.dumps({"__t": "dict", "v": [[k * _M61, 0] for k in range(50_000)]}), "same hash"),
    (json.dumps({"__t": "tuple", "v": [[k * _M61] for k in range(3)]}), None),
    (json.dumps({"__t": "nd", "dtype": "<f8", "shape": "ab", "v": ""}), "bad array shape"),
    (json.dumps({"__t": "dict", "v": [[[1], 2]]}), "unhashable"),
    (b'"\xff"', "not JSON"),
], ids=["deep", "deep-500", "complex-overflow", "int-digits", "int-digits-json", "fraction-digits",
        "many-values", "set-equal-hashes", "dict-equal-hashes", "tuple-ok", "shape", "unhashable-key", "utf8"])
def test_decoding_is_bounded(text, match):
    t0 = time.monotonic()
    if match is None:
        decode(text)
    else:
        with pytest.raises(PlainDataError, match=match):
            decode(text)
    assert time.monotonic() - t0 < 2


def test_decoding_has_a_deadline():
    # Past the collision bound's reach (few equal hashes), a message that still takes long stops at its deadline.
    text = json.dumps([{"__t": "set", "v": list(range(200))} for _ in range(5000)])
    with pytest.raises(PlainDataError, match="took more than"):
        decode(text, timeout=0.0)
    assert decode(text) == [set(range(200))] * 5000


def test_messages_over_the_size_limit_are_refused_before_parsing():
    with pytest.raises(PlainDataError, match="over the limit of 64 MiB"):
        decode(b" " * (MAX_BYTES + 1))
