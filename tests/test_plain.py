"""The plain-data codec: the only thing that crosses the grading boundary (course_lib/grading/plain.py)."""
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from course_lib.grading.plain import MAX_DEPTH, PlainDataError, decode, encode, roundtrip

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
    with pytest.raises(PlainDataError, match="nested"):
        encode(deep)
    with pytest.raises(PlainDataError, match="thousands of digits"):
        encode(10 ** 20000)


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
