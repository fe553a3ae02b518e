"""Lesson 05: instructor-only checks (not shipped with the exercises)."""
import math

import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex05 import (
    assert_crossover,
    assert_filter,
    assert_gate,
    assert_lookup,
    assert_merge,
    check_sgd_loop,
)
from course_lib.reference.ex05 import crossover_density, may_read, merge_clocks, ring_lookup, significantly_modified


@hidden_check("ex05_1", case="many points, keys past the last point, a single point")
def many_points_and_wrap(ns):
    fn = ns["ring_lookup"]
    rng = np.random.default_rng(3)
    points = np.sort(rng.choice(10_000, 12, replace=False))
    owners = rng.integers(0, 4, 12)
    keys = list(rng.integers(0, 10_000, 40)) + [int(points[-1]) + 1, 9_999, 0, int(points[0]), int(points[5])]
    assert_lookup(fn, points, owners, [(int(k), ring_lookup(points, owners, int(k))) for k in keys])
    assert_lookup(fn, [7], [5], [(0, 5), (7, 5), (8, 5)])                 # a single point owns the whole ring


@hidden_check("ex05_2", case="clocks at the gate's boundary, tau = inf")
def gate_boundaries(ns):
    rng = np.random.default_rng(4)
    cases = []
    for _ in range(40):
        clocks = [int(c) for c in rng.integers(0, 10, 4)]
        tau = int(rng.integers(0, 4))
        t = int(min(clocks) + tau + rng.integers(-1, 2))                # right at the boundary, one each side
        cases.append((t, clocks, tau))
    cases += [(0, [0], 0), (7, [7, 100], 0), (10**6, [0], math.inf)]
    assert_gate(ns["may_read"], [(t, c, tau, bool(may_read(t, c, tau))) for t, c, tau in cases])


@hidden_check("ex05_3", case="many keys, residuals equal to theta, theta = 0")
def filter_edge_cases(ns):
    fn = ns["significantly_modified"]
    rng = np.random.default_rng(5)
    cases = [(np.sort(rng.choice(1000, 40, replace=False)), rng.standard_normal(40) * 0.1, 0.05),
             ([3, 4], [0.1, -0.1], 0.1),                                # strictly greater than theta
             ([3, 4], [0.2, -0.3], 0.0)]
    for keys, residual, theta in cases:
        k, v, kept = significantly_modified(keys, residual, theta)
        assert_filter(fn, keys, residual, theta, [int(x) for x in k], list(v), list(kept))


@hidden_check("ex05_4", case="clocks of several ranges with unaligned cuts, equal neighbours to join")
def random_clocks(ns):
    rng = np.random.default_rng(6)

    def random_clock(K=50, n=3):
        cuts = sorted(set(rng.integers(1, K, 4).tolist()))
        bounds = [0] + cuts + [K]
        return [(lo, hi, rng.integers(0, 5, n).tolist()) for lo, hi in zip(bounds[:-1], bounds[1:])]

    pairs = [(random_clock(), random_clock()) for _ in range(6)]
    same = [(0, 4, [1, 1]), (4, 9, [2, 0])]
    pairs += [(same, same), ([(0, 6, [0, 3])], [(0, 1, [1, 0]), (1, 5, [0, 0]), (5, 6, [0, 4])])]
    for a, b in pairs:
        want = merge_clocks([(lo, hi, np.array(v)) for lo, hi, v in a], [(lo, hi, np.array(v)) for lo, hi, v in b])
        assert_merge(ns["merge_clocks"], a, b, [(lo, hi, [int(x) for x in v]) for lo, hi, v in want])


@hidden_check("ex05_5", case="other worker counts, key and value sizes")
def other_sizes_and_cached_keys(ns):
    rng = np.random.default_rng(7)
    cases = [(int(rng.integers(2, 65)), float(rng.uniform(0.01, 1.0)), int(rng.choice([0, 4, 8])),
              int(rng.choice([2, 4, 8]))) for _ in range(12)]
    cases += [(2, 0.5, 0, 8), (16, 1 / 16, 8, 2), (5, 0.19, 8, 8)]      # no keys sent; p s = 1; p s just under 1
    assert_crossover(ns["crossover_density"], [(*c, crossover_density(*c)) for c in cases])


@hidden_check("ex05_6", case="one worker, replica chains, slow links")
def one_worker_chains_and_slow_links(ns):
    fn = ns["sgd_worker_loop"]
    check_sgd_loop(fn, n_servers=1, n_workers=1, iters=5, latency=0.005, seed=1)     # no other worker to wait for
    check_sgd_loop(fn, n_servers=3, n_workers=2, iters=5, latency=0.002, seed=2, replicas=1)  # acks after the chain
    check_sgd_loop(fn, n_servers=2, n_workers=2, iters=2, seed=4)                      # one next pull only
