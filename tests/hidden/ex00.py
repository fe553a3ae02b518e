"""Lesson 00: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions.ex00 import assert_fit, assert_ring, assert_shard_sums


def block_sums(values, size):
    """The sum of each rank's block in the course's split, np.array_split's."""
    return [float(np.sum(block)) for block in np.array_split(np.asarray(values), size)]


def least_squares(sizes, times):
    s, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    (lat, slope), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(s), s]), t, rcond=None)
    return float(lat), float(1.0 / slope)


#: The part of ex00_1's failure to name: the blocks of the other split, r*n//size.
CONVENTION = (("r*n//size convention", "the blocks follow r*n//size, not np.array_split's split"),)


@hidden_check("ex00_1", case="n not a multiple of the number of workers; an empty block")
def uneven_blocks(ns):
    rng = np.random.default_rng(7)
    values = rng.standard_normal(10)                                   # blocks of 3, 3, 2, 2
    with hidden_property("wrong when n is not a multiple of the number of workers", CONVENTION):
        assert_shard_sums(ns["sum_shard"], values, 4, block_sums(values, 4))
    values = np.array([1.0, 2.0, 3.0])                                 # rank 3's block is empty
    with hidden_property("wrong when a worker's block is empty (fewer values than workers)", CONVENTION):
        assert_shard_sums(ns["sum_shard"], values, 4, block_sums(values, 4))


@hidden_check("ex00_2", case="sizes not sorted, noisy times, plain lists, a larger message measured faster")
def unsorted_and_noisy(ns):
    fn = ns["fit_latency_bandwidth"]
    rng = np.random.default_rng(11)
    sizes = [1 << 20, 0, 1 << 12, 1 << 16, 1 << 8]                     # plain lists, not sorted
    times = [3e-6 + s / 8e9 for s in sizes]
    with hidden_property("wrong when the sizes are not sorted, or given as plain lists"):
        assert_fit(fn, sizes, times, 3e-6, 8e9)
    sizes = rng.permutation(np.array([512, 2048, 8192, 32768, 131072, 524288, 2097152], dtype=float))
    times = (1e-4 + sizes / 1e9) * (1 + 0.05 * rng.standard_normal(len(sizes)))
    lat, bw = least_squares(sizes, times)
    with hidden_property("not the least-squares fit when the times are noisy"):
        assert_fit(fn, sizes, times, lat, bw)
        assert_fit(fn, list(sizes), list(times), lat, bw)
    # small messages cost about the latency each, so jitter puts their times out of order
    sizes = np.array([4096, 0, 1 << 20, 64, 65536, 256, 1024], dtype=float)
    jitter = np.array([0.9, 1.5, 0.3, -0.8, -0.5, 0.4, -1.2]) * 1e-6
    times = 2e-5 + sizes / 1e9 + jitter
    lat, bw = least_squares(sizes, times)
    with hidden_property("wrong when a larger message was measured faster than a smaller one (keep each size "
                         "with its own time)"):
        assert_fit(fn, sizes, times, lat, bw)


@hidden_check("ex00_3", case="other ring sizes and a token that is not a number")
def other_sizes(ns):
    with hidden_property("wrong for another number of workers"):
        assert_ring(ns["ring_pass"], 3, 42, [42, 1, 2])
    with hidden_property("wrong for a token that is not a number"):
        assert_ring(ns["ring_pass"], 5, ("a", 1), [("a", 1), 1, 2, 3, 4])
