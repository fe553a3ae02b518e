"""Lesson 01, MapReduce gradient descent: visible checks.

ex01_1  full_gradient(X, y, w)                    gradient of L(w) = (1/2N) ||X w - y||^2
ex01_2  map_gradient(X_shard, y_shard, w)         the map: partial gradient sum of one shard (runs in workers)
ex01_3  reduce_update(partials, n_total, w, lr)   the reduce (sum, then 1/N) and the update step
ex01_4  comm_time(p, n_params, latency, bandwidth)  communication time per iteration from the model
ex01_5  speedup_table(times)                      speedups read from measured time per iteration
"""
import numpy as np

from course_lib.grading import question

CHECK_TIMEOUT = 30.0  # seconds a check's cluster run may take


def least_squares_data(n, d, k=None, seed=0):
    from course_lib.mapreduce import make_least_squares

    X, y, _ = make_least_squares(n, d, k=k, seed=seed)
    return X, y


def reference_gradient(X, y, w):
    return X.T @ (X @ w - y) / len(X)


def assert_full_gradient(fn, X, y, w):
    got = np.asarray(fn(X, y, w), dtype=float)
    want = reference_gradient(X, y, w)
    assert got.shape == want.shape, f"the gradient has the shape of w, {want.shape}; got {got.shape}"
    n = len(X)
    if np.allclose(got, want * n, rtol=1e-9, atol=1e-12) and n > 1:
        raise AssertionError(f"your gradient is N = {n} times too large: L(w) is an average over the "
                             "N samples, so its gradient carries the factor 1/N.")
    assert np.allclose(got, want, rtol=1e-10, atol=1e-12), (
        "expected (1/N) X^T (X w - y): the average over samples of g_i = (x_i^T w - y_i) x_i. "
        f"Max difference {np.max(np.abs(got - want)):.3g}.")


@question("ex01_1", points=1, title="The gradient is a sum over samples", names=("full_gradient",))
def ex01_1(ns):
    """Write ``full_gradient(X, y, w)``: the gradient of L(w) = (1/2N) sum_i (x_i^T w - y_i)^2,
    that is (1/N) sum_i (x_i^T w - y_i) x_i, with numpy (no loop over samples needed)."""
    X, y = least_squares_data(50, 4, seed=1)
    assert_full_gradient(ns["full_gradient"], X, y, np.linspace(-1, 1, 4))


def _map_in_workers(comm, fn, X, y, w):
    """Each rank maps its array_split shard of the shared data with the student's fn."""
    from course_lib.mapreduce import shard_ranges

    lo, hi = shard_ranges(len(X), comm.size)[comm.rank]
    Xa, ya = np.asarray(X), np.asarray(y)
    return np.asarray(fn(Xa[lo:hi], ya[lo:hi], w), dtype=float)


def assert_map(fn, X, y, w, n_workers):
    from course_lib import Cluster
    from course_lib.mapreduce import shard_ranges

    with Cluster(n_workers, timeout=CHECK_TIMEOUT) as cluster:
        Xs, ys = cluster.share(X), cluster.share(y)
        partials = list(cluster.run(_map_in_workers, fn, Xs, ys, w))
    for r, ((lo, hi), got) in enumerate(zip(shard_ranges(len(X), n_workers), partials)):
        want = X[lo:hi].T @ (X[lo:hi] @ w - y[lo:hi])
        assert got.shape == want.shape, f"rank {r}: the partial gradient has the shape of w, {want.shape}; got {got.shape}"
        if np.allclose(got * (hi - lo), want) and hi - lo > 1:
            raise AssertionError(f"rank {r} returned the *mean* over its {hi - lo} rows; the map returns the "
                                 "*sum* sum_i (x_i^T w - y_i) x_i over its rows (the server divides by N once).")
        assert np.allclose(got, want, rtol=1e-10, atol=1e-10), (
            f"rank {r} (rows {lo}:{hi}): expected the sum over its rows of (x_i^T w - y_i) x_i, "
            f"max difference {np.max(np.abs(got - want)):.3g}.")
    total = sum(partials) / len(X)
    assert np.allclose(total, reference_gradient(X, y, w)), "the partial sums must add up to N times the gradient"


@question("ex01_2", points=2, title="The map: a shard's partial gradient", names=("map_gradient",))
def ex01_2(ns):
    """Write ``map_gradient(X_shard, y_shard, w)``: the sum over the shard's rows of
    (x_i^T w - y_i) x_i. It runs inside the workers, on views of the shared data."""
    X, y = least_squares_data(90, 5, seed=2)
    assert_map(ns["map_gradient"], X, y, np.linspace(1, -1, 5), 3)


def assert_reduce_update(fn, partials, n_total, w, lr):
    partials = [np.asarray(p, dtype=float) for p in partials]
    got = np.asarray(fn([p.copy() for p in partials], n_total, w.copy(), lr), dtype=float)
    g = np.sum(partials, axis=0) / n_total
    want = w - lr * g
    assert got.shape == w.shape, f"return the new w, of shape {w.shape}; got {got.shape}"
    m = len(partials)
    if np.allclose(got, w - lr * g * n_total):
        raise AssertionError("the step is N times too large: divide the summed partial gradients by N "
                             "(the total number of samples) to get the gradient of the average loss.")
    if m > 1 and np.allclose(got, w - lr * g / m):
        raise AssertionError(f"the step is {m} times too small: you averaged twice. The partials are sums "
                             "over rows; add them up and divide by N only (dividing by the number of "
                             "workers as well counts the averaging twice).")
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12), (
        "expected w - lr * (sum of the partials) / N; "
        f"max difference {np.max(np.abs(got - want)):.3g}.")


@question("ex01_3", points=2, title="The reduce and the update", names=("reduce_update",))
def ex01_3(ns):
    """Write ``reduce_update(partials, n_total, w, lr)``: reduce the workers' partial sums (a list of
    arrays shaped like w) by sum, divide by the total sample count N, and return w - lr * gradient."""
    rng = np.random.default_rng(3)
    partials = [rng.standard_normal(4) for _ in range(3)]
    assert_reduce_update(ns["reduce_update"], partials, 30, rng.standard_normal(4), 0.1)


def reference_comm_time(p, n_params, latency, bandwidth):
    return 2 * latency + (p * 8 * n_params + 8 * (n_params + 1)) / bandwidth


def assert_comm_time(fn, p, n_params, latency, bandwidth):
    got = float(fn(p, n_params, latency, bandwidth))
    want = reference_comm_time(p, n_params, latency, bandwidth)
    if np.isclose(got, want, rtol=1e-9):
        return
    if np.isclose(got, want - 8 * (n_params + 1) / bandwidth + 8 * n_params / bandwidth):
        raise AssertionError("almost: the answer also carries the loss, so it is P + 1 words, not P.")
    if np.isclose(got, 2 * p * latency + (p * 8 * n_params + 8 * (n_params + 1)) / bandwidth):
        raise AssertionError("the latencies of the p messages in one direction overlap (the server does not "
                             "wait for one to arrive before sending the next): count 2 latencies, not 2p.")
    assert np.isclose(got, want, rtol=1e-9), (
        f"for p={p}, P={n_params}, latency={latency:g} s, bandwidth={bandwidth:g} B/s expected {want:.6g} s, "
        f"got {got:.6g} s. Bytes: p copies of w (8P each) leave the server one after the other, then one "
        "answer of 8(P + 1) bytes comes back; plus one latency each way.")


@question("ex01_4", points=1, title="Predict the communication time", names=("comm_time",))
def ex01_4(ns):
    """Write ``comm_time(p, n_params, latency, bandwidth)``: seconds of communication in one iteration
    on p workers: 2 * latency + (p * 8 * P + 8 * (P + 1)) / bandwidth, with P = n_params."""
    fn = ns["comm_time"]
    assert_comm_time(fn, 4, 1000, 1e-3, 1e8)
    assert_comm_time(fn, 1, 10, 0.0, 1e6)


def fake_times(t1, speedups, iters=9, seed=0):
    """{p: per-iteration times} with a slow first iteration and a little noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for p, s in speedups.items():
        t = np.full(iters, t1 / s) * (1 + 0.01 * rng.standard_normal(iters))
        t[0] *= 20  # the warm-up iteration
        t[rng.integers(1, iters)] *= 3  # one hiccup from a noisy neighbour
        out[p] = t
    return out


def assert_speedup_table(fn, times):
    got = fn({p: np.array(t) for p, t in times.items()})
    assert isinstance(got, dict) and set(got) == set(times), (
        f"return a dict with the same keys (worker counts) as the input, {sorted(times)}")
    base = np.median(np.asarray(times[min(times)])[1:])
    for p, t in times.items():
        want = base / np.median(np.asarray(t)[1:])
        val = float(got[p])
        if np.isclose(val, np.mean(times[min(times)]) / np.mean(t), rtol=1e-6) and not np.isclose(val, want, rtol=1e-6):
            raise AssertionError("use the median time per iteration, not the mean: one slow iteration "
                                 "(the first one, or a noisy neighbour) should not move the answer.")
        assert np.isclose(val, want, rtol=1e-6), (
            f"speedup({p}) should be median(T_1[1:]) / median(T_{p}[1:]) = {want:.4f}; got {val:.4f}. "
            "Drop the first (warm-up) iteration and compare with the fewest workers.")


@question("ex01_5", points=1, title="Read the speedup from a run", names=("speedup_table",))
def ex01_5(ns):
    """Write ``speedup_table(times)``: ``times`` maps a worker count p to its array of measured seconds
    per iteration; return {p: speedup}, speedup(p) = median(T_1[1:]) / median(T_p[1:]), where
    T_1 is the run with the fewest workers and [1:] drops the warm-up iteration."""
    assert_speedup_table(ns["speedup_table"], fake_times(0.02, {1: 1.0, 2: 1.9, 3: 2.6}))
