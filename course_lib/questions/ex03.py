"""Lesson 03, the asynchronous parameter server and Hogwild!: visible checks.

ex03_1  apply_update(state, grad, computed_version, worker, time, step_size)  the server's apply step
ex03_2  staleness_aware_lr(lr, staleness)                                      step size lr / (staleness + 1)
ex03_3  hogwild_worker(w, idx, val, y, order, lr)                              the lock-free worker loop
ex03_4  expected_wait(n, b, mu)                                                backup-worker wait prediction
ex03_5  fedavg(models, sizes)                                                  FedAvg's size-weighted average
"""
import time

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_array,
    as_int,
    as_number,
    assert_unchanged,
    formula_mismatch,
    num,
    off_by,
    readable,
    refuse_helpers,
    shown,
    worst,
)

CHECK_TIMEOUT = 6.0  # seconds a check's run on processes may take (these take well under one)


# ------------------------------------------------------------------------------ ex03_1
def _step_constant(lr, staleness):
    return lr


def _step_tenth(lr, staleness):
    return lr / 10


STEPS = {"constant": _step_constant, "tenth": _step_tenth}


def _plain_record(rec):
    return tuple(readable(v) for v in rec) if isinstance(rec, tuple) else readable(rec)


@harness
def run_apply(fn, w, lr, version, calls):
    """Apply gradients one by one to a fresh ServerState with the student's ``fn``.

    ``calls``: [(grad, computed_version, worker, time, step name)]. Returns one snapshot per call:
    {staleness, w, version, records, same_w (state.w is still the first array), grad (after)}."""
    from course_lib.async_ps import ServerState

    st = ServerState(w=np.array(w, dtype=np.float64), lr=lr, version=version)
    w_obj = st.w
    out = []
    for grad, v, worker, t, step in calls:
        g = np.array(grad, dtype=np.float64)
        s = fn(st, g, v, worker, t, STEPS[step])
        out.append({"staleness": readable(s), "w": readable(np.array(st.w) if isinstance(st.w, np.ndarray) else st.w),
                    "version": readable(st.version), "records": [_plain_record(r) for r in st.records],
                    "same_w": st.w is w_obj, "grad": g})
    return out


def assert_applies(fn, w, lr, version, calls, want):
    """Each snapshot must match ``want[k] = (staleness, w, version, record)``."""
    snaps = run_apply(fn, w, lr, version, calls)
    for k, (snap, (st, w_new, v_new, rec), call) in enumerate(zip(snaps, want, calls)):
        grad, cv = call[0], call[1]
        assert_unchanged("apply_update", ["grad"], [np.asarray(grad, dtype=float)], [snap["grad"]])
        head = f"gradient {k + 1} (computed on version {cv}, server at version {v_new - 1})"
        s = as_int(snap["staleness"], f"{head}: the returned staleness")
        assert s == st, (f"{head}: the staleness is server version - computed version = {st}, you returned {s}; "
                         "compute it before the update changes the version.")
        assert snap["same_w"], (f"{head}: update state.w in place (state.w -= ...): expected the same array object, "
                                "you replaced it with a new one.")
        got_w = as_array(snap["w"], f"{head}: state.w", shape=np.shape(w_new))
        assert np.allclose(got_w, w_new, rtol=1e-12, atol=1e-12), (
            f"{head}: expected state.w = w - step_size(state.lr, staleness) * grad = {shown(np.asarray(w_new))}, "
            f"got {shown(got_w)}.")
        assert snap["version"] == v_new, (f"{head}: expected state.version {v_new} (one more per gradient), "
                                          f"got {shown(snap['version'])}.")
        recs = snap["records"]
        assert len(recs) == k + 1, f"{head}: expected {k + 1} records (one per gradient), got {len(recs)}."
        got = recs[-1]
        want_rec = (f"Record(worker, computed_version, staleness, time, True, lr) = {shown(rec)}")
        ok = isinstance(got, tuple) and len(got) == 6
        if ok:
            for a, b in zip(got, rec):
                if isinstance(b, bool):
                    ok &= isinstance(a, (bool, np.bool_)) and bool(a) == b
                elif isinstance(b, int):
                    ok &= isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) and a == b
                else:
                    ok &= isinstance(a, (int, float, np.number)) and np.isclose(float(a), b, rtol=1e-12, atol=0)
        assert ok, f"{head}: expected the record {want_rec}, got {shown(got)}."


def _train_records(res):
    r = res.records
    return {k: np.asarray(r[k]) for k in ("worker", "version", "staleness", "lr")}, np.asarray(res.w)


@harness
def run_train_async(fn, X, y, n_workers, n_updates, lr, batch_size=16, seed=0, compute_time=0.0, slow=None):
    """train_async with the student's apply step; returns (records as arrays, final w)."""
    from course_lib.async_ps import train_async

    res = train_async(np.asarray(X), np.asarray(y), n_workers=n_workers, n_updates=n_updates, lr=lr,
                      batch_size=batch_size, seed=seed, compute_time=compute_time, slow=slow, apply=fn,
                      timeout=CHECK_TIMEOUT)
    return _train_records(res)


def check_apply_one_worker(apply):
    """One worker: nothing is stale, and the run is serial SGD exactly."""
    from course_lib.async_ps import make_least_squares, serial_sgd

    X, y, _ = make_least_squares(400, 6, seed=2)
    rec, w = run_train_async(apply, X, y, 1, 30, 0.1, batch_size=8, seed=3)
    st = rec["staleness"]
    assert (st == 0).all(), f"with one worker every gradient is fresh (staleness 0); your server recorded {shown(st)}."
    want, _ = serial_sgd(X, y, 30, 0.1, 8, seed=3)
    assert np.allclose(w, want, rtol=0, atol=1e-12), (
        f"with one worker the asynchronous server must give serial SGD exactly, but {worst(w, want, 'w')}.")


@question("ex03_1", points=3, title="The server's apply step, with staleness", names=("apply_update",))
def ex03_1(ns):
    """Write ``apply_update(state, grad, computed_version, worker, time, step_size)``: compute the
    staleness (server version minus the version the gradient was computed on), update ``state.w``
    in place with step ``step_size(state.lr, staleness)``, bump ``state.version``, append a
    ``Record(worker, computed_version, staleness, time, True, lr)``, return the staleness; ``grad``
    stays unchanged."""
    fn = ns["apply_update"]
    calls = [([2.0, 0.0, -2.0], 5, 1, 0.25, "constant"),     # fresh: computed on the server's version 5
             ([1.0, 1.0, 1.0], 2, 3, 0.5, "tenth")]          # 4 versions old, step lr / 10
    want = [(0, [0.0, 2.0, 4.0], 6, (1, 5, 0, 0.25, True, 0.5)),
            (4, [-0.05, 1.95, 3.95], 7, (3, 2, 4, 0.5, True, 0.05))]
    assert_applies(fn, [1.0, 2.0, 3.0], 0.5, 5, calls, want)
    check_apply_one_worker(fn)


# ------------------------------------------------------------------------------ ex03_2
def check_lr_values(fn, cases):
    """``cases``: [(lr, staleness, expected step)]."""
    for lr, s, want in cases:
        got = as_number(fn(lr, s), f"staleness_aware_lr({num(lr)}, {s})")
        if np.isclose(got, want, rtol=1e-12, atol=0):
            continue
        call = f"staleness_aware_lr({num(lr)}, {s}) = {num(got)} is {off_by(got, want)}"
        if s == 0:
            raise formula_mismatch(f"{call}: a fresh gradient (staleness 0) keeps the full step lr.", want)
        twice = as_number(fn(2 * lr, s), f"staleness_aware_lr({num(2 * lr)}, {s})")
        if not np.isclose(twice, 2 * got, rtol=1e-12, atol=0):
            raise formula_mismatch(f"{call}, and it does not double when lr doubles: the step is a share of lr, "
                                   "and the share depends on the staleness only.", want)
        raise formula_mismatch(f"{call}: a gradient s versions old takes the share 1/(s + 1) of the full step lr, "
                               "so its step shrinks in proportion to one more than its staleness.", want)


@question("ex03_2", points=1, title="Staleness-aware step size", names=("staleness_aware_lr",))
def ex03_2(ns):
    """Write ``staleness_aware_lr(lr, staleness)``: ``lr / (staleness + 1)``."""
    check_lr_values(ns["staleness_aware_lr"], [(0.1, 0, 0.1), (0.1, 1, 0.05), (0.3, 4, 0.06), (1.0, 9, 0.1)])


# ------------------------------------------------------------------------------ ex03_3
class _SpyArray(np.ndarray):
    """A float64 vector that remembers which coordinates each ``w[...] = ...`` wrote."""

    def __setitem__(self, key, value):
        writes = getattr(self, "writes", None)  # views and copies of the vector carry no log
        if writes is not None:
            writes.append(np.arange(len(self))[key].ravel())
        super().__setitem__(key, value)


@harness
def run_hogwild_spy(fn, d, idx, val, y, order, lr):
    """Run the worker in this process on a spied vector of zeros.

    Returns (its result, w after, the coordinates of each write in order, [idx, val, y, order] after)."""
    w = np.zeros(d).view(_SpyArray)
    w.writes = []
    args = [np.array(a) for a in (idx, val, y, order)]
    n = fn(w, *args, lr)
    return readable(n), np.array(w), [np.asarray(k, dtype=np.int64) for k in w.writes], args


def assert_hogwild_support(fn, d, idx, val, y, order, lr, want):
    """In one process the worker is serial SGD on ``order`` (result ``want``), writing only supports."""
    idx, val, y, order = np.asarray(idx), np.asarray(val, dtype=float), np.asarray(y, dtype=float), np.asarray(order)
    n, w, writes, after = run_hogwild_spy(fn, d, idx, val, y, order, lr)
    assert_unchanged("hogwild_worker", ["idx", "val", "y", "order"], [idx, val, y, order], after)
    got_n = as_int(n, "hogwild_worker's result (the number of updates)")
    assert got_n == len(order), f"hogwild_worker should return the number of updates, {len(order)}; got {got_n}."
    assert np.allclose(w, want, rtol=1e-12, atol=1e-12), (
        f"after one SGD step per sample of `order` on w (in place, one process), {worst(w, want, 'w')}.")
    # Match the writes, in order, to the samples: each write must stay inside the support of the
    # sample being processed (a sample may take several writes, one per coordinate for instance).
    k = 0
    for cols in writes:
        while k < len(order) and not set(cols.tolist()) <= set(idx[order[k]].tolist()):
            k += 1
        if k == len(order):
            raise AssertionError(
                f"a write touched {len(cols)} coordinates of w ({shown(cols, 40)}), outside the support idx[i] of the "
                "sample being processed: Hogwild! writes only w[idx[i]], since writing back a whole copy of w "
                "erases the updates other workers made meanwhile.")


@harness
def run_hogwild_processes(fn, n, d, nnz, seed, n_workers, n_updates, lr):
    """Hogwild! with the student's worker on ``n_workers`` processes; returns the final loss."""
    from course_lib.async_ps import make_sparse_problem, run_hogwild

    p = make_sparse_problem(n, d, nnz, seed=seed)
    return float(run_hogwild(p, n_workers=n_workers, n_updates=n_updates, lr=lr, worker=fn,
                             timeout=CHECK_TIMEOUT).loss)


def check_hogwild_processes(fn, n_workers, serial_loss, problem=(2000, 1000, 5, 1), n_updates=8000):
    loss = run_hogwild_processes(fn, *problem, n_workers, n_updates, 0.5)
    assert loss < 1.2 * serial_loss, (
        f"Hogwild! on {n_workers} processes should reach a loss within 1.2x of serial SGD's {num(serial_loss, 4)} "
        f"after the same {n_updates} updates on a sparse problem; yours reached {num(loss, 4)}.")


#: A sparse problem with 5 samples of 2 non-zeros on 8 coordinates, and 7 SGD steps on it.
SMALL = dict(d=8, idx=[[0, 3], [1, 4], [2, 7], [3, 5], [6, 7]],
             val=[[0.5, -0.25], [0.25, 1.0], [-0.5, 0.5], [1.0, 0.25], [0.125, -0.5]],
             y=[1.0, -2.0, 0.5, 3.0, -1.0], order=[0, 3, 1, 4, 0, 2, 3], lr=0.5)
SMALL_W_EXACT = [0.55859375, -0.25, -0.09375, 2.0927734375, -1.0, 0.593017578125, -0.0625, 0.34375]


@question("ex03_3", points=3, title="The Hogwild! worker loop", names=("hogwild_worker",))
def ex03_3(ns):
    """Write ``hogwild_worker(w, idx, val, y, order, lr)``: for each sample i in ``order``, one
    SGD step on the shared vector ``w`` touching only ``w[idx[i]]``, no lock; return the count. ``idx``,
    ``val``, ``y`` and ``order`` stay unchanged."""
    fn = ns["hogwild_worker"]
    assert_hogwild_support(fn, want=SMALL_W_EXACT, **SMALL)
    # 2 processes, 8000 updates on make_sparse_problem(2000, 1000, 5, seed=1); serial SGD reaches 0.01193
    check_hogwild_processes(fn, 2, 0.011930926280689612)


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


@harness
def run_time_per_update(fn, d=2_000_000, updates=100):
    """:func:`time_per_update` of the student's worker, measured on the student's side."""
    return float(time_per_update(fn, d, updates))


#: ``mu (H_{N+b} - H_b)`` is two calls of the lesson's harmonic number: the checks refuse it.
HARMONIC = [("course_lib.async_ps.theory", "harmonic")]


# ------------------------------------------------------------------------------ ex03_4
def check_expected_wait(fn, cases):
    """``cases``: [(n, b, mu, expected seconds)]."""
    refuse_helpers(fn, cases[0][:3], HARMONIC, "expected_wait")
    for n, b, mu, want in cases:
        got = as_number(fn(n, b, mu), f"expected_wait({n}, {b}, {num(mu)})")
        if np.isclose(got, want, rtol=1e-9, atol=0):
            continue
        call = f"expected_wait({n}, {b}, {num(mu)}) = {num(got)} is {off_by(got, want)}"
        twice = as_number(fn(n, b, 2 * mu), f"expected_wait({n}, {b}, {num(2 * mu)})")
        if not np.isclose(twice, 2 * got, rtol=1e-9, atol=0):
            raise formula_mismatch(f"{call}, and it does not double when mu doubles: every compute time scales "
                                   "with the mean mu, so the wait does too.", want)
        if b == 0:
            raise formula_mismatch(f"{call}: with no backups the server waits for the slowest of n exponential "
                                   "workers, mu H_n (H_n = 1 + 1/2 + ... + 1/n, the gaps between finishes).", want)
        raise formula_mismatch(f"{call}: with b backups the server waits for the n-th of n + b finishes only: "
                               "the gaps between the first n finishes, mu/(n+b) + mu/(n+b-1) + ... + mu/(b+1), "
                               "which is mu (H_(n+b) - H_b); the last b finishes are never waited for.", want)


@question("ex03_4", points=1, title="Backup workers: the expected wait", names=("expected_wait",))
def ex03_4(ns):
    """Write ``expected_wait(n, b, mu)``: expected time until the first n of n + b workers with
    exponential(mean mu) compute times finish, ``mu (H_{n+b} - H_b)``."""
    check_expected_wait(ns["expected_wait"], [(1, 0, 1.0, 1.0), (3, 1, 0.02, 0.021666666666666667),
                                              (4, 0, 2.0, 4.166666666666667), (5, 3, 0.5, 0.44226190476190475)])


# ------------------------------------------------------------------------------ ex03_5
@harness
def run_average(fn, models, sizes):
    """The student's average of ``models`` (lists) with ``sizes``; returns (result, models after, the
    models the result shares memory with: a new array shares none)."""
    arrays = [np.array(m, dtype=np.float64) for m in models]
    out = fn(arrays, list(sizes))
    shared = [k for k, m in enumerate(arrays) if isinstance(out, np.ndarray) and np.shares_memory(out, m)]
    return readable(np.asarray(out) if isinstance(out, (np.ndarray, list, tuple)) else out), arrays, shared


def check_average(fn, models, sizes, want):
    """``fn(models, sizes)`` must be ``want`` and leave the models as they were."""
    got, after, shared = run_average(fn, models, sizes)
    assert_unchanged("fedavg", [f"models[{k}]" for k in range(len(models))],
                     [np.asarray(m, dtype=float) for m in models], after)
    call = f"fedavg({shown([list(m) for m in models])}, sizes={list(sizes)})"
    assert not shared, (
        f"{call} returned an array that shares memory with models[{shared[0]}]: return a new array (the server "
        "keeps the result as its model and the clients' arrays change in the next round), e.g. with np.array "
        "or arithmetic that makes a new one, never one of the models itself or a view of it.")
    got = as_array(got, f"{call}", shape=np.shape(want))
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12), (
        f"{call} should be sum_k (n_k / n) w_k = {shown(np.asarray(want))}, got {shown(got)}: each model counts "
        "in proportion to its client's rows, and the weights add up to 1.")


@harness
def run_fedavg_rounds(fn, X, y, shard_ranges, n_rounds, n_steps, lr, min_answers=None, compute_time=0.0,
                      slow=None):
    """FedAvg on processes (a server and one client per shard) with the student's average.

    Returns (the models after each round, the clients averaged in each round)."""
    from course_lib.async_ps import train_fedavg

    res = train_fedavg(np.asarray(X), np.asarray(y), n_clients=len(shard_ranges), n_rounds=n_rounds,
                       local_steps=n_steps, lr=lr, shard_ranges=shard_ranges, min_answers=min_answers,
                       compute_time=compute_time, slow=slow, average=fn, timeout=CHECK_TIMEOUT)
    return res.models, res.answered


def check_fedavg_rounds(fn, want_w):
    """3 rounds, 3 clients of 20, 100 and 80 rows (non-IID), 2 local steps: the final model."""
    from course_lib.async_ps import make_least_squares

    X, y, _ = make_least_squares(200, 3, seed=4, n_shards=3, shard_shift=1.0)
    models, _ = run_fedavg_rounds(fn, X, y, [(0, 20), (20, 120), (120, 200)], 3, 2, 0.1)
    assert np.allclose(models[-1], want_w, rtol=0, atol=1e-9), (
        "3 rounds of FedAvg on real processes (3 clients holding 20, 100 and 80 rows, 2 local steps each, lr 0.1) "
        f"should end at w = {shown(np.asarray(want_w))} with your average as the server's step; "
        f"{worst(models[-1], want_w, 'w')}.")


@question("ex03_5", points=2, title="FedAvg: the server's weighted average", names=("fedavg",))
def ex03_5(ns):
    """Write ``fedavg(models, sizes)``: the clients' models averaged with weights n_k / n,
    ``sum_k (n_k / n) w_k`` (McMahan et al. 2017), as a new array; the models stay unchanged."""
    fn = ns["fedavg"]
    check_average(fn, [[1.0, 0.0], [0.0, 4.0], [2.0, 2.0]], [1, 1, 2], [1.25, 2.0])
    check_average(fn, [[3.0, -1.0, 0.5]], [7], [3.0, -1.0, 0.5])
    check_average(fn, [[0.0, 6.0], [6.0, 0.0]], [300, 100], [1.5, 4.5])
    check_fedavg_rounds(fn, [-0.6788291543519319, 1.3913604608938477, 0.8758908527398457])
