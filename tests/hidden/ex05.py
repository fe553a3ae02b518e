"""Lesson 05: instructor-only checks (not shipped with the exercises)."""
import math

import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions import as_int, call_keeping_inputs, refuse_helpers
from course_lib.questions.ex05 import (
    HELPERS,
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

    def lookup(keys):
        assert_lookup(fn, points, owners, [(int(k), ring_lookup(points, owners, int(k))) for k in keys])

    with hidden_property("returns something other than an int (the owner, a server number)"):
        as_int(fn(points, owners, int(points[-1]) + 1), "ring_lookup's result")
    with hidden_property("wrong for keys past the last point: they wrap around to the first point"):
        lookup([int(points[-1]) + 1, 9_999])
    with hidden_property("wrong for a key equal to a point: that point owns it"):
        lookup([points[0], points[5]])
    with hidden_property("wrong for a key before the first point"):
        lookup([0])
    with hidden_property("wrong for a ring with a single point, which owns every key"):
        assert_lookup(fn, [7], [5], [(0, 5), (7, 5), (8, 5)])
    with hidden_property("wrong for keys between the points of a ring of many points: a key goes to the first "
                         "point at or after it"):
        lookup(rng.integers(0, 10_000, 40))


@hidden_check("ex05_2", case="clocks at the gate's boundary, tau = inf")
def gate_boundaries(ns):
    fn = ns["may_read"]
    rng = np.random.default_rng(4)
    cases = []
    for _ in range(40):
        clocks = [int(c) for c in rng.integers(0, 10, 4)]
        tau = int(rng.integers(0, 4))
        t = int(min(clocks) + tau + rng.integers(-1, 2))                # right at the boundary, one each side
        cases.append((t, clocks, tau))

    def gate(cases):
        assert_gate(fn, [(t, c, tau, bool(may_read(t, c, tau))) for t, c, tau in cases])

    with hidden_property("returns something other than a bool"):
        for t, clocks, tau in cases:
            got = fn(t, list(clocks), tau)
            assert isinstance(got, (bool, np.bool_)), f"may_read returned {got!r}"
    with hidden_property("changes the list of clocks it is given"):
        for t, clocks, tau in cases:
            call_keeping_inputs(fn, (t, list(clocks), tau), ("t", "clocks", "tau"))

    with hidden_property("wrong for clocks at the gate's boundary (the slowest worker just within tau, exactly "
                         "tau, or just beyond): the gate bounds how far the slowest worker lags"):
        gate(cases)
    with hidden_property("wrong for a single worker, or with tau zero and another worker far ahead"):
        gate([(0, [0], 0), (7, [7, 100], 0)])
    with hidden_property("wrong for tau = inf: the gate never closes"):
        gate([(10**6, [0], math.inf)])


@hidden_check("ex05_3", case="many keys, residuals equal to theta, theta = 0")
def filter_edge_cases(ns):
    fn = ns["significantly_modified"]
    rng = np.random.default_rng(5)
    cases = [("wrong for many keys, not all sent: send the keys whose |residual| is above theta, in key order, "
              "their residual, and keep the rest", np.sort(rng.choice(1000, 40, replace=False)),
              rng.standard_normal(40) * 0.1, 0.05),
             ("wrong for residuals equal to theta: only a residual strictly above theta is sent", [3, 4],
              [0.1, -0.1], 0.1),
             ("wrong for theta = 0: every non-zero residual is sent and nothing is kept", [3, 4], [0.2, -0.3], 0.0)]
    for says, keys, residual, theta in cases:
        k, v, kept = significantly_modified(keys, residual, theta)
        with hidden_property("changes the keys or the residual it is given: return new arrays"):
            call_keeping_inputs(fn, (np.asarray(keys), np.asarray(residual, dtype=float), theta),
                                ("keys", "residual", "theta"))
        with hidden_property(says):
            assert_filter(fn, keys, residual, theta, [int(x) for x in k], list(v), list(kept))


@hidden_check("ex05_4", case="clocks of several ranges with unaligned cuts, equal neighbours to join")
def random_clocks(ns):
    fn = ns["merge_clocks"]
    rng = np.random.default_rng(6)

    def random_clock(K=50, n=3):
        cuts = sorted(set(rng.integers(1, K, 4).tolist()))
        bounds = [0] + cuts + [K]
        return [(lo, hi, rng.integers(0, 5, n).tolist()) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def merge(a, b):
        want = merge_clocks([(lo, hi, np.array(v)) for lo, hi, v in a], [(lo, hi, np.array(v)) for lo, hi, v in b])
        assert_merge(fn, a, b, [(lo, hi, [int(x) for x in v]) for lo, hi, v in want])

    pairs = [(random_clock(), random_clock()) for _ in range(6)]
    with hidden_property("changes the clocks a or b it is given: build a new list"):
        for a, b in pairs:
            call_keeping_inputs(fn, ([(lo, hi, np.array(v)) for lo, hi, v in a],
                                     [(lo, hi, np.array(v)) for lo, hi, v in b]), ("a", "b"))
    with hidden_property("calls the library's helper that joins equal neighbouring segments: join them yourself"):
        refuse_helpers(fn, ([(lo, hi, np.array(v)) for lo, hi, v in pairs[0][0]],
                            [(lo, hi, np.array(v)) for lo, hi, v in pairs[0][1]]), HELPERS["ex05_4"], "merge_clocks")
    with hidden_property("returns segments whose vectors are not numpy arrays"):
        for a, b in pairs:
            out = fn([(lo, hi, np.array(v)) for lo, hi, v in a], [(lo, hi, np.array(v)) for lo, hi, v in b])
            segs = [seg for seg in (out if isinstance(out, (list, tuple)) else [])
                    if isinstance(seg, (tuple, list)) and len(seg) == 3]
            assert all(isinstance(seg[2], np.ndarray) for seg in segs), "a vector is not a numpy array"
    with hidden_property("wrong for clocks of several ranges with unaligned cuts: cut at every boundary of a and "
                         "of b, take the elementwise max on each piece, and join neighbours with equal vectors"):
        for a, b in pairs:
            merge(a, b)
    same = [(0, 4, [1, 1]), (4, 9, [2, 0])]
    with hidden_property("wrong when a clock is merged with itself: the result has the same segments"):
        merge(same, same)
    with hidden_property("wrong when the max makes several neighbouring pieces equal: join all of them into "
                         "one segment"):
        merge([(0, 6, [0, 3])], [(0, 1, [1, 0]), (1, 5, [0, 0]), (5, 6, [0, 4])])


@hidden_check("ex05_5", case="other worker counts, key and value sizes")
def other_sizes_and_cached_keys(ns):
    fn = ns["crossover_density"]
    rng = np.random.default_rng(7)
    cases = [(int(rng.integers(2, 65)), float(rng.uniform(0.01, 1.0)), int(rng.choice([0, 4, 8])),
              int(rng.choice([2, 4, 8]))) for _ in range(12)]

    def check(cases):
        assert_crossover(fn, [(*c, crossover_density(*c)) for c in cases])

    with hidden_property("calls the library's byte counts: count the bytes through the busiest rank yourself"):
        refuse_helpers(fn, cases[0], HELPERS["ex05_5"], "crossover_density")
    with hidden_property("wrong when keys cost no bytes (key size zero)"):
        check([(2, 0.5, 0, 8)])
    with hidden_property("wrong when the busiest server holds exactly its fair share of one over the number of "
                         "workers, or just under it: then a worker is the busiest rank"):
        check([(16, 1 / 16, 8, 2), (5, 0.19, 8, 8)])
    with hidden_property("wrong for other worker counts, key and value sizes, and shares of the busiest server"):
        check(cases)


@hidden_check("ex05_6", case="one worker, replica chains, slow links")
def one_worker_chains_and_slow_links(ns):
    fn = ns["sgd_worker_loop"]
    loop(fn, "with a single worker and a single server on slow links",
         n_servers=1, n_workers=1, iters=5, latency=0.005, seed=1)                     # no other worker to wait for
    loop(fn, "when each key range is copied down a chain of replicas (the acknowledgement of a push comes after "
         "the chain)", n_servers=3, n_workers=2, iters=5, latency=0.002, seed=2, replicas=1)
    loop(fn, "for a run of two iterations, with a single next pull", n_servers=2, n_workers=2, iters=2, seed=4)


def loop(fn, when, **run):
    """:func:`check_sgd_loop`, its failure named by the case and by the variant (depend) that failed."""
    try:
        check_sgd_loop(fn, **run)
    except AssertionError as failure:
        text = str(failure)
        variant = ("with depend=True (the next pull leaves once push t is acknowledged and the clock is advanced)"
                   if "depend=True" in text else
                   "with depend=False (the next pull leaves before the gradient of t, and is waited for only at "
                   "the start of the next iteration)" if "depend=False" in text else
                   "(one pull, one update, one push and one advance per iteration, in order)")
        with hidden_property(f"wrong {when}, {variant}; it runs your ring_lookup and may_read: if either is "
                             "wrong, fix it first"):
            raise
