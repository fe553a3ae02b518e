"""Lesson 05, inside the parameter server: visible checks.

ex05_1  ring_lookup(points, owners, key)          consistent hashing: first point >= key, wrapping around
ex05_2  may_read(t, clocks, tau)                  the bounded-delay (SSP) gate
ex05_3  significantly_modified(keys, residual, theta)   the filter: send big entries, keep the rest
ex05_4  merge_clocks(a, b)                        merge two vector clocks kept per key range
ex05_5  crossover_density(p, busiest_share, key_bytes, value_bytes)   parameter server or ring allreduce
"""
import math

import numpy as np

from course_lib.grading import question
from course_lib.questions import as_array, as_int, as_number, as_sequence, call_keeping_inputs, num, shown


# ------------------------------------------------------------------------------ ex05_1
def assert_lookup(fn, points, owners, cases):
    """``cases``: [(key, owner)]."""
    points, owners = np.asarray(points), np.asarray(owners)
    for key, want in cases:
        got = as_int(call_keeping_inputs(fn, (points, owners, int(key)), ("points", "owners", "key")),
                     f"ring_lookup(points, owners, {int(key)}) (the owner, a server number)")
        assert got == want, (
            f"with points={shown(points, 50)} and owners={shown(owners, 50)}, key {int(key)} belongs to server "
            f"{want}, got {got}. A key goes to the first point >= key; a key after the last point wraps around "
            "to the first point.")


@question("ex05_1", points=2, title="Look up a key on the hash ring", names=("ring_lookup",))
def ex05_1(ns):
    """``ring_lookup(points, owners, key)``: points sorted; return the owner of the first point >= key,
    wrapping around to ``owners[0]`` for keys after the last point."""
    fn = ns["ring_lookup"]
    assert_lookup(fn, [10, 20, 30], [0, 1, 2], [(0, 0), (10, 0), (11, 1), (20, 1), (25, 2), (30, 2), (31, 0), (99, 0)])
    assert_lookup(fn, [5, 40, 70], [3, 1, 2], [(5, 3), (6, 1), (41, 2), (70, 2), (71, 3)])


# ------------------------------------------------------------------------------ ex05_2
def assert_gate(fn, cases):
    """``cases``: [(t, clocks, tau, may the worker read?)]."""
    for t, clocks, tau, want in cases:
        got = call_keeping_inputs(fn, (t, list(clocks), tau), ("t", "clocks", "tau"))
        if not isinstance(got, (bool, np.bool_)):
            raise AssertionError(f"may_read({t}, {list(clocks)}, {tau}) should return a bool, got {shown(got)}.")
        assert bool(got) == want, (
            f"a worker at clock t={t} with clocks {list(clocks)} and tau={tau}: may_read should be {want}, got "
            f"{bool(got)}. The slowest worker may be at most tau iterations behind: min(clocks) >= t - tau.")


@question("ex05_2", points=2, title="The bounded-delay gate", names=("may_read",))
def ex05_2(ns):
    """``may_read(t, clocks, tau)``: True iff ``min(clocks) >= t - tau`` (always True for tau = inf)."""
    assert_gate(ns["may_read"], [(3, [3, 3, 3], 0, True), (3, [2, 3, 3], 0, False), (3, [2, 5, 3], 1, True),
                                 (4, [2, 5, 3], 1, False), (5, [2, 5, 3], 3, True), (6, [2, 5, 3], 3, False),
                                 (100, [0, 0], math.inf, True)])


# ------------------------------------------------------------------------------ ex05_3
def assert_filter(fn, keys, residual, theta, want_keys, want_values, want_kept):
    keys, residual = np.asarray(keys), np.asarray(residual, dtype=float)
    out = call_keeping_inputs(fn, (keys, residual, theta), ("keys", "residual", "theta"))
    k, v, kept = as_sequence(out, 3, "significantly_modified's result (send_keys, send_values, kept)",
                             kinds=(tuple, list))
    head = f"keys {shown(keys, 40)}, residual {shown(residual, 50)}, theta={num(theta)}"
    k = as_array(k, f"{head}: send_keys", kinds="iu")
    if k.ndim != 1:
        raise AssertionError(f"{head}: send_keys should be a 1-D array of keys, got {shown(k)}.")
    assert k.tolist() == list(want_keys), (
        f"{head}: send exactly the keys whose |residual| > theta, in key order: expected {list(want_keys)}, "
        f"got {k.tolist()}.")
    v = as_array(v, f"{head}: send_values", shape=(len(want_values),))
    assert np.allclose(v, want_values, rtol=0, atol=0), (
        f"{head}: send_values should be the residual of the sent keys, {shown(np.asarray(want_values, float))}; "
        f"got {shown(v)}.")
    kept = as_array(kept, f"{head}: kept", shape=residual.shape)
    assert np.allclose(kept, want_kept, rtol=0, atol=0), (
        f"{head}: kept should be the residual with the sent entries set to zero, "
        f"{shown(np.asarray(want_kept, float))}; got "
        f"{shown(kept)}. Entries at or below the threshold stay, to be sent once they add up.")


@question("ex05_3", points=2, title="The significantly-modified filter", names=("significantly_modified",))
def ex05_3(ns):
    """``significantly_modified(keys, residual, theta)`` -> ``(send_keys, send_values, kept)``."""
    fn = ns["significantly_modified"]
    assert_filter(fn, [2, 5, 7, 9], [0.5, -0.01, -0.3, 0.02], 0.1, [2, 7], [0.5, -0.3], [0.0, -0.01, 0.0, 0.02])
    assert_filter(fn, [1, 2, 3], [0.0, 0.0, 0.0], 0.0, [], [], [0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------ ex05_4
def _segments(x, what):
    if not isinstance(x, (list, tuple)):
        raise AssertionError(f"{what} should be a list of segments (lo, hi, vec), got {shown(x)}.")
    out = []
    for s in x:
        lo, hi, vec = as_sequence(s, 3, f"each segment of {what} (lo, hi, vec)", kinds=(tuple, list))
        vec = as_array(vec, f"the vector of segment {shown(s, 40)} of {what}", kinds="iuf")
        out.append((as_int(lo, f"lo of a segment of {what}"), as_int(hi, f"hi of a segment of {what}"),
                    [int(v) if float(v).is_integer() else float(v) for v in vec.ravel()]))
    return out


def assert_merge(fn, a, b, want):
    a = [(lo, hi, np.array(v)) for lo, hi, v in a]
    b = [(lo, hi, np.array(v)) for lo, hi, v in b]
    got = _segments(call_keeping_inputs(fn, (a, b), ("a", "b")), "merge_clocks's result")
    want = [(lo, hi, list(v)) for lo, hi, v in want]
    assert got == want, (
        f"merging a = {_short(a)} and b = {_short(b)} should give {_short(want)}, got {_short(got)}. Cut at every "
        "boundary of a and of b, take the elementwise max on each piece, then join neighbouring pieces with equal "
        "vectors.")


def _short(segs, limit=200):
    text = "[" + ", ".join(f"({lo}, {hi}, {[int(v) for v in np.ravel(vec)]})" for lo, hi, vec in segs) + "]"
    return text if len(text) <= limit else text[:limit - 3] + "..."


@question("ex05_4", points=3, title="Merge vector clocks kept per key range", names=("merge_clocks",))
def ex05_4(ns):
    """``merge_clocks(a, b)``: two lists of segments ``(lo, hi, vec)`` covering the same ``[0, K)``."""
    fn = ns["merge_clocks"]
    assert_merge(fn, [(0, 10, [1, 0])], [(0, 10, [0, 2])], [(0, 10, [1, 2])])
    assert_merge(fn, [(0, 5, [1, 0]), (5, 10, [2, 0])], [(0, 3, [0, 4]), (3, 10, [0, 1])],
                 [(0, 3, [1, 4]), (3, 5, [1, 1]), (5, 10, [2, 1])])
    assert_merge(fn, [(0, 4, [1, 1]), (4, 9, [2, 0])], [(0, 2, [1, 1]), (2, 9, [2, 1])],
                 [(0, 2, [1, 1]), (2, 9, [2, 1])])                     # equal neighbours are joined


# ------------------------------------------------------------------------------ ex05_5
def assert_crossover(fn, cases):
    """``cases``: [(p, busiest_share, key_bytes, value_bytes, expected density)]."""
    for p, share, kb, vb, want in cases:
        args = (p, share, kb, vb)
        got = as_number(call_keeping_inputs(fn, args, ("p", "busiest_share", "key_bytes", "value_bytes")),
                        f"crossover_density{args}")
        assert abs(got - want) <= 1e-9 * abs(want), (
            f"with p={p} workers, the busiest server holding a share {num(share)} of the keys, {kb}-byte keys and "
            f"{vb}-byte values, the crossover density is {num(want)}, got {num(got)}. Count the bytes through the "
            "busiest rank, sent and received: a worker pulls k keys, gets k values, pushes k keys and k values; "
            "the busiest server sees a share of every worker's keys (but the busiest rank is at least as busy as "
            "a worker); a ring allreduce sends and receives 2(p-1)/p n values at every rank.")


@question("ex05_5", points=2, title="Parameter server or ring allreduce: the crossover density",
          names=("crossover_density",))
def ex05_5(ns):
    """``crossover_density(p, busiest_share, key_bytes, value_bytes)``: the density ``k / n`` where both move
    as many bytes through their busiest rank per step."""
    assert_crossover(ns["crossover_density"], [(3, 0.5, 8, 8, 4 / 9), (2, 0.5, 8, 8, 0.5), (4, 0.25, 8, 8, 0.75),
                                               (8, 1.0, 8, 8, 0.109375), (3, 0.2, 8, 8, 2 / 3)])
