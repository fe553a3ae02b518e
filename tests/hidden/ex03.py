"""Lesson 03: instructor-only checks (more workers, other inputs, the cost of an update)."""
import numpy as np

from course_lib.async_ps import ServerState, make_least_squares, make_sparse_problem, run_serial, sample_order
from course_lib.grading import hidden_check
from course_lib.questions.ex03 import (
    STEPS,
    assert_applies,
    assert_hogwild_support,
    check_average,
    check_expected_wait,
    check_hogwild_processes,
    check_lr_values,
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
    assert_applies(fn, w0, 0.2, 11, calls, reference_snapshots(w0, 0.2, 11, calls))
    X, y, _ = make_least_squares(400, 6, seed=2)
    rec, _ = run_train_async(fn, X, y, 3, 40, 0.05, compute_time=0.002, slow={3: 4})
    st, v = rec["staleness"], rec["version"]
    assert (st >= 0).all(), "with a slow worker, staleness is never negative: a gradient cannot come from the future."
    assert (v + st == np.arange(len(st))).all(), (
        "with three workers, computed_version + staleness must be the server's version when each gradient arrives.")


@hidden_check("ex03_2", case="other learning rates and staleness values")
def more_steps(ns):
    cases = [(0.5, 2), (2.0, 99), (0.01, 0), (3.0, 1)]
    check_lr_values(ns["staleness_aware_lr"], [(lr, s, staleness_aware_lr(lr, s)) for lr, s in cases])


@hidden_check("ex03_3", case="another sparse problem, more processes, the cost of an update")
def another_problem_more_processes_and_the_cost(ns):
    f = ns["hogwild_worker"]
    p = make_sparse_problem(300, 40, 6, seed=5)
    order = sample_order(p.n, 80, seed=5)
    want = np.zeros(p.d)
    hogwild_worker(want, p.idx, p.val, p.y, order, 0.3)
    assert_hogwild_support(f, p.d, p.idx, p.val, p.y, order, 0.3, want)
    _, serial, _ = run_serial(make_sparse_problem(2000, 1000, 5, seed=2), 6000, 0.5)
    check_hogwild_processes(f, 3, serial, problem=(2000, 1000, 5, 2), n_updates=6000)
    # an update costs O(nnz), not O(d): no copy of the whole vector per update
    theirs, ours = run_time_per_update(f), time_per_update(hogwild_worker)
    assert theirs < 20 * ours + 50e-6, (
        f"one update should cost O(non-zeros), not O(d): on a vector of 2,000,000 coordinates with 5 non-zeros per "
        f"sample, yours took {theirs * 1e6:.0f} us per update (about {ours * 1e6:.0f} us expected).")


@hidden_check("ex03_4", case="other numbers of workers, backups and rates")
def more_waits(ns):
    cases = [(10, 0, 1.0), (10, 5, 3.0), (2, 8, 0.1), (1, 1, 1.0)]
    check_expected_wait(ns["expected_wait"], [(n, b, mu, expected_wait(n, b, mu)) for n, b, mu in cases])


@hidden_check("ex03_5", case="other model counts, a round without the slow client")
def other_sizes_and_a_round_without_the_slow_client(ns):
    from course_lib.async_ps import fedavg_serial

    fn = ns["fedavg"]
    rng = np.random.default_rng(35)
    for n_models, d in ((4, 5), (2, 1), (6, 3)):
        models = rng.standard_normal((n_models, d)).tolist()
        sizes = rng.integers(1, 500, size=n_models).tolist()
        check_average(fn, models, sizes, fedavg(models, sizes))
    # client 3 (of 3) is 8x slower and the rounds proceed with the first 2 answers: the average
    # renormalises over the clients that answered.
    X, y, _ = make_least_squares(300, 4, seed=6, n_shards=3, shard_shift=0.5)
    shards = [(0, 50), (50, 200), (200, 300)]
    models, answered = run_fedavg_rounds(fn, X, y, shards, 4, 2, 0.1, min_answers=2, compute_time=0.002,
                                         slow={3: 8})
    want = fedavg_serial(X, y, shards, 4, 2, 0.1, answered=[tuple(a) for a in answered])
    assert np.allclose(models, want, rtol=0, atol=1e-9), (
        "with a slow client left out of each round, the average must use the sizes of the clients that answered "
        f"only; after 4 rounds, {np.abs(np.asarray(models) - want).max():.2e} off.")
