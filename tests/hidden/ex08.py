"""Lesson 08: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex08 import (
    assert_buckets,
    assert_overlapped_run,
    assert_real_reduce_scatter,
    assert_scaling_sequence,
    assert_shard_ranges,
    assert_zero_formula,
    assert_zero_run,
    run_scaled_training,
)
from course_lib.reference.ex08 import assign_buckets, shard_range, update_scale, zero_bytes_per_param


@hidden_check("ex08_1", case="other sizes and caps, empty parameters, a real overlapped run")
def other_sizes_and_caps(ns):
    fn = ns["assign_buckets"]
    for sizes, cap in [([10, 1, 1], 4), ([1, 10, 1], 4), ([10, 20], 4), ([1, 2, 3, 4], 100), ([5], 5),
                       ([4, 0, 4, 0, 4, 0], 4), ([3, 5, 2], 7), (list(range(1, 40)), 50), ([7] * 9, 21)]:
        assert_buckets(fn, sizes, cap, assign_buckets(sizes, cap))
    rng = np.random.default_rng(8)
    for _ in range(200):
        sizes = [int(n) for n in rng.integers(0, 60, size=rng.integers(1, 25))]
        cap = int(rng.integers(1, 150))
        assert_buckets(fn, sizes, cap, assign_buckets(sizes, cap))
    assert_buckets(fn, [], 10, [])                          # no parameters, no bucket
    # three workers, a deeper stack, a cap of two layers' weights
    widths = (5, 7, 7, 7, 2)
    sizes = [4 * n for a, b in zip(widths[:-1], widths[1:]) for n in (a * b, b)]
    assert_overlapped_run(fn, widths, 9, 420, 3, assign_buckets(sizes, 420))


@hidden_check("ex08_2", case="other intervals and factors, a real fp16 run")
def other_intervals_factors_and_a_real_run(ns):
    fn = ns["update_scale"]
    rng = np.random.default_rng(8)
    for interval, flags, start, factors in [
            (1, [False, False, True, False], 2.0 ** 16, None),
            (5, [True, True, True] + [False] * 11, 2.0 ** 16, None),
            (2000, [False] * 2000 + [True], 1.0, None),
            (4, list(rng.random(60) < 0.2), 2.0 ** 10, None),
            (2, [False, False, True, False, False, False, False], 8.0, (4.0, 0.25))]:
        scale, clean, steps = start, 0, []
        for flag in flags:
            want = update_scale(scale, clean, bool(flag), interval, *(factors or ()))
            steps.append((bool(flag), want))
            scale, clean = want[0], want[1]
        assert_scaling_sequence(fn, interval, steps, start, factors)
    # the rule drives the scaler of a real 2-worker fp16 run: every skip halves the next step's scale
    out = run_scaled_training(fn, 40, 3)
    skips = [k for k, s in enumerate(out["skipped"]) if s]
    assert skips, "with growth_interval 3 the scale should reach an overflow within 40 steps of a real run"
    for k in skips[:-1] if skips[-1] == len(out["scales"]) - 1 else skips:
        assert out["scales"][k + 1] == out["scales"][k] / 2, (
            f"in a real run step {k} was skipped, yet the next step used scale {out['scales'][k + 1]} "
            f"instead of half of {out['scales'][k]}.")
    assert np.all(np.isfinite(out["losses"])) and out["losses"][-1] < out["losses"][0], (
        "the real fp16 run with your loss scaling did not train (its loss did not fall).")


@hidden_check("ex08_3", case="n not a multiple of p, empty shards, a large n, a real reduce-scatter")
def uneven_empty_and_large(ns):
    fn = ns["shard_range"]
    for n, p in [(16, 4), (7, 4), (3, 5), (0, 2), (1000003, 8), (1, 1)]:
        assert_shard_ranges(fn, n, p, [shard_range(n, p, r) for r in range(p)])
    assert_real_reduce_scatter(fn, 13, 4)


@hidden_check("ex08_4", case="other worker counts, real workers")
def four_workers_and_other_counts(ns):
    fn = ns["zero_bytes_per_param"]
    assert_zero_formula(fn, [(s, n, zero_bytes_per_param(s, n)) for s in range(4) for n in (1, 2, 3, 8, 64)])
    # stages 0-3 on 4 real workers (every layer of the default widths splits evenly in 4)
    assert_zero_run(fn, 4)
