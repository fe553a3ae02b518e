"""Lesson 05: instructor-only checks (not shipped with the exercises)."""
import math

import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex05 import assert_filter, assert_gate, assert_lookup, assert_merge


@hidden_check("ex05_1")
def many_points_and_wrap(ns):
    rng = np.random.default_rng(3)
    points = np.sort(rng.choice(10_000, 12, replace=False))
    owners = rng.integers(0, 4, 12)
    keys = list(rng.integers(0, 10_000, 60)) + [int(points[-1]) + 1, 9_999, 0, int(points[0])]
    assert_lookup(ns["ring_lookup"], points, owners, keys)
    assert_lookup(ns["ring_lookup"], [7], [5], [0, 7, 8])           # a single point owns the whole ring


@hidden_check("ex05_2")
def gate_boundaries(ns):
    rng = np.random.default_rng(4)
    cases = []
    for _ in range(60):
        clocks = list(rng.integers(0, 10, 4))
        tau = int(rng.integers(0, 4))
        t = int(min(clocks) + tau + rng.integers(-1, 2))           # right at the boundary, one each side
        cases.append((t, clocks, tau))
    cases += [(0, [0], 0), (7, [7, 100], 0), (10**6, [0], math.inf)]
    assert_gate(ns["may_read"], cases)


@hidden_check("ex05_3")
def filter_edge_cases(ns):
    rng = np.random.default_rng(5)
    keys = np.sort(rng.choice(1000, 40, replace=False))
    assert_filter(ns["significantly_modified"], keys, rng.standard_normal(40) * 0.1, 0.05)
    assert_filter(ns["significantly_modified"], [3, 4], [0.1, -0.1], 0.1)   # strictly greater than theta
    assert_filter(ns["significantly_modified"], [3, 4], [0.2, -0.3], 0.0)


@hidden_check("ex05_4")
def random_clocks(ns):
    rng = np.random.default_rng(6)

    def random_clock(K=50, n=3):
        cuts = sorted(set(rng.integers(1, K, 4).tolist()))
        bounds = [0] + cuts + [K]
        return [(lo, hi, rng.integers(0, 5, n).tolist()) for lo, hi in zip(bounds[:-1], bounds[1:])]

    for _ in range(8):
        assert_merge(ns["merge_clocks"], random_clock(), random_clock())
    same = [(0, 4, [1, 1]), (4, 9, [2, 0])]
    assert_merge(ns["merge_clocks"], same, same)
