"""Lesson 01: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import named_kinds
from course_lib.mapreduce import make_least_squares
from course_lib.questions.ex01 import (
    assert_comm_time,
    assert_full_gradient,
    assert_map,
    assert_reduce_update,
    assert_speedup_table,
    shard_ranges,
)
from course_lib.reference.ex01 import comm_time, full_gradient, map_gradient, reduce_update, speedup_table


def named(result, inputs="changes its input arrays in place (compute into new arrays)"):
    """``within=`` of a visible assert: this lesson's phrase for each kind of assertion."""
    return named_kinds({"helper": "calls a course-library function that does this question's work (write it "
                                  "yourself)", "inputs": inputs}, otherwise=result)


def data(n, d, seed):
    X, y, _ = make_least_squares(n, d, seed=seed)
    return X, y


@hidden_check("ex01_1", case="other shapes, a single sample")
def other_shapes(ns):
    fn = ns["full_gradient"]
    for n, d, seed in ((7, 3, 5), (31, 4, 6), (1, 2, 7)):
        X, y = data(n, d, seed)
        w = np.random.default_rng(seed).standard_normal(d)
        kind = "wrong for a single sample" if n == 1 else "wrong for other shapes of X (other N and d)"
        assert_full_gradient(fn, X, y, w, full_gradient(X, y, w),
                             within=named(kind, inputs="changes X, y or w in place (compute into new arrays)"))


@hidden_check("ex01_2", case="n not a multiple of the number of workers")
def uneven_shards(ns):
    X, y = data(101, 3, 7)                                    # 101 rows on 4 workers: 26, 25, 25, 25
    w = np.array([0.5, -2.0, 1.0])
    want = [map_gradient(X[lo:hi], y[lo:hi], w) for lo, hi in shard_ranges(101, 4)]
    assert_map(ns["map_gradient"], X, y, w, 4, want,
               within=named("wrong when the number of rows is not a multiple of the number of workers "
                            "(shards of unequal sizes)",
                            inputs="changes the shared X or y (its shards are views of everybody's data)"))


@hidden_check("ex01_3", case="shards of unequal sizes, a single worker")
def uneven_and_single(ns):
    fn = ns["reduce_update"]
    rng = np.random.default_rng(8)
    partials, w = [rng.standard_normal(6) for _ in range(4)], rng.standard_normal(6)
    inputs = "changes w or the partials in place (return a new w)"
    assert_reduce_update(fn, partials, 101, w, 0.05, reduce_update(partials, 101, w, 0.05),
                         within=named("wrong when the shards hold unequal numbers of rows (the gradient is a mean "
                                      "over all N samples, and each partial a sum over its shard's rows)", inputs))
    partials = [rng.standard_normal(5)]
    assert_reduce_update(fn, partials, 17, np.zeros(5), 1.0, reduce_update(partials, 17, np.zeros(5), 1.0),
                         within=named("wrong for a single worker", inputs))


@hidden_check("ex01_4", case="other worker counts and model sizes")
def other_sizes(ns):
    for p, P in ((2, 123_456), (8, 10), (16, 5_000_000)):
        lat, bw = 5e-5, 2.5e9
        assert_comm_time(ns["comm_time"], p, P, lat, bw, comm_time(p, P, lat, bw),
                         within=named("wrong for other worker counts or model sizes (count the first copy of w, "
                                      "then the answers coming back one after the other, and one latency each way)"))


def fake_times(t1, speedups, iters=9, seed=0):
    """{p: per-iteration times} with a slow first iteration and one hiccup."""
    rng = np.random.default_rng(seed)
    out = {}
    for p, s in speedups.items():
        t = np.full(iters, t1 / s) * (1 + 0.01 * rng.standard_normal(iters))
        t[0] *= 20
        t[rng.integers(1, iters)] *= 3
        out[p] = t
    return out


@hidden_check("ex01_5", case="a slow first iteration and a hiccup in every run; fewest workers not 1 "
                             "and not listed first")
def fewest_workers_is_not_one(ns):
    inputs = "changes the arrays of times in place"
    times = fake_times(0.5, {1: 1.0, 2: 1.8, 4: 3.1}, iters=9, seed=4)
    assert_speedup_table(ns["speedup_table"], times, speedup_table(times),
                         within=named("wrong when a run has a slow first iteration and a hiccup (drop the first "
                                      "iteration, take medians)", inputs))
    times = fake_times(0.5, {4: 1.7, 2: 1.0, 8: 2.2}, iters=8, seed=3)   # fewest: 2, not listed first
    assert_speedup_table(ns["speedup_table"], times, speedup_table(times),
                         within=named("wrong when the run with the fewest workers is not the one with one worker, "
                                      "or not listed first", inputs))
