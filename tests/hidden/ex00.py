"""Lesson 00: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex00 import assert_fit, assert_ring, assert_shard_sums, ping_pong_table


@hidden_check("ex00_1")
def uneven_blocks(ns):
    rng = np.random.default_rng(7)
    assert_shard_sums(ns["sum_shard"], rng.standard_normal(10), 4)   # blocks of 2, 3, 2, 3
    assert_shard_sums(ns["sum_shard"], np.array([1.0, 2.0, 3.0]), 4)  # one empty block


@hidden_check("ex00_2")
def unsorted_lists(ns):
    sizes = [1 << 20, 0, 1 << 12, 1 << 16, 1 << 8]           # plain lists, not sorted
    times = list(ping_pong_table(3e-6, 8e9, sizes))
    assert_fit(ns["fit_latency_bandwidth"], sizes, times, 3e-6, 8e9, rtol=1e-6)


@hidden_check("ex00_3")
def other_sizes(ns):
    assert_ring(ns["ring_pass"], 3, 42)
    assert_ring(ns["ring_pass"], 5, ("a", 1))
