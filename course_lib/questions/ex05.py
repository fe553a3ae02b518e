"""Lesson 05, inside the parameter server: visible checks.

ex05_1  ring_lookup(points, owners, key)          consistent hashing: first point >= key, wrapping around
ex05_2  may_read(t, clocks, tau)                  the bounded-delay (SSP) gate
ex05_3  significantly_modified(keys, residual, theta)   the filter: send big entries, keep the rest
ex05_4  merge_clocks(a, b)                        merge two vector clocks kept per key range
"""
import math

import numpy as np

from course_lib.grading import question
from course_lib.ps import ring as _ring
from course_lib.ps import vclock as _vclock


def assert_lookup(fn, points, owners, keys):
    for k in keys:
        want = _ring.ring_lookup(points, owners, int(k))
        got = fn(points, owners, int(k))
        assert got is not None, "ring_lookup returned None: return the owner of the point"
        assert int(got) == want, (
            f"points={list(points)}, owners={list(owners)}: key {k} belongs to server {want}, got {got}. "
            "A key goes to the first point >= key; a key after the last point wraps around to the first point.")


@question("ex05_1", points=2, title="Look up a key on the hash ring", names=("ring_lookup",))
def ex05_1(ns):
    """``ring_lookup(points, owners, key)``: points sorted; return the owner of the first point >= key,
    wrapping around to ``owners[0]`` for keys after the last point."""
    fn = ns["ring_lookup"]
    assert_lookup(fn, [10, 20, 30], [0, 1, 2], [0, 10, 11, 20, 25, 30])
    assert_lookup(fn, [10, 20, 30], [0, 1, 2], [31, 99])


def assert_gate(fn, cases):
    for t, clocks, tau in cases:
        want = min(clocks) >= t - tau if tau != math.inf else True
        got = fn(t, list(clocks), tau)
        assert isinstance(got, (bool, np.bool_)), f"may_read must return a bool, got {type(got).__name__}"
        assert bool(got) == want, (
            f"a worker at clock t={t} with clocks {list(clocks)} and tau={tau}: may_read should be {want}, "
            f"got {bool(got)}. The slowest worker may be at most tau iterations behind: min(clocks) >= t - tau.")


@question("ex05_2", points=2, title="The bounded-delay gate", names=("may_read",))
def ex05_2(ns):
    """``may_read(t, clocks, tau)``: True iff ``min(clocks) >= t - tau`` (always True for tau = inf)."""
    assert_gate(ns["may_read"], [(3, [3, 3, 3], 0), (3, [2, 3, 3], 0), (3, [2, 5, 3], 1), (4, [2, 5, 3], 1),
                                 (5, [2, 5, 3], 3), (6, [2, 5, 3], 3), (100, [0, 0], math.inf)])


def assert_filter(fn, keys, residual, theta):
    keys = np.asarray(keys)
    residual = np.asarray(residual, dtype=float)
    out = fn(keys, residual.copy(), theta)
    assert isinstance(out, tuple) and len(out) == 3, "return a tuple (send_keys, send_values, kept)"
    k, v, kept = (np.asarray(x) for x in out)
    mask = np.abs(residual) > theta
    assert np.array_equal(k, keys[mask]), (
        f"with theta={theta}, send exactly the keys whose |residual| > theta: expected {keys[mask].tolist()}, "
        f"got {k.tolist()}")
    assert np.allclose(v, residual[mask]), "send_values must be the residual of the sent keys, in key order"
    assert kept.shape == residual.shape, "kept must have one entry per key (zero where the entry was sent)"
    assert np.allclose(kept, np.where(mask, 0.0, residual)), (
        "kept is the residual with the sent entries set to zero: entries below the threshold stay, "
        "to be sent once they add up")


@question("ex05_3", points=2, title="The significantly-modified filter", names=("significantly_modified",))
def ex05_3(ns):
    """``significantly_modified(keys, residual, theta)`` -> ``(send_keys, send_values, kept)``."""
    fn = ns["significantly_modified"]
    assert_filter(fn, [2, 5, 7, 9], [0.5, -0.01, -0.3, 0.02], 0.1)
    assert_filter(fn, [1, 2, 3], [0.0, 0.0, 0.0], 0.0)


def _canon(segs):
    return [(int(lo), int(hi), [int(x) for x in v]) for lo, hi, v in segs]


def assert_merge(fn, a, b):
    want = _canon(_vclock.merge_clocks(a, b))
    got = fn([(lo, hi, np.array(v)) for lo, hi, v in a], [(lo, hi, np.array(v)) for lo, hi, v in b])
    assert got is not None, "merge_clocks returned None: return the list of merged segments"
    got = _canon(got)
    assert got == want, (
        f"merging\n  a={_canon(a)}\n  b={_canon(b)}\nshould give\n  {want}\ngot\n  {got}\n"
        "Cut at every boundary of a and of b, take the elementwise max on each piece, then join neighbouring "
        "pieces with equal vectors.")


@question("ex05_4", points=3, title="Merge vector clocks kept per key range", names=("merge_clocks",))
def ex05_4(ns):
    """``merge_clocks(a, b)``: two lists of segments ``(lo, hi, vec)`` covering the same ``[0, K)``."""
    fn = ns["merge_clocks"]
    assert_merge(fn, [(0, 10, [1, 0])], [(0, 10, [0, 2])])
    assert_merge(fn, [(0, 5, [1, 0]), (5, 10, [2, 0])], [(0, 3, [0, 4]), (3, 10, [0, 1])])
