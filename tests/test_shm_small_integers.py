"""Integers the runtime takes (a Split color or key, a SharedArray's shape, a group's ranks):
numpy integers work as Python ints do (``operator.index``, as mpi4py and numpy take them);
floats and bools are refused with a TypeError that names the argument, never truncated or
treated as 1.

Split runs in the workers, so it is checked under fork, spawn and forkserver.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from course_lib import Cluster, SharedArray
from course_lib.collectives import UNDEFINED
from course_lib.runtime.groups import Group
from course_lib.runtime.shm_sync import SpinBarrier, control_nbytes

from runtime_checks import assert_clean

METHODS = ["fork", "spawn", "forkserver"]


@pytest.fixture(scope="module", params=METHODS)
def cluster(request):
    with Cluster(4, start_method=request.param, timeout=30) as c:
        yield c
    assert_clean()


# ---------------------------------------------------------------- worker functions
def split_by_numpy_integers(comm):
    color, key = np.int64(comm.rank % 2), np.int32(-comm.rank)
    sub = comm.Split(color, key)
    by_keyword = comm.Split(color=np.uint8(0), key=np.int16(comm.rank))
    none = comm.Split(np.int64(UNDEFINED) if comm.rank == 0 else np.int64(1))
    return (sub.rank, sub.size, sub.allgather(comm.rank), by_keyword.rank,
            None if none is None else none.size)


def split_refusing(comm, color, key):
    """The error each rank meets, by type and message (every rank must refuse, none may hang)."""
    try:
        comm.Split(color, key)
    except Exception as e:
        return type(e).__name__, str(e)
    return None


# ---------------------------------------------------------------- Split
def test_split_takes_numpy_integers_as_color_and_key(cluster):
    res = cluster.run(split_by_numpy_integers)
    # colour 0: ranks 0, 2 ordered by key -rank (2 first); colour 1: ranks 1, 3 (3 first)
    assert [r[:3] for r in res] == [(1, 2, [2, 0]), (1, 2, [3, 1]), (0, 2, [2, 0]), (0, 2, [3, 1])]
    assert [r[3] for r in res] == [0, 1, 2, 3]
    assert [r[4] for r in res] == [None, 3, 3, 3]


@pytest.mark.parametrize("color, key, words", [
    (1.0, 0, ["color", "1.0"]),
    (np.float64(1.0), 0, ["color", "1.0"]),
    (True, 0, ["color", "True"]),
    (np.True_, 0, ["color", "True"]),
    ("1", 0, ["color", "'1'"]),
    (0, 0.5, ["key", "0.5"]),
    (0, True, ["key", "True"]),
    (0, np.float32(2), ["key", "2.0"]),
])
def test_split_refuses_floats_and_bools_with_a_type_error_on_every_rank(cluster, color, key, words):
    res = cluster.run(split_refusing, color, key)
    for rank, got in enumerate(res):
        assert got is not None, f"rank {rank} accepted Split({color!r}, {key!r})"
        kind, msg = got
        assert kind == "TypeError", got
        for w in words + [f"rank {rank}"]:
            assert w in msg, (w, msg)


def test_split_refuses_a_negative_color_with_a_value_error(cluster):
    res = cluster.run(split_refusing, np.int64(-2), 0)
    assert all(r is not None and r[0] == "ValueError" and "-2" in r[1] for r in res), res


# ---------------------------------------------------------------- groups
def test_group_ranks_take_numpy_integers_and_refuse_floats():
    g = Group([np.int64(0), np.int32(2), 3], me=2)
    assert g.members == (0, 2, 3) and all(type(m) is int for m in g.members)
    assert g.Incl([np.int64(2), np.int8(0)]).members == (3, 0)
    assert g.Excl([np.uint16(1)]).members == (0, 3)
    for bad, call in [(1.0, lambda: Group([0, 1.0])), (True, lambda: Group([0, True])),
                      (1.0, lambda: g.Incl([1.0])), (1.5, lambda: g.Excl([1.5])),
                      (True, lambda: g.Excl([True]))]:
        with pytest.raises(TypeError, match=repr(bad)):
            call()
    for call in [lambda: g.Incl([-1]), lambda: g.Incl([np.int64(3)]), lambda: g.Excl([5])]:
        with pytest.raises(ValueError, match="not a rank of this group"):
            call()


# ---------------------------------------------------------------- SharedArray shapes
@pytest.mark.parametrize("shape, expected", [
    (np.int64(5), (5,)),
    ((np.int32(2), np.uint8(3)), (2, 3)),
    ([np.int64(2), 4], (2, 4)),
    (np.array([3, 2]), (3, 2)),
    (np.array(4), (4,)),
    ((), ()),
])
def test_shared_array_shape_takes_numpy_integers(shape, expected):
    with SharedArray.create(shape, np.int32, fill=7) as sa:
        assert sa.shape == expected and all(type(d) is int for d in sa.shape)
        assert sa.array.shape == expected and (sa.array == 7).all()
        twin = pickle.loads(pickle.dumps(sa))
        assert twin.shape == expected


@pytest.mark.parametrize("shape, words", [
    (3.0, ["3.0"]),
    ((2, 3.0), ["3.0"]),
    (np.float64(4), ["4.0"]),
    (True, ["True"]),
    ((2, True), ["True"]),
    ((np.True_,), ["True"]),
    ("3", ["'3'"]),
    ((2, None), ["None"]),
])
def test_shared_array_shape_refuses_floats_and_bools(shape, words):
    with pytest.raises(TypeError) as info:
        SharedArray.create(shape)
    for w in ["shape"] + words:
        assert w in str(info.value), (w, str(info.value))


def test_shared_array_constructor_refuses_a_float_shape_instead_of_truncating():
    with pytest.raises(TypeError, match="2.5"):
        SharedArray("course_0_00000000", (2.5,), np.float64)


def test_shared_array_shape_still_refuses_negative_sizes():
    with pytest.raises(ValueError, match="-1"):
        SharedArray.create((2, np.int64(-1)))


# ---------------------------------------------------------------- SpinBarrier
def test_spin_barrier_takes_numpy_integers_and_refuses_floats():
    buf = bytearray(control_nbytes(3))
    bar = SpinBarrier(buf, np.int64(3), np.int32(1))
    assert (bar.size, bar.rank) == (3, 1) and type(bar.size) is int and type(bar.rank) is int
    bar.close()
    for size, rank in [(3.0, 1), (3, 1.0), (3, True)]:
        with pytest.raises(TypeError):
            SpinBarrier(bytearray(control_nbytes(3)), size, rank)
