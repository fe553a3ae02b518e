"""Lesson 01: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex01 import (assert_comm_time, assert_full_gradient, assert_map, assert_reduce_update,
                                       assert_speedup_table, fake_times, least_squares_data)


@hidden_check("ex01_1")
def other_shapes(ns):
    X, y = least_squares_data(7, 3, seed=5)
    assert_full_gradient(ns["full_gradient"], X, y, np.zeros(3))
    X, Y = least_squares_data(31, 4, k=2, seed=6)  # two outputs: w is (d, 2)
    assert_full_gradient(ns["full_gradient"], X, Y, np.ones((4, 2)))


@hidden_check("ex01_2")
def uneven_shards(ns):
    X, y = least_squares_data(101, 3, seed=7)  # 101 rows on 4 workers: 26, 25, 25, 25
    assert_map(ns["map_gradient"], X, y, np.array([0.5, -2.0, 1.0]), 4)


@hidden_check("ex01_3")
def uneven_and_single(ns):
    rng = np.random.default_rng(8)
    assert_reduce_update(ns["reduce_update"], [rng.standard_normal((3, 2)) for _ in range(4)], 101,
                         rng.standard_normal((3, 2)), 0.05)
    assert_reduce_update(ns["reduce_update"], [rng.standard_normal(5)], 17, np.zeros(5), 1.0)


@hidden_check("ex01_4")
def vectorised_sizes(ns):
    for p in (2, 8, 16):
        assert_comm_time(ns["comm_time"], p, 123_456, 5e-5, 2.5e9)


@hidden_check("ex01_5")
def fewest_workers_is_not_one(ns):
    assert_speedup_table(ns["speedup_table"], fake_times(0.5, {2: 1.0, 4: 1.7, 8: 2.2}, seed=3))
