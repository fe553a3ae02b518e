"""Lesson 03, the asynchronous parameter server and Hogwild!: visible checks.

ex03_1  apply_update(state, grad, computed_version, worker, time, step_size)  the server's apply step
ex03_2  staleness_aware_lr(lr, staleness)                                      step size lr / (staleness + 1)
ex03_3  hogwild_worker(w, idx, val, y, order, lr)                              the lock-free worker loop
ex03_4  expected_wait(n, b, mu)                                                backup-worker wait prediction
"""
import time

import numpy as np

from course_lib.grading import question

CHECK_TIMEOUT = 30.0  # seconds a check's cluster run may take


# ------------------------------------------------------------------------------ ex03_1
def check_apply_in_process(apply):
    from course_lib.async_ps import ServerState, constant_lr

    st = ServerState(w=np.array([1.0, 2.0, 3.0]), lr=0.5, version=5)
    w_obj = st.w
    s = apply(st, np.array([2.0, 0.0, -2.0]), 5, 1, 0.25, constant_lr)
    assert s == 0, (f"a gradient computed on version 5 and applied while the server holds version 5 is "
                    f"fresh: staleness 0, you returned {s!r}. Compute the staleness *before* the update "
                    "changes the version.")
    assert st.version == 6, f"each applied gradient makes one new version: expected 6, got {st.version}"
    assert np.allclose(st.w, [0.0, 2.0, 4.0]), f"expected w - lr * grad = [0, 2, 4], got {st.w}"
    assert st.w is w_obj, "update state.w in place (state.w -= ...): workers' replies are built from it"
    assert len(st.records) == 1, f"append exactly one Record per applied gradient, got {len(st.records)}"
    rec = tuple(st.records[0])
    assert rec[:4] == (1, 5, 0, 0.25) and bool(rec[4]) and np.isclose(rec[5], 0.5), (
        f"the record is Record(worker, computed_version, staleness, time, True, lr); got {rec}")
    s = apply(st, np.ones(3), 2, 3, 0.5, lambda lr, k: lr / 10)
    assert s == 4, f"server at version 6, gradient from version 2: staleness 6 - 2 = 4, you returned {s!r}"
    assert st.version == 7 and tuple(st.records[-1])[:3] == (3, 2, 4)
    assert np.isclose(tuple(st.records[-1])[5], 0.05) and np.allclose(st.w, [-0.05, 1.95, 3.95]), (
        "use the step size step_size(state.lr, staleness), and record it")


def check_apply_one_worker(apply, start_method=None):
    from course_lib.async_ps import make_least_squares, serial_sgd, train_async

    X, y, _ = make_least_squares(400, 6, seed=2)
    res = train_async(X, y, n_workers=1, n_updates=30, lr=0.1, batch_size=8, seed=3, apply=apply,
                      start_method=start_method, timeout=CHECK_TIMEOUT)
    w, _ = serial_sgd(X, y, 30, 0.1, 8, seed=3)
    st = res.records["staleness"]
    assert (st == 0).all(), f"with one worker every gradient is fresh (staleness 0); you recorded {sorted(set(st))}"
    assert np.allclose(res.w, w, rtol=0, atol=1e-12), "with one worker the async PS must equal serial SGD exactly"


def check_apply_slow_worker(apply, start_method=None):
    from course_lib.async_ps import make_least_squares, train_async

    X, y, _ = make_least_squares(400, 6, seed=2)
    res = train_async(X, y, n_workers=3, n_updates=40, lr=0.05, compute_time=0.002, slow={3: 4},
                      apply=apply, start_method=start_method, timeout=CHECK_TIMEOUT)
    st, v = res.records["staleness"], res.records["version"]
    assert (st >= 0).all(), "staleness is never negative: a gradient cannot come from the future"
    assert (v + st == np.arange(len(st))).all(), (
        "computed_version + staleness must be the server's version when the gradient arrives")


@question("ex03_1", points=3, title="The server's apply step, with staleness", names=("apply_update",))
def ex03_1(ns):
    """Write ``apply_update(state, grad, computed_version, worker, time, step_size)``: compute the
    staleness (server version minus the version the gradient was computed on), update ``state.w``
    in place with step ``step_size(state.lr, staleness)``, bump ``state.version``, append a
    ``Record(worker, computed_version, staleness, time, True, lr)``, return the staleness."""
    check_apply_in_process(ns["apply_update"])
    check_apply_one_worker(ns["apply_update"])


# ------------------------------------------------------------------------------ ex03_2
def check_lr_values(fn, cases):
    for lr, s in cases:
        got = fn(lr, s)
        want = lr / (s + 1)
        assert np.isclose(got, want, rtol=1e-12), (
            f"staleness_aware_lr({lr}, {s}) should be lr / (staleness + 1) = {want:.6g}, got {got!r}"
            + (" (a fresh gradient, staleness 0, keeps the full step lr)" if s == 0 else ""))


def check_lr_on_processes(fn, start_method=None):
    from course_lib.async_ps import make_least_squares, train_async

    X, y, _ = make_least_squares(400, 6, seed=2)
    res = train_async(X, y, n_workers=3, n_updates=40, lr=0.08, compute_time=0.002, slow={3: 4},
                      policy="staleness_aware", step_size=fn, start_method=start_method,
                      timeout=CHECK_TIMEOUT)
    r = res.records
    assert np.allclose(r["lr"], 0.08 / (r["staleness"] + 1)), "each applied step must be lr / (staleness + 1)"
    assert r["staleness"].max() > 0, "the slow worker's gradients should have arrived stale"


@question("ex03_2", points=1, title="Staleness-aware step size", names=("staleness_aware_lr",))
def ex03_2(ns):
    """Write ``staleness_aware_lr(lr, staleness)``: ``lr / (staleness + 1)``."""
    check_lr_values(ns["staleness_aware_lr"], [(0.1, 0), (0.1, 1), (0.3, 4), (1.0, 9)])
    check_lr_on_processes(ns["staleness_aware_lr"])


# ------------------------------------------------------------------------------ ex03_3
class _SpyArray(np.ndarray):
    """A float64 vector that remembers which coordinates each ``w[...] = ...`` wrote."""

    def __setitem__(self, key, value):
        writes = getattr(self, "writes", None)  # copies of the vector carry no log
        if writes is not None:
            writes.append(np.arange(len(self))[key])
        super().__setitem__(key, value)


def check_hogwild_support(worker, seed=0, n=200, d=60, nnz=3, updates=50):
    from course_lib.async_ps import make_sparse_problem, sample_order, serial_sparse_sgd

    p = make_sparse_problem(n, d, nnz, seed=seed)
    order = sample_order(p.n, updates, seed=seed)
    w = np.zeros(p.d).view(_SpyArray)
    w.writes = []
    worker(w, p.idx, p.val, p.y, order, 0.5)
    want = serial_sparse_sgd(p.idx, p.val, p.y, p.d, order, 0.5)
    assert np.allclose(np.asarray(w), want, atol=1e-12), (
        "in one process your worker must do exactly serial SGD on the samples in `order`, "
        "updating the shared vector w in place")
    for i, written in zip(order, w.writes):
        extra = set(written.ravel().tolist()) - set(p.idx[i].tolist())
        assert not extra, (
            f"an update on sample {i} wrote {len(extra)} coordinates outside its support idx[{i}]: "
            "Hogwild! writes only w[idx[i]]; writing back a whole copy of w erases the other "
            "workers' updates made meanwhile")


def check_hogwild_processes(worker, n_workers=2, start_method=None):
    from course_lib.async_ps import make_sparse_problem, run_hogwild, run_serial

    p = make_sparse_problem(2000, 1000, 5, seed=1)
    _, serial, _ = run_serial(p, 8000, 0.5)
    res = run_hogwild(p, n_workers=n_workers, n_updates=8000, lr=0.5, worker=worker,
                      start_method=start_method, timeout=CHECK_TIMEOUT)
    assert res.loss < 1.2 * serial, (
        f"Hogwild! on {n_workers} processes reached loss {res.loss:.4g}, serial SGD {serial:.4g} "
        "after the same 8000 updates: on a sparse problem they should be within 1.2x")


@question("ex03_3", points=3, title="The Hogwild! worker loop", names=("hogwild_worker",))
def ex03_3(ns):
    """Write ``hogwild_worker(w, idx, val, y, order, lr)``: for each sample i in ``order``, one
    SGD step on the shared vector ``w`` touching only ``w[idx[i]]``, no lock; return the count."""
    check_hogwild_support(ns["hogwild_worker"])
    check_hogwild_processes(ns["hogwild_worker"])


# ------------------------------------------------------------------------------ ex03_4
def check_expected_wait(fn, cases):
    from course_lib.async_ps import expected_backup_wait

    for n, b, mu in cases:
        got = fn(n, b, mu)
        want = expected_backup_wait(n, b, mu)
        assert np.isclose(got, want, rtol=1e-9), (
            f"expected_wait({n}, {b}, {mu}) should be mu (H_(N+b) - H_b) = {want:.6g}, got {got!r}"
            + (" (with b = 0 it is mu H_N)" if b == 0 else ""))


@question("ex03_4", points=1, title="Backup workers: the expected wait", names=("expected_wait",))
def ex03_4(ns):
    """Write ``expected_wait(n, b, mu)``: expected time until the first n of n + b workers with
    exponential(mean mu) compute times finish, ``mu (H_{n+b} - H_b)``."""
    check_expected_wait(ns["expected_wait"], [(1, 0, 1.0), (3, 1, 0.02), (4, 0, 2.0), (5, 3, 0.5)])


def time_per_update(worker, d=2_000_000, updates=100):
    """Seconds per update of ``worker`` on a long, very sparse vector (one process, best of 3)."""
    from course_lib.async_ps import make_sparse_problem, sample_order

    p = make_sparse_problem(300, d, 5, seed=3)
    order = sample_order(p.n, updates, seed=3)
    best = float("inf")
    for _ in range(3):
        w = np.full(d, 0.0)  # pages touched before timing
        t0 = time.perf_counter()
        worker(w, p.idx, p.val, p.y, order, 0.5)
        best = min(best, (time.perf_counter() - t0) / updates)
    return best
