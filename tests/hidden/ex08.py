"""Lesson 08: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions.ex08 import (
    assert_buckets,
    assert_overlapped_run,
    assert_real_reduce_scatter,
    assert_reduce_in_buckets,
    assert_scaling_sequence,
    assert_shard_ranges,
    assert_trains_like_serial,
    assert_zero_formula,
    assert_zero_run,
    run_scaled_training,
)
from course_lib.reference.ex08 import assign_buckets, shard_range, update_scale, zero_bytes_per_param

#: What part of ex08_1's check failed, read from its message.
BUCKET_PARTS = (("LAST parameter's gradient first", "the first bucket must start from the last parameter"),
                ("must stay within the cap", "a bucket of several parameters passes the cap"),
                ("may hold exactly cap_bytes", "a bucket may hold exactly the cap"),
                ("should return a list of buckets", "not a list of buckets"),
                ("must be in exactly one bucket", "some parameter is in no bucket or in several"),
                ("must not be empty", "an empty bucket"))


@hidden_check("ex08_1", case="other sizes and caps, empty parameters, a real overlapped run")
def other_sizes_and_caps(ns):
    fn = ns["assign_buckets"]
    for kind, cases in [
            ("wrong when a parameter is larger than the cap", [([10, 1, 1], 4), ([1, 10, 1], 4), ([10, 20], 4)]),
            ("wrong when every parameter fits in one bucket", [([1, 2, 3, 4], 100), ([5], 5)]),
            ("wrong when some parameters have no bytes", [([4, 0, 4, 0, 4, 0], 4)]),
            ("wrong when a bucket fills exactly to the cap", [([3, 5, 2], 7), ([7] * 9, 21)]),
            ("wrong for many parameters", [(list(range(1, 40)), 50)])]:
        with hidden_property(kind, BUCKET_PARTS):
            for sizes, cap in cases:
                assert_buckets(fn, sizes, cap, assign_buckets(sizes, cap))
    rng = np.random.default_rng(8)
    with hidden_property("wrong for random sizes and caps", BUCKET_PARTS):
        for _ in range(200):
            sizes = [int(n) for n in rng.integers(0, 60, size=rng.integers(1, 25))]
            cap = int(rng.integers(1, 150))
            assert_buckets(fn, sizes, cap, assign_buckets(sizes, cap))
    with hidden_property("wrong when there are no parameters", BUCKET_PARTS):
        assert_buckets(fn, [], 10, [])
    # three workers, a deeper stack, a cap of two layers' weights
    widths = (5, 7, 7, 7, 2)
    sizes = [4 * n for a, b in zip(widths[:-1], widths[1:]) for n in (a * b, b)]
    with hidden_property("wrong in a real overlapped run of a deeper network on more workers",
                 (("expected buckets", "not the expected buckets"),
                  ("completed the buckets in the order", "backward completes the buckets out of order"),
                  ("full-batch gradient", "the gradient is not the full-batch one"),
                  ("bytes", "the run sends other bytes than a ring allreduce per bucket"))):
        assert_overlapped_run(fn, widths, 9, 420, 3, assign_buckets(sizes, 420))


@hidden_check("ex08_2", case="other intervals and factors, a real fp16 run")
def other_intervals_factors_and_a_real_run(ns):
    fn = ns["update_scale"]
    rng = np.random.default_rng(8)
    for kind, interval, flags, start, factors in [
            ("wrong when the growth interval is a single step", 1, [False, False, True, False], 2.0 ** 16, None),
            ("wrong after several overflows in a row", 5, [True, True, True] + [False] * 11, 2.0 ** 16, None),
            ("wrong for a long growth interval", 2000, [False] * 2000 + [True], 1.0, None),
            ("wrong for a random mix of overflows and clean steps", 4, list(rng.random(60) < 0.2), 2.0 ** 10, None),
            ("ignores the growth and backoff factors it is given", 2, [False, False, True, False, False, False, False],
             8.0, (4.0, 0.25))]:
        scale, clean, steps = start, 0, []
        for flag in flags:
            want = update_scale(scale, clean, bool(flag), interval, *(factors or ()))
            steps.append((bool(flag), want))
            scale, clean = want[0], want[1]
        with hidden_property(kind, (("skip_step should be", "whether the step is skipped"),
                            ("your new scale", "the new scale"),
                            ("your clean-step count", "the clean-step count"))):
            assert_scaling_sequence(fn, interval, steps, start, factors)
    # the rule drives the scaler of a real 2-worker fp16 run: every skip halves the next step's scale
    out = run_scaled_training(fn, 40, 3)
    skips = [k for k, s in enumerate(out["skipped"]) if s]
    with hidden_property("in a real fp16 run the scale never grows until the gradients overflow"):
        assert skips, "with growth_interval 3 the scale should reach an overflow within 40 steps of a real run"
    with hidden_property("in a real fp16 run a skipped step does not halve the next step's scale"):
        for k in skips[:-1] if skips[-1] == len(out["scales"]) - 1 else skips:
            assert out["scales"][k + 1] == out["scales"][k] / 2, (
                f"in a real run step {k} was skipped, yet the next step used scale {out['scales'][k + 1]} "
                f"instead of half of {out['scales'][k]}.")
    with hidden_property("a real fp16 run with this loss scaling does not train"):
        assert np.all(np.isfinite(out["losses"])) and out["losses"][-1] < out["losses"][0], (
            "the real fp16 run with your loss scaling did not train (its loss did not fall).")


@hidden_check("ex08_3", case="n not a multiple of p, empty shards, a large n, a real reduce-scatter")
def uneven_empty_and_large(ns):
    fn = ns["shard_range"]
    for n, p, kind in [(16, 4, "wrong when n is a multiple of the number of ranks"),
                       (7, 4, "wrong when n is not a multiple of the number of ranks"),
                       (3, 5, "wrong when there are more ranks than elements (some ranges are empty)"),
                       (0, 2, "wrong for an empty vector"),
                       (1000003, 8, "wrong for a large n that is not a multiple of the number of ranks"),
                       (1, 1, "wrong for a single rank")]:
        with hidden_property(kind):
            assert_shard_ranges(fn, n, p, [shard_range(n, p, r) for r in range(p)])
    with hidden_property("does not match the chunks of a real reduce-scatter when n is not a multiple of p"):
        assert_real_reduce_scatter(fn, 13, 4)


@hidden_check("ex08_4", case="other worker counts, real workers")
def four_workers_and_other_counts(ns):
    fn = ns["zero_bytes_per_param"]
    for stage, kind in [(0, "wrong for plain data parallel (nothing sharded)"),
                        (1, "wrong when only the optimizer states are sharded"),
                        (2, "wrong when the gradients are sharded too"),
                        (3, "wrong when the parameters are sharded too")]:
        with hidden_property(f"{kind}, for other worker counts"):
            assert_zero_formula(fn, [(stage, n, zero_bytes_per_param(stage, n)) for n in (2, 3, 8, 64)])
    with hidden_property("wrong for a single worker"):
        assert_zero_formula(fn, [(s, 1, zero_bytes_per_param(s, 1)) for s in range(4)])
    # stages 0-3 on 4 real workers (every layer of the default widths splits evenly in 4)
    with hidden_property("does not match the bytes that real ZeRO workers hold, on more workers"):
        assert_zero_run(fn, 4)


#: What part of ex08_5's check failed, read from its message.
REDUCE_PARTS = (("your function called comm.", "it communicates otherwise than by one comm.iallreduce per bucket"),
                ("allreduce(s); expected one per bucket", "not one allreduce per bucket"),
                ("ran with algorithm=", "not the ring algorithm"),
                ("reduced with op", "not a sum"),
                ("carried", "an allreduce does not carry the bucket backward completed"),
                ("started when backward had made", "an allreduce starts later than its bucket's last gradient"),
                ("waited for allreduce", "it waits for an allreduce while backward still runs"),
                ("is the average", "the average instead of the sum"),
                ("not the sum over ranks", "the flat gradient is not the sum over ranks"),
                ("your result is", "the result's dtype"),
                ("asked backward for", "it does not read every gradient"),
                ("sent", "the bytes or messages of the step are not those of a ring allreduce per bucket"),
                ("did not end with the weights of serial training", "training does not match serial training"))


def _sizes(widths):
    return [4 * n for a, b in zip(widths[:-1], widths[1:]) for n in (a * b, b)]


@hidden_check("ex08_5", case="other buckets, worker counts and batches; Adam")
def other_buckets_workers_and_adam(ns):
    fn = ns["reduce_in_buckets"]
    deep = (5, 7, 7, 7, 2)                          # 8 parameters
    for kind, widths, batch, groups, p in [
            ("wrong for DDP's buckets of a deeper network on more workers", deep, 9,
             assign_buckets(_sizes(deep), 420), 3),
            ("wrong when the buckets are listed in model order (backward completes the last one first)", deep, 9,
             [[0, 1, 2, 3], [4, 5, 6, 7]], 3),
            ("wrong when a bucket's parameters are not neighbours", deep, 12, [[7, 5], [6, 4, 3], [2, 1, 0]], 2),
            ("wrong when every parameter has a bucket of its own", deep, 10, [[q] for q in range(7, -1, -1)], 4),
            ("wrong when one bucket holds every parameter", (4, 6, 3), 6, [[3, 2, 1, 0]], 3),
            ("wrong on a single worker", (4, 6, 3), 5, [[3, 2], [1, 0]], 1)]:
        with hidden_property(kind, REDUCE_PARTS):
            assert_reduce_in_buckets(fn, widths, batch, groups, p, seed=5)
    with hidden_property("ddp_train with it does not train as serial training does with Adam",
                         REDUCE_PARTS):
        assert_trains_like_serial(fn, deep, 12, assign_buckets(_sizes(deep), 300), 3, 4, "adam", seed=4)
    with hidden_property("ddp_train with it does not train as serial training does with SGD, buckets in model "
                         "order, more workers", REDUCE_PARTS):
        assert_trains_like_serial(fn, deep, 16, [[0, 1, 2, 3], [4, 5, 6, 7]], 4, 3, "sgd", seed=6)
