"""Lesson 03: instructor-only checks (more workers, other inputs, the cost of an update)."""
import numpy as np

from course_lib.async_ps import ServerState, make_least_squares, make_sparse_problem, run_serial, sample_order
from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions import assert_unchanged, readable, refuse_helpers
from course_lib.questions.ex03 import (
    HARMONIC,
    STEPS,
    assert_applies,
    assert_hogwild_support,
    check_average,
    check_expected_wait,
    check_hogwild_processes,
    check_lr_values,
    run_apply,
    run_average,
    run_fedavg_rounds,
    run_time_per_update,
    run_train_async,
    time_per_update,
)
from course_lib.reference.ex03 import apply_update, expected_wait, fedavg, hogwild_worker, staleness_aware_lr


def reference_snapshots(w, lr, version, calls):
    st = ServerState(w=np.array(w, dtype=float), lr=lr, version=version)
    out = []
    for grad, v, worker, t, step in calls:
        s = apply_update(st, np.array(grad, dtype=float), v, worker, t, STEPS[step])
        rec = st.records[-1]
        out.append((s, st.w.copy(), st.version, (rec.worker, rec.version, rec.staleness, rec.time, True, rec.lr)))
    return out


@hidden_check("ex03_1", case="stale gradients and a slow worker")
def stale_gradients_and_a_slow_worker(ns):
    fn = ns["apply_update"]
    rng = np.random.default_rng(31)
    calls = [(rng.standard_normal(4).tolist(), v, worker, 0.1 * k, step)
             for k, (v, worker, step) in enumerate([(10, 2, "tenth"), (9, 1, "constant"), (11, 3, "constant"),
                                                    (7, 2, "tenth")])]
    w0 = rng.standard_normal(4).tolist()
    want = reference_snapshots(w0, 0.2, 11, calls)
    snaps = run_apply(fn, w0, 0.2, 11, calls)
    with hidden_property("changes the gradient array it is given"):
        for (grad, *_), snap in zip(calls, snaps):
            assert_unchanged("apply_update", ["grad"], [np.asarray(grad, dtype=float)], [snap["grad"]])
    with hidden_property("replaces state.w with a new array instead of updating it in place"):
        assert all(snap["same_w"] for snap in snaps), "state.w is a new array"
    with hidden_property("wrong staleness for stale gradients: the server's version before the update minus "
                         "the version the gradient was computed on"):
        for snap, (st, *_) in zip(snaps, want):
            assert readable(snap["staleness"]) == st, "staleness"
    with hidden_property("wrong for stale gradients with a step size rule that is not constant: check the step "
                         "step_size(state.lr, staleness), the version and the record"):
        assert_applies(fn, w0, 0.2, 11, calls, want)
    X, y, _ = make_least_squares(400, 6, seed=2)
    rec, _ = run_train_async(fn, X, y, 3, 40, 0.05, compute_time=0.002, slow={3: 4})
    st, v = rec["staleness"], rec["version"]
    with hidden_property("with a slow worker on processes, the recorded staleness is negative or is not the "
                         "server's version when the gradient arrives minus the version it was computed on"):
        assert (st >= 0).all(), (
            "with a slow worker, staleness is never negative: a gradient cannot come from the future.")
        assert (v + st == np.arange(len(st))).all(), (
            "with three workers, computed_version + staleness must be the server's version when each gradient "
            "arrives.")


@hidden_check("ex03_2", case="other learning rates and staleness values")
def more_steps(ns):
    fn = ns["staleness_aware_lr"]
    with hidden_property("wrong for a fresh gradient (staleness zero): it keeps the full step lr"):
        check_lr_values(fn, [(lr, s, staleness_aware_lr(lr, s)) for lr, s in [(0.01, 0)]])
    with hidden_property("wrong for stale gradients with other learning rates: the step is lr divided by "
                         "one more than the staleness"):
        check_lr_values(fn, [(lr, s, staleness_aware_lr(lr, s)) for lr, s in [(0.5, 2), (3.0, 1)]])
    with hidden_property("wrong for a very stale gradient"):
        check_lr_values(fn, [(lr, s, staleness_aware_lr(lr, s)) for lr, s in [(2.0, 99)]])


@hidden_check("ex03_3", case="another sparse problem, more processes, the cost of an update")
def another_problem_more_processes_and_the_cost(ns):
    f = ns["hogwild_worker"]
    p = make_sparse_problem(300, 40, 6, seed=5)
    order = sample_order(p.n, 80, seed=5)
    want = np.zeros(p.d)
    hogwild_worker(want, p.idx, p.val, p.y, order, 0.3)
    with hidden_property("on another sparse problem in one process, not one SGD step per sample of order (in place "
                         "on w, writing only w[idx[i]], leaving the other arguments unchanged, returning the count)"):
        assert_hogwild_support(f, p.d, p.idx, p.val, p.y, order, 0.3, want)
    _, serial, _ = run_serial(make_sparse_problem(2000, 1000, 5, seed=2), 6000, 0.5)
    with hidden_property("on more processes sharing w, the loss stays far above serial SGD's: updates are lost "
                         "or do not reach the shared vector"):
        check_hogwild_processes(f, 3, serial, problem=(2000, 1000, 5, 2), n_updates=6000)
    # an update costs O(nnz), not O(d): no copy of the whole vector per update
    theirs, ours = run_time_per_update(f), time_per_update(hogwild_worker)
    with hidden_property("an update costs O(d), not O(non-zeros): it copies or scans the whole vector w"):
        assert theirs < 20 * ours + 50e-6, (
            f"one update should cost O(non-zeros), not O(d): on a vector of 2,000,000 coordinates with 5 non-zeros "
            f"per sample, yours took {theirs * 1e6:.0f} us per update (about {ours * 1e6:.0f} us expected).")


@hidden_check("ex03_4", case="other numbers of workers, backups and rates")
def more_waits(ns):
    fn = ns["expected_wait"]
    with hidden_property("calls the lesson's harmonic-number helper: write the sum yourself"):
        refuse_helpers(fn, (10, 5, 3.0), HARMONIC, "expected_wait")
    with hidden_property("wrong without backup workers (b is zero): the wait is mu H_n"):
        check_expected_wait(fn, [(n, b, mu, expected_wait(n, b, mu)) for n, b, mu in [(10, 0, 1.0)]])
    with hidden_property("wrong with more backup workers than workers, or a single worker: the wait is "
                         "mu (H_(n+b) - H_b), the first n finishes only"):
        check_expected_wait(fn, [(n, b, mu, expected_wait(n, b, mu)) for n, b, mu in [(2, 8, 0.1), (1, 1, 1.0)]])
    with hidden_property("wrong for other numbers of workers, backups and mean compute times"):
        check_expected_wait(fn, [(n, b, mu, expected_wait(n, b, mu)) for n, b, mu in [(10, 5, 3.0)]])


@hidden_check("ex03_5", case="other model counts, a round without the slow client")
def other_sizes_and_a_round_without_the_slow_client(ns):
    from course_lib.async_ps import fedavg_serial

    fn = ns["fedavg"]
    rng = np.random.default_rng(35)
    for n_models, d in ((4, 5), (2, 1), (6, 3), (1, 4)):                 # one client: still a new array
        models = rng.standard_normal((n_models, d)).tolist()
        sizes = rng.integers(1, 500, size=n_models).tolist()
        _, after, shared = run_average(fn, models, sizes)
        with hidden_property("changes the models it averages: leave the clients' arrays as they were"):
            assert_unchanged("fedavg", [f"models[{k}]" for k in range(len(models))],
                             [np.asarray(m, dtype=float) for m in models], after)
        with hidden_property("returns one of the models or a view of one, not a new array"):
            assert not shared, f"the result shares memory with models[{shared[0] if shared else ''}]"
        with hidden_property("not the size-weighted average sum_k (n_k / n) w_k for other numbers of clients "
                             "and model lengths"):
            check_average(fn, models, sizes, fedavg(models, sizes))
    # client 3 (of 3) is 8x slower and the rounds proceed with the first 2 answers: the average
    # renormalises over the clients that answered.
    X, y, _ = make_least_squares(300, 4, seed=6, n_shards=3, shard_shift=0.5)
    shards = [(0, 50), (50, 200), (200, 300)]
    models, answered = run_fedavg_rounds(fn, X, y, shards, 4, 2, 0.1, min_answers=2, compute_time=0.002,
                                         slow={3: 8})
    want = fedavg_serial(X, y, shards, 4, 2, 0.1, answered=[tuple(a) for a in answered])
    with hidden_property("with a slow client left out of a round, the average does not weigh by the sizes of "
                         "the clients that answered only (n is their total)"):
        assert np.allclose(models, want, rtol=0, atol=1e-9), (
            "with a slow client left out of each round, the average must use the sizes of the clients that "
            f"answered only; after 4 rounds, {np.abs(np.asarray(models) - want).max():.2e} off.")
