"""Lesson 01, MapReduce gradient descent: visible checks.

ex01_1  full_gradient(X, y, w)                    gradient of L(w) = (1/2N) ||X w - y||^2
ex01_2  map_gradient(X_shard, y_shard, w)         the map: partial gradient sum of one shard (runs in workers)
ex01_3  reduce_update(partials, n_total, w, lr)   the reduce (sum, then 1/N) and the update step
ex01_4  comm_time(p, n_params, latency, bandwidth)  communication time per iteration from the model
ex01_5  speedup_table(times)                      speedups read from measured time per iteration
"""

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_array,
    as_number,
    assert_unchanged,
    call_keeping_inputs,
    formula_mismatch,
    num,
    off_by,
    readable,
    refuse_helpers,
    shown,
    unnamed,
)

CHECK_TIMEOUT = 6.0  # seconds a check's cluster run may take (these runs take well under one)



#: Library functions that do (part of) a question's work: the checks refuse an answer that calls them.
HELPERS = {
    "ex01_1": [("course_lib.async_ps.sgd_problems", "batch_gradient")],
    "ex01_2": [("course_lib.async_ps.sgd_problems", "batch_gradient"), ("course_lib.mapreduce.losses", "per_sample")],
    "ex01_3": [("course_lib.mapreduce.serial", "gd_update"), ("course_lib.mapreduce.serial", "reduce_results")],
    "ex01_4": [("course_lib.mapreduce.cost", "server_link_time")],
}


# ------------------------------------------------------------------------------ ex01_1
def assert_full_gradient(fn, X, y, w, want, within=unnamed):
    X, y, w = (np.asarray(a, dtype=float) for a in (X, y, w))
    with within("helper"):
        refuse_helpers(fn, (X, y, w), HELPERS["ex01_1"], "full_gradient")
    with within("inputs"):
        got = call_keeping_inputs(fn, (X, y, w), ("X", "y", "w"))
    with within("result"):
        _assert_gradient(got, X, w, want)


def _assert_gradient(got, X, w, want):
    got = as_array(got, "full_gradient's result (the gradient, shaped like w)", shape=w.shape)
    n = len(X)
    if n > 1 and np.allclose(got, np.asarray(want) * n, rtol=1e-9, atol=1e-12) and not np.allclose(want, 0):
        raise AssertionError(f"with N = {n} samples your gradient is N times too large ({shown(got)} instead of "
                             f"{shown(np.asarray(want))}): L(w) is an average, so its gradient carries 1/N.")
    assert np.allclose(got, want, rtol=1e-9, atol=1e-12), (
        f"expected the gradient (1/N) X^T (X w - y) = {shown(np.asarray(want))} with N = {n}, got {shown(got)}.")


@question("ex01_1", points=1, title="The gradient is a sum over samples", names=("full_gradient",))
def ex01_1(ns):
    """Write ``full_gradient(X, y, w)``: the gradient of L(w) = (1/2N) sum_i (x_i^T w - y_i)^2,
    that is (1/N) sum_i (x_i^T w - y_i) x_i, with numpy (no loop over samples needed)."""
    fn = ns["full_gradient"]
    X = [[1, 2, 0], [0, 1, -1], [2, 0, 1], [1, 1, 1], [-1, 0, 2]]
    assert_full_gradient(fn, X, [1, 0, 2, -1, 3], [0.5, -1, 2], [0.3, -1.1, 1.5])
    assert_full_gradient(fn, [[3, 1], [1, -2], [0, 4], [2, 2]], [1, -1, 2, 0], [-0.5, 0.25], [-1.9375, -1.8125])


# ------------------------------------------------------------------------------ ex01_2
def shard_ranges(n, m):
    """[(lo, hi)] of m contiguous shards of n rows with np.array_split's sizes (the first ones longer)."""
    sizes = [n // m + (1 if k < n % m else 0) for k in range(m)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def _map_in_worker(comm, fn, X, y, w):
    """Each rank maps its shard (np.array_split sizes) of the shared data, as views."""
    lo, hi = shard_ranges(len(X), comm.size)[comm.rank]
    return readable(fn(np.asarray(X)[lo:hi], np.asarray(y)[lo:hi], w))


@harness
def run_map(fn, X, y, w, n_workers):
    """Run ``fn`` on every rank's shard of shared X, y; return (per-rank results, X after, y after)."""
    from course_lib import Cluster

    with Cluster(n_workers, timeout=CHECK_TIMEOUT) as cluster:
        Xs, ys = cluster.share(np.asarray(X, dtype=float)), cluster.share(np.asarray(y, dtype=float))
        res = list(cluster.run(_map_in_worker, fn, Xs, ys, np.asarray(w, dtype=float)))
        return res, np.array(Xs.array), np.array(ys.array)


def assert_map(fn, X, y, w, n_workers, want, within=unnamed):
    """Rank r's partial sum must be ``want[r]``; the shared X and y must be left as they were."""
    X, y, w = (np.asarray(a, dtype=float) for a in (X, y, w))
    with within("helper"):
        refuse_helpers(fn, (X, y, w), HELPERS["ex01_2"], "map_gradient")
    partials, X_after, y_after = run_map(fn, X, y, w, n_workers)
    with within("inputs"):
        assert_unchanged("map_gradient", ["X_shard", "y_shard"], [X, y], [X_after, y_after])
    with within("result"):
        _assert_partials(partials, X, w, n_workers, want)


def _assert_partials(partials, X, w, n_workers, want):
    for r, ((lo, hi), got, wr) in enumerate(zip(shard_ranges(len(X), n_workers), partials, want)):
        got = as_array(got, f"rank {r}'s partial gradient", shape=w.shape)
        wr = np.asarray(wr, dtype=float)
        if hi - lo > 1 and np.allclose(got * (hi - lo), wr) and not np.allclose(wr, 0):
            raise AssertionError(f"rank {r} returned the *mean* over its {hi - lo} rows ({shown(got)}); the map "
                                 f"returns the *sum* over its rows, {shown(wr)} (the server divides by N once).")
        assert np.allclose(got, wr, rtol=1e-10, atol=1e-10), (
            f"rank {r} (rows {lo}:{hi} of {len(X)}) should return the sum over its rows of (x_i^T w - y_i) x_i = "
            f"{shown(wr)}, got {shown(got)}.")


@question("ex01_2", points=2, title="The map: a shard's partial gradient", names=("map_gradient",))
def ex01_2(ns):
    """Write ``map_gradient(X_shard, y_shard, w)``: the sum over the shard's rows of
    (x_i^T w - y_i) x_i. It runs inside the workers, on views of the shared data."""
    X = [[1, 0], [2, 1], [0, 3], [1, 1], [-1, 2], [3, 0], [2, -1], [0, 0], [1, 4]]
    y = [1, 2, 3, 0, -1, 2, 1, 0, 5]
    fn = ns["map_gradient"]
    assert_map(fn, X, y, [1.0, -0.5], 3, [[-1.0, -14.0], [4.5, -1.5], [-3.0, -25.5]])       # 3 rows each
    assert_map(fn, X[:7], y[:7], [1.0, -0.5], 3, [[-1.0, -14.0], [1.5, -1.5], [6.0, -1.5]])  # 3, 2 and 2 rows


# ------------------------------------------------------------------------------ ex01_3
def assert_reduce_update(fn, partials, n_total, w, lr, want, within=unnamed):
    partials = [np.asarray(p, dtype=float) for p in partials]
    w = np.asarray(w, dtype=float)
    with within("helper"):
        refuse_helpers(fn, (partials, n_total, w, lr), HELPERS["ex01_3"], "reduce_update")
    with within("inputs"):
        got = call_keeping_inputs(fn, (partials, n_total, w, lr), ("partials", "n_total", "w", "lr"))
    with within("result"):
        _assert_new_w(got, partials, n_total, w, lr, want)


def _assert_new_w(got, partials, n_total, w, lr, want):
    got = as_array(got, "reduce_update's result (the new w)", shape=w.shape)
    want = np.asarray(want, dtype=float)
    step_want, step_got = want - w, got - w
    m = len(partials)
    if np.allclose(got, want, rtol=1e-12, atol=1e-12):
        return
    # What the step does wrong, in words: the expected w is not shown (it is the answer worked out).
    why = None
    moving = not np.allclose(step_want, 0)
    for factor, what in ((n_total, "N times too large: the gradient is a mean over the N samples, and the "
                                   "partials are only sums"),
                         (1 / m, f"{m} times too small: each partial already sums its shard's rows, so dividing "
                                 "by the number of workers as well as by N averages twice"),
                         (-1, "in the wrong direction: a descent step goes against the gradient"),
                         (1 / lr if lr else 1, "not scaled by the learning rate lr")):
        if factor != 1 and moving and np.allclose(step_got, step_want * factor):
            why = f"your step (new w - w) is {what}"
            break
    if why is None:
        why = ("your new w is not one gradient-descent step from w: the full-batch gradient is the mean, over all "
               "N samples, of the per-sample gradients; the workers' partials are sums over their shards' rows; "
               "and the step goes against the gradient, scaled by lr")
    raise AssertionError(f"with {m} partials, N = {n_total} and lr = {num(lr)}: {why} (got {shown(got)}).")


@question("ex01_3", points=2, title="The reduce and the update", names=("reduce_update",))
def ex01_3(ns):
    """Write ``reduce_update(partials, n_total, w, lr)``: reduce the workers' partial sums (a list of
    arrays shaped like w) by sum, divide by the total sample count N, and return w - lr * gradient."""
    fn = ns["reduce_update"]
    partials = [[1.0, 2.0, -3.0, 0.5], [0.0, -1.0, 4.0, 1.5], [2.0, 0.5, -1.0, -2.0]]
    assert_reduce_update(fn, partials, 30, [0.1, -0.2, 0.3, 0.4], 0.1, [0.09, -0.205, 0.3, 0.4])
    assert_reduce_update(fn, [[6.0, -3.0], [1.5, 2.5]], 7, [1.0, 1.0], 0.5, [0.4642857142857143, 1.0357142857142858])


# ------------------------------------------------------------------------------ ex01_4
def assert_comm_time(fn, p, n_params, latency, bandwidth, want, within=unnamed):
    with within("helper"):
        refuse_helpers(fn, (p, n_params, latency, bandwidth), HELPERS["ex01_4"], "comm_time")
    with within("result"):
        _assert_seconds(fn(p, n_params, latency, bandwidth), p, n_params, latency, bandwidth, want)


def _assert_seconds(got, p, n_params, latency, bandwidth, want):
    got = as_number(got, "comm_time's result (seconds)")
    down, up = 8 * n_params, 8 * (n_params + 1)
    hints = {2 * latency + (p * down + up) / bandwidth:
             "counts the p copies of w and one answer, as if only the sender's link were busy; but the p "
             "answers also go through the server's one link, one after the other (incast), and each is 8 bytes "
             "longer than a copy of w (it carries the loss): the answers are the busier direction",
             2 * latency + (p * down + p * up) / bandwidth:
             "adds the two directions, as if the server could not receive while it sends; a link does both at "
             "once, and the answers come back as staggered as the copies left: only the busier direction (the p "
             "answers) and the first copy of w count"}
    for wrong, why in hints.items():
        if p > 1 and np.isclose(got, wrong, rtol=1e-9, atol=0) and not np.isclose(want, wrong, rtol=1e-9, atol=0):
            raise formula_mismatch(f"comm_time({p}, {n_params}, ...) = {num(got)} s {why}.", want)
    # The value itself is not shown (it could be worked back to the formula): what is off, and the concept.
    if not np.isclose(got, want, rtol=1e-9, atol=0):
        raise formula_mismatch(
            f"comm_time({p}, {n_params}, latency={num(latency)} s, bandwidth={num(bandwidth)} B/s) = {num(got)} s "
            f"is {off_by(got, want)}. " + _comm_time_concept(got, p, n_params, latency, bandwidth), want)


def _comm_time_concept(got, p, n_params, latency, bandwidth) -> str:
    """Which part of the communication time is off: the latency (one each way) or the bytes (the first
    copy of w, then the p answers entering the server's link one after the other)."""
    wire = (8 * n_params + p * 8 * (n_params + 1)) / bandwidth
    count = ("Count the first copy of w (8P bytes), then the p answers of P + 1 numbers entering the server's "
             "link one after the other, and one latency each way.")
    if latency:
        k = (got - wire) / latency
        if abs(k - round(k)) < 1e-6 and round(k) != 2:
            return (f"The bytes are right, but it counts the latency {round(k)} times: an iteration pays it once "
                    "each way, since the copies (and the answers) follow each other on the link. " + count)
        if abs(k - round(k)) >= 1e-6:
            return "The latency is not what is off: the bytes on the server's link are. " + count
    return count


@question("ex01_4", points=1, title="Predict the communication time", names=("comm_time",))
def ex01_4(ns):
    """Write ``comm_time(p, n_params, latency, bandwidth)``: seconds of communication in one iteration
    on p workers: 2 * latency + (8 * P + p * 8 * (P + 1)) / bandwidth, with P = n_params.
    The server's link sends the p copies of w one after the other and receives the p answers one
    after the other (incast); it does both at once, so the busier direction, the answers, sets the pace."""
    fn = ns["comm_time"]
    assert_comm_time(fn, 4, 1000, 1e-3, 1e8, 0.00240032)
    assert_comm_time(fn, 1, 10, 0.0, 1e6, 1.68e-4)


# ------------------------------------------------------------------------------ ex01_5
def assert_speedup_table(fn, times, want, within=unnamed):
    times = {p: np.asarray(t, dtype=float) for p, t in times.items()}
    with within("inputs"):
        got = call_keeping_inputs(fn, (times,), ("times",))
    with within("result"):
        _assert_speedups(got, times, want)


def _assert_speedups(got, times, want):
    if not isinstance(got, dict) or set(got) != set(times):
        raise AssertionError(f"speedup_table should return a dict with the same keys (worker counts) as times, "
                             f"{sorted(times)}; got {shown(got)}.")
    for p in sorted(times):
        val = as_number(got[p], f"speedup({p})")
        if not np.isclose(val, want[p], rtol=1e-6):
            raise formula_mismatch(
                f"speedup({p}) = {num(val)} is {off_by(val, want[p])}: it should be median(T_fewest[1:]) / "
                f"median(T_{p}[1:]). Drop the first (warm-up) iteration, use medians (a hiccup moves a mean, not a "
                "median), and compare with the run with the fewest workers.", want[p])


#: Seconds per iteration measured on 1, 2 and 3 workers (a slow first iteration, one hiccup each).
TIMES = {1: [0.4005, 0.01997, 0.02013, 0.02002, 0.01989, 0.06022, 0.02026, 0.02019, 0.01986],
         2: [0.2092, 0.01053, 0.01028, 0.0105, 0.0104, 0.01045, 0.01047, 0.01049, 0.03171],
         3: [0.1555, 0.007682, 0.007797, 0.007641, 0.02316, 0.007762, 0.0077, 0.007635, 0.007621]}


@question("ex01_5", points=1, title="Read the speedup from a run", names=("speedup_table",))
def ex01_5(ns):
    """Write ``speedup_table(times)``: ``times`` maps a worker count p to its array of measured seconds
    per iteration; return {p: speedup}, speedup(p) = median(T_1[1:]) / median(T_p[1:]), where
    T_1 is the run with the fewest workers and [1:] drops the warm-up iteration."""
    assert_speedup_table(ns["speedup_table"], TIMES, {1: 1.0, 2: 1.9155534351145038, 3: 2.610193732934599})
