"""Lesson 03: asynchronous parameter server, staleness, backup workers, Hogwild!.

Real processes throughout; each claim of the notebook is checked against a single-process
baseline or a formula: one-worker async PS == serial SGD bit for bit; staleness >= 0, 0 for one
worker, larger for a slow worker; each policy's rule holds on every record; the backup-worker
wait matches mu (H_{N+b} - H_b); Hogwild! matches serial SGD on a sparse problem.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from course_lib import Fault
from course_lib.async_ps import (
    ServerState,
    apply_update,
    expected_backup_wait,
    harmonic,
    hogwild_worker,
    locked_worker,
    make_least_squares,
    make_sparse_problem,
    run_hogwild,
    run_serial,
    sample_order,
    serial_sgd,
    serial_sparse_sgd,
    simulate_backup_wait,
    sparse_loss,
    sparsity_stats,
    staleness_aware_lr,
    train_async,
)


@pytest.fixture(scope="module")
def data():
    X, y, _ = make_least_squares(1000, 10, seed=0)
    return X, y


def my_segments():
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"course_{os.getpid()}_")] \
        if os.path.isdir("/dev/shm") else []


# ---------------------------------------------------------------- theory (no processes)
def test_harmonic_numbers():
    assert harmonic(0) == 0 and harmonic(1) == 1 and harmonic(4) == pytest.approx(25 / 12)
    with pytest.raises(ValueError):
        harmonic(-1)


@pytest.mark.parametrize("n,b", [(1, 0), (3, 1), (4, 0), (8, 2), (16, 4)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backup_wait_monte_carlo_within_10_percent(n, b, seed):
    mu = 0.7
    want = expected_backup_wait(n, b, mu)
    got = simulate_backup_wait(n, b, mu, rounds=20000, seed=seed).mean()
    assert abs(got - want) < 0.10 * want, (got, want)
    assert abs(got - want) < 0.03 * want  # 20000 rounds: much tighter in fact


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
def test_backups_shorten_the_wait():
    # b = 0: mu H_N grows like ln N; backups cut it.
    assert expected_backup_wait(4, 0, 1.0) == pytest.approx(harmonic(4))
    assert expected_backup_wait(3, 1, 1.0) < expected_backup_wait(3, 0, 1.0)
    assert expected_backup_wait(1, 0, 2.0) == pytest.approx(2.0)  # one exponential: its mean


def test_sparsity_stats_by_hand():
    idx = np.array([[0, 1], [1, 2], [3, 4]])
    s = sparsity_stats(idx, 5)
    assert s == {"Omega": 2, "Delta": pytest.approx(2 / 3), "rho": pytest.approx(2 / 3)}
    dense = sparsity_stats(np.tile(np.arange(6), (4, 1)), 6)
    assert dense == {"Omega": 6, "Delta": 1.0, "rho": 1.0}
    sparse = sparsity_stats(make_sparse_problem(2000, 2000, 5).idx, 2000)
    assert sparse["Omega"] == 5 and sparse["rho"] < 0.05 and sparse["Delta"] < 0.01


def test_sparse_problem_and_serial_sgd_match_the_dense_formula():
    p = make_sparse_problem(200, 30, 4, seed=3)
    X = p.dense()
    assert ((X != 0).sum(axis=1) == 4).all()
    order = sample_order(p.n, 300, seed=1)
    w = serial_sparse_sgd(p.idx, p.val, p.y, p.d, order, 0.3)
    v = np.zeros(p.d)
    for i in order:  # the same SGD with dense rows
        v -= 0.3 * (X[i] @ v - p.y[i]) * X[i]
    assert np.allclose(w, v, atol=1e-12)
    r = X @ w - p.y
    assert sparse_loss(p.idx, p.val, p.y, w) == pytest.approx(r @ r / (2 * p.n))


def test_apply_update_bookkeeping():
    st = ServerState(w=np.ones(3), lr=0.5, version=7)
    s = apply_update(st, np.array([2.0, 0, 0]), 4, worker=2, time=1.5)
    assert s == 3 and st.version == 8 and np.allclose(st.w, [0, 1, 1])
    rec = st.records[-1]
    assert (rec.worker, rec.version, rec.staleness, rec.applied, rec.lr) == (2, 4, 3, True, 0.5)
    s = apply_update(st, np.ones(3), 8, worker=1, time=2.0, step_size=staleness_aware_lr)
    assert s == 0 and st.records[-1].lr == 0.5
    assert staleness_aware_lr(0.6, 2) == pytest.approx(0.2)


def test_bad_input_is_refused(data):
    X, y = data
    for kw, msg in [(dict(policy="hogwild"), "policy"), (dict(policy="drop"), "max_staleness"),
                    (dict(n_workers=0), "worker"), (dict(policy="sync", n_workers=2, n_backup=2), "n_backup"),
                    (dict(compute_dist="normal"), "compute_dist"), (dict(lr=-1), "lr")]:
        with pytest.raises(ValueError, match=msg):
            train_async(X, y, **kw)
    with pytest.raises(ValueError, match="X must be"):
        train_async(X, y[:-1])
    with pytest.raises(ValueError, match="nnz"):
        make_sparse_problem(10, 5, 6)


# ------------------------------------------------------------- parameter server, real processes
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_one_worker_equals_serial_sgd_exactly(data, start_method):
    X, y = data
    res = train_async(X, y, n_workers=1, n_updates=60, lr=0.1, batch_size=8, seed=5,
                      start_method=start_method)
    w, losses = serial_sgd(X, y, 60, 0.1, 8, seed=5)
    assert np.array_equal(res.w, w)  # bit for bit: same batches, same arithmetic
    assert res.version == 60 and len(res.records["staleness"]) == 60
    assert (res.records["staleness"] == 0).all()
    assert np.allclose(res.losses["loss"], losses)
    assert my_segments() == []


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
def test_slow_worker_is_staler(data):
    X, y = data
    res = train_async(X, y, n_workers=3, n_updates=120, lr=0.05, compute_time=0.003,
                      slow={3: 5}, seed=1)
    st = res.records["staleness"]
    assert (st >= 0).all() and res.version == 120
    assert (np.diff(res.records["time"]) >= 0).all()
    mean = res.mean_staleness()
    assert mean[3] > mean[1] and mean[3] > mean[2], mean
    assert mean[3] > 2 * max(mean[1], mean[2]), mean  # five times slower: many versions late
    # staleness is the version gap: version + staleness == the server's version on arrival
    assert (res.records["version"] + st == np.arange(120)).all()
    # the run really happened on processes: one compute phase per gradient, in the timeline
    n_compute = sum(1 for e in res.run.timeline if e.kind == "compute")
    assert n_compute >= 120


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
def test_policies_follow_their_rules(data):
    X, y = data
    common = dict(n_workers=3, n_updates=60, lr=0.05, compute_time=0.003, slow={3: 6}, seed=2)
    sa = train_async(X, y, policy="staleness_aware", **common)
    r = sa.records
    assert np.allclose(r["lr"], 0.05 / (r["staleness"] + 1)) and r["applied"].all()
    dr = train_async(X, y, policy="drop", max_staleness=2, **common)
    r = dr.records
    assert (r["staleness"][r["applied"]] <= 2).all() and (r["staleness"][~r["applied"]] > 2).all()
    assert dr.n_dropped > 0 and dr.version == 60  # the slow worker's gradients were dropped
    sy = train_async(X, y, policy="sync", n_backup=1, **common)
    r = sy.records
    assert (r["staleness"][r["applied"]] == 0).all()
    per_round = np.bincount(r["version"][r["applied"]], minlength=sy.version)
    assert (per_round == 2).all()  # N = 3 - 1 fresh gradients per round, no more
    assert len(sy.waits) == sy.version == 60


def test_dead_worker_is_tolerated(data):
    X, y = data
    res = train_async(X, y, n_workers=3, n_updates=80, lr=0.05, compute_time=0.002,
                      faults={2: Fault("kill", step=5)})
    assert res.version == 80 and res.dead == [2]
    assert 2 in res.run.failures and res.run[2] is None
    (dead, heir, _), = res.reassigned
    assert dead == 2 and heir in (1, 3)
    assert (res.records["worker"] == 2).sum() <= 5
    assert res.final_loss < 0.2 * res.losses["loss"][0]  # it still trained
    assert my_segments() == []


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
def test_backup_wait_on_real_processes():
    # Exponential compute times, sync with backups. Process wake-ups add overhead on a
    # busy machine, so this check is looser than the Monte Carlo one.
    X, y, _ = make_least_squares(200, 5, seed=0)
    n, b, mu = 3, 1, 0.02
    res = train_async(X, y, n_workers=n + b, n_updates=40, lr=0.05, policy="sync", n_backup=b,
                      compute_time=mu, compute_dist="exp", seed=4)
    want = expected_backup_wait(n, b, mu)
    got = float(res.waits.mean())
    assert 0.7 * want < got < 2.0 * want, (got, want)


# ---------------------------------------------------------------------------- Hogwild!
class SpyArray(np.ndarray):
    """Records every index written through ``w[...] = ...``."""

    def __setitem__(self, key, value):
        writes = getattr(self, "writes", None)  # copies of the vector carry no log
        if writes is not None:
            writes.append(np.arange(len(self))[key])
        super().__setitem__(key, value)


def test_hogwild_worker_touches_only_the_support():
    p = make_sparse_problem(100, 50, 3, seed=0)
    order = sample_order(p.n, 40, seed=0)
    for worker, extra in [(hogwild_worker, ()), (locked_worker, (__import__("threading").Lock(),))]:
        w = np.zeros(p.d).view(SpyArray)
        w.writes = []
        assert worker(w, p.idx, p.val, p.y, order, 0.5, *extra) == 40
        assert len(w.writes) == 40
        for i, written in zip(order, w.writes):
            assert set(written) <= set(p.idx[i])
        assert np.allclose(np.asarray(w), serial_sparse_sgd(p.idx, p.val, p.y, p.d, order, 0.5))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_hogwild_one_worker_equals_serial(start_method):
    p = make_sparse_problem(500, 300, 5, seed=1)
    res = run_hogwild(p, n_workers=1, n_updates=2000, lr=0.5, start_method=start_method)
    serial = run_serial(p, 2000, 0.5)
    assert np.array_equal(res.w, serial.w) and res.n_updates == 2000
    assert res.final_loss == serial.final_loss and serial.wall_time > 0
    assert my_segments() == []


@pytest.mark.parametrize("lock", [False, True])
def test_hogwild_sparse_close_to_serial(lock):
    p = make_sparse_problem(4000, 2000, 5, seed=0)
    _, serial, _ = run_serial(p, 20000, 0.5)
    res = run_hogwild(p, n_workers=2, n_updates=20000, lr=0.5, lock=lock)
    start = sparse_loss(p.idx, p.val, p.y, np.zeros(p.d))
    assert res.n_updates == 20000 and serial < 0.05 * start
    assert res.final_loss < 1.2 * serial, (res.final_loss, serial)
    assert res.loss == res.final_loss  # the name the notebook reads


def test_hogwild_repeats_return_the_fastest_run_and_list_them_all():
    p = make_sparse_problem(500, 300, 5, seed=1)
    res = run_hogwild(p, n_workers=1, n_updates=2000, lr=0.5, repeats=3)
    assert len(res.wall_times) == 3 and res.wall_time == min(res.wall_times)
    assert np.array_equal(res.w, run_serial(p, 2000, 0.5).w)   # every repeat starts again from w = 0
    assert len(run_hogwild(p, n_workers=1, n_updates=10).wall_times) == 1
    with pytest.raises(ValueError, match="repeats"):
        run_hogwild(p, n_workers=1, n_updates=10, repeats=0)
    assert my_segments() == []


def test_hogwild_variants_run_in_turns_and_each_keeps_its_fastest_run(monkeypatch):
    from course_lib.async_ps import hogwild_timing, time_hogwild_variants

    calls, real = [], hogwild_timing.run_hogwild

    def spy(problem, settings):
        calls.append((settings.n_workers, settings.lock, settings.apart))
        return real(problem, settings)

    monkeypatch.setattr(hogwild_timing, "run_hogwild", spy)
    p = make_sparse_problem(500, 300, 5, seed=1)
    runs = time_hogwild_variants(p, n_updates=2000, lr=0.5, repeats=2)
    assert calls == [(1, False, False), (2, False, False), (2, True, False), (2, False, True)] * 2  # in turns
    assert list(runs) == ["1 process", "lock-free x2", "locked x2", "share nothing x2"]
    assert np.all(runs["share nothing x2"].w == 0)                   # each worker wrote its own copy only
    assert runs["share nothing x2"].apart and not runs["lock-free x2"].apart
    for r in runs.values():
        assert len(r.wall_times) == 2 and r.wall_time == min(r.wall_times) and r.n_updates == 2000
    assert runs["locked x2"].locked and not runs["lock-free x2"].locked and runs["lock-free x2"].n_workers == 2
    assert np.array_equal(runs["1 process"].w, run_serial(p, 2000, 0.5).w)
    with pytest.raises(ValueError, match="repeats"):
        time_hogwild_variants(p, repeats=0)
    assert my_segments() == []


def test_hogwild_apart_runs_the_same_loop_on_private_copies():
    from course_lib.async_ps import collisions, timed_worker

    dense = make_sparse_problem(500, 30, 30, seed=0)
    apart = run_hogwild(dense, n_workers=2, n_updates=3000, lr=0.3, apart=True, worker=timed_worker)
    assert np.all(apart.w == 0) and apart.n_updates == 3000 and len(apart.spans[1]) == 1500
    assert collisions(apart, dense) == 0.0                 # overlapping in time, but on private coordinates
    with pytest.raises(ValueError, match="nothing to lock"):
        run_hogwild(dense, n_workers=2, n_updates=10, apart=True, lock=True)


@pytest.mark.timing  # a share of a core: measured alone
def test_hogwild_reports_the_share_of_its_run_each_worker_held_a_core():
    def sleeps(w, idx, val, y, order, lr):
        time.sleep(0.2)
        return len(order)

    def spins(w, idx, val, y, order, lr):
        start = time.perf_counter()
        while time.perf_counter() - start < 0.2:
            pass
        return len(order)

    p = make_sparse_problem(50, 20, 2)
    asleep = run_hogwild(p, n_workers=2, n_updates=10, worker=sleeps)
    busy = run_hogwild(p, n_workers=1, n_updates=10, worker=spins)
    assert max(asleep.cpu_share) < 0.2, asleep.cpu_share      # asleep: no CPU time
    assert busy.cpu_share[0] > 0.7, busy.cpu_share             # spinning alone: the whole core


def test_hogwild_worker_error_reaches_the_caller():
    def broken(w, idx, val, y, order, lr):
        raise ZeroDivisionError("boom")

    p = make_sparse_problem(50, 20, 2)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run_hogwild(p, n_workers=2, n_updates=10, worker=broken)
    assert my_segments() == []


def test_collisions_counted_from_recorded_spans():
    from course_lib.async_ps import collisions, timed_worker

    dense = make_sparse_problem(500, 30, 30, seed=0)
    locked = run_hogwild(dense, n_workers=2, n_updates=3000, lr=0.3, lock=True, worker=timed_worker)
    alone = run_hogwild(dense, n_workers=1, n_updates=1000, lr=0.3, worker=timed_worker)
    assert collisions(locked, dense) == 0.0  # the lock makes the updates take turns
    assert collisions(alone, dense) == 0.0
    assert locked.n_updates == 3000 and len(locked.spans[0]) == 1500
    assert (np.diff(locked.spans[0], axis=1) >= 0).all()
    with pytest.raises(ValueError, match="timed_worker"):
        collisions(run_hogwild(dense, n_workers=1, n_updates=10), dense)


def test_time_overlap_counts_updates_that_ran_beside_another_whatever_they_touched():
    from course_lib.async_ps import HogwildResult, SparseProblem, collisions, time_overlap

    # worker 0 updates during [0, 1) and [2, 3), worker 1 during [0.5, 1.5) and [4, 5): one update of
    # each overlaps one of the other's, the other two ran alone: half the updates overlapped
    spans = [np.array([[0.0, 1.0], [2.0, 3.0]]), np.array([[0.5, 1.5], [4.0, 5.0]])]
    samples = [np.array([0, 1]), np.array([2, 3])]

    def run(idx):
        problem = SparseProblem(idx=np.array(idx), val=np.ones((4, 1)), y=np.zeros(4), d=4, w_true=np.zeros(4))
        result = HogwildResult(w=np.zeros(4), final_loss=0.0, wall_time=5.0, worker_times=[(0, 3), (0.5, 5)],
                               cpu_share=[1.0, 1.0], n_updates=4, locked=False, n_workers=2, spans=spans,
                               samples=samples)
        return time_overlap(result), collisions(result, problem)

    assert run([[0], [1], [2], [3]]) == (0.5, 0.0)      # overlapped in time, on different coordinates
    assert run([[0], [1], [0], [3]]) == (0.5, 0.5)      # the overlapping pair shares coordinate 0: rho = 1 there
    with pytest.raises(ValueError, match="timed_worker"):
        time_overlap(HogwildResult(w=np.zeros(1), final_loss=0.0, wall_time=1.0, worker_times=[], cpu_share=[],
                                   n_updates=0, locked=False, n_workers=1))


def test_under_a_lock_no_update_overlaps_another_and_dense_collisions_equal_the_overlap():
    from course_lib.async_ps import collisions, time_overlap, timed_worker

    dense = make_sparse_problem(500, 30, 30, seed=0)
    locked = run_hogwild(dense, n_workers=2, n_updates=2000, lr=0.3, lock=True, worker=timed_worker)
    assert time_overlap(locked) == 0.0                  # the lock makes them take turns
    free = run_hogwild(dense, n_workers=2, n_updates=2000, lr=0.3, worker=timed_worker)
    # every two dense samples share all 30 coordinates: an update collides exactly when it overlaps
    assert collisions(free, dense) == time_overlap(free)


def test_shifted_shards_make_a_compromise():
    from course_lib.async_ps import optimal_loss, shards

    X, y, _ = make_least_squares(900, 5, seed=1, n_shards=3, shard_shift=1.0)
    X0, y0, _ = make_least_squares(900, 5, seed=1)
    assert np.array_equal(X, X0) and not np.allclose(y, y0)
    # each shard alone is fit much better than the whole: the shards disagree
    per_shard = np.mean([optimal_loss(X[s], y[s]) for s in shards(900, 3)])
    assert per_shard < 0.2 * optimal_loss(X, y)


# ---------------------------------------------------------------- timestamps
def test_timestamps_are_monotone_per_worker_and_agree_with_the_trace(data):
    """Every gradient carries its worker's send time on the run clock: increasing per worker, after
    the compute that made it and before the traced send that carried it, and before the server got it."""
    X, y = data
    res = train_async(X, y, n_workers=3, n_updates=60, compute_time=0.002, slow={3: 4})
    rec, tl = res.records, res.run.timeline
    assert np.all(rec["sent"] <= rec["time"]), "a gradient arrived before it was sent"
    for r in (1, 2, 3):
        mine = rec["sent"][rec["worker"] == r]
        sent = res.worker_sent[r]
        assert len(mine) >= 1 and np.all(np.diff(sent) > 0), r
        assert np.array_equal(sent[:len(mine)], mine), r          # the server got them in the order sent
        computes = tl.of(r, "compute")
        sends = [e for e in tl.of(r, "send") if e.peer == 0]
        assert len(computes) == len(sent) and len(sends) == len(sent) + 1   # + the goodbye
        for stamp, c, s in zip(sent, computes, sends):
            assert c.end <= stamp <= s.start, (r, c, stamp, s)
    times = res.updates["time"]
    assert len(times) == res.version and np.all(np.diff(times) >= 0)
    applied = rec["time"][rec["applied"]]
    assert np.all(applied <= times) and np.all(times <= res.wall_time)  # each update just after its gradient came


def test_sync_rounds_are_timestamped_when_they_close(data):
    X, y = data
    res = train_async(X, y, n_workers=3, n_updates=8, policy="sync", compute_time=0.002, slow={3: 4})
    times, rec = res.updates["time"], res.records
    assert len(times) == 8 and np.all(np.diff(times) > 0)
    for v in range(8):   # round v closes after the last gradient it used (all three: no backups)
        used = rec["time"][rec["applied"] & (rec["version"] == v)]
        assert len(used) == 3 and used.max() <= times[v]


# ---------------------------------------------------------------- federated averaging
def test_fedavg_is_the_size_weighted_average():
    from course_lib.async_ps import fedavg

    models = [np.array([1.0, 0.0]), np.array([0.0, 4.0]), np.array([2.0, 2.0])]
    assert np.allclose(fedavg(models, [1, 1, 2]), [1.25, 2.0])
    assert np.allclose(fedavg(models[:1], [7]), models[0])


@pytest.fixture(scope="module")
def star4():
    import networkx as nx

    import course_lib as cl

    with cl.Cluster(5, graph=nx.star_graph(4)) as cluster:
        yield cluster


def test_fedavg_with_one_local_step_equal_sizes_is_synchronous_sgd(data, star4):
    """E = 1, everybody answers, equal shards: the average of one step from w on each shard is one
    step of the full gradient, w - lr * grad f(w) (McMahan's FedSGD); and every round moves
    2 p models, as the runtime counts them."""
    from course_lib.async_ps import train_fedavg
    from course_lib.reference.ex01 import full_gradient

    X, y = data
    res = train_fedavg(X, y, n_clients=4, n_rounds=12, local_steps=1, lr=0.1, cluster=star4)
    w = np.zeros(X.shape[1])
    for t in range(1, 13):
        w = w - 0.1 * full_gradient(X, y, w)
        assert np.allclose(res.models[t], w, rtol=0, atol=1e-12), t
    assert res.answered == [(1, 2, 3, 4)] * 12 and res.late == 0
    assert res.bytes_moved == 12 * 2 * 4 * res.model_bytes == 12 * 2 * 4 * X.shape[1] * 8
    assert res.run.stats.messages_sent(0) == 12 * 4 + 4          # + the stop signals (0 bytes)


def test_fedavg_on_processes_equals_one_process_bit_for_bit_with_unequal_shards(data, star4):
    from course_lib.async_ps import fedavg_serial, train_fedavg

    X, y = data
    shards = [(0, 100), (100, 400), (400, 450), (450, 1000)]
    res = train_fedavg(X, y, n_clients=4, n_rounds=6, local_steps=5, lr=0.1, shard_ranges=shards, cluster=star4)
    want = fedavg_serial(X, y, shards, 6, 5, 0.1)
    assert np.array_equal(res.models, want)
    assert res.sizes == (100, 300, 50, 550)


def test_fedavg_local_steps_cut_rounds_on_iid_data_and_drift_on_non_iid(star4):
    from course_lib.async_ps import optimal_loss, train_fedavg

    for shift, drifts in ((0.0, False), (1.0, True)):
        X, y, _ = make_least_squares(2000, 20, seed=0, n_shards=4, shard_shift=shift)
        f_star = optimal_loss(X, y)
        f0 = float(y @ y) / (2 * len(y))
        target = f_star + 1e-3 * (f0 - f_star)
        one, many = (train_fedavg(X, y, n_clients=4, n_rounds=60, local_steps=E, lr=0.1, cluster=star4)
                     for E in (1, 20))
        assert one.rounds_to(X, y, target) is not None
        if drifts:   # each client pulls towards its own optimum: a floor above the minimum
            assert many.losses(X, y)[-1] - f_star > 10 * (one.losses(X, y)[-1] - f_star)
        else:
            assert many.rounds_to(X, y, target) * 5 <= one.rounds_to(X, y, target)


def test_fedavg_proceeding_without_a_slow_client_drops_its_answers(data, star4):
    """min_answers = 3 of 4 with client 4 eight times slower: client 4 never makes a round, its late
    answers are dropped, and the bytes are exactly the models the server counted."""
    from course_lib.async_ps import fedavg_serial, train_fedavg

    X, y = data
    res = train_fedavg(X, y, n_clients=4, n_rounds=10, local_steps=2, lr=0.1, min_answers=3,
                       compute_time=0.002, slow={4: 8}, cluster=star4)
    assert res.share_of(4) == 0 and all(a == (1, 2, 3) for a in res.answered)
    assert res.late >= 1 and res.models_sent == res.models_received
    assert res.bytes_moved == (res.models_sent + res.models_received) * res.model_bytes
    assert res.models_sent < 10 * 4                        # the busy client was not sent every round's model
    shards = [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert np.array_equal(res.models, fedavg_serial(X, y, shards, 10, 2, 0.1, answered=res.answered))
    assert np.all(np.diff(res.times) > 0)


def test_fedavg_refuses_bad_settings(data):
    from course_lib.async_ps import train_fedavg

    X, y = data
    for kw in (dict(min_answers=0), dict(min_answers=5), dict(local_steps=0), dict(shard_ranges=[(0, 10)])):
        with pytest.raises(ValueError):
            train_fedavg(X, y, n_clients=4, **kw)


# ------------------------------------------------------------------------------ settings
BAD_SETTINGS = [
    ("AsyncSettings", dict(n_workers=0), ValueError, "AsyncSettings.n_workers"),
    ("AsyncSettings", dict(n_workers=2.0), TypeError, "AsyncSettings.n_workers must be an int"),
    ("AsyncSettings", dict(n_updates=True), TypeError, "AsyncSettings.n_updates"),
    ("AsyncSettings", dict(lr=0), ValueError, "AsyncSettings.lr"),
    ("AsyncSettings", dict(lr=float("nan")), ValueError, "AsyncSettings.lr"),
    ("AsyncSettings", dict(policy="hogwild"), ValueError, "AsyncSettings.policy"),
    ("AsyncSettings", dict(policy="drop"), ValueError, "max_staleness"),
    ("AsyncSettings", dict(policy="drop", max_staleness=-1), ValueError, "AsyncSettings.max_staleness"),
    ("AsyncSettings", dict(max_staleness=4), ValueError, "max_staleness applies to policy='drop' only"),
    ("AsyncSettings", dict(policy="sync", n_workers=2, n_backup=2), ValueError, "AsyncSettings.n_backup"),
    ("AsyncSettings", dict(n_backup=1), ValueError, "n_backup applies to policy='sync' only"),
    ("AsyncSettings", dict(batch_size=0), ValueError, "AsyncSettings.batch_size"),
    ("AsyncSettings", dict(seed=-1), ValueError, "AsyncSettings.seed"),
    ("AsyncSettings", dict(compute_time=-0.1), ValueError, "AsyncSettings.compute_time"),
    ("AsyncSettings", dict(compute_dist="normal"), ValueError, "AsyncSettings.compute_dist"),
    ("AsyncSettings", dict(apply="apply_update"), TypeError, "AsyncSettings.apply"),
    ("AsyncSettings", dict(step_size=0.1), TypeError, "AsyncSettings.step_size"),
    ("AsyncSettings", dict(loss_every=0), ValueError, "AsyncSettings.loss_every"),
    ("AsyncSettings", dict(slow={4: 2.0}), ValueError, "AsyncSettings.slow names rank 4"),
    ("AsyncSettings", dict(slow={3: 0.5}), ValueError, "slow"),
    ("AsyncSettings", dict(faults={5: Fault("kill")}), ValueError, "AsyncSettings.faults names rank 5"),
    ("AsyncSettings", dict(faults={1: "kill"}), TypeError, "fault"),
    ("AsyncSettings", dict(timeout=0), ValueError, "AsyncSettings.timeout"),
    ("AsyncSettings", dict(start_method=1), TypeError, "AsyncSettings.start_method"),
    ("HogwildSettings", dict(n_workers=0), ValueError, "HogwildSettings.n_workers"),
    ("HogwildSettings", dict(n_workers=3, n_updates=2), ValueError, "HogwildSettings.n_updates"),
    ("HogwildSettings", dict(lr=-1), ValueError, "HogwildSettings.lr"),
    ("HogwildSettings", dict(lock=1), TypeError, "HogwildSettings.lock"),
    ("HogwildSettings", dict(lock=True, apart=True), ValueError, "nothing to lock"),
    ("HogwildSettings", dict(worker=3), TypeError, "HogwildSettings.worker"),
    ("HogwildSettings", dict(repeats=0), ValueError, "HogwildSettings.repeats"),
    ("FedAvgSettings", dict(n_clients=0), ValueError, "FedAvgSettings.n_clients"),
    ("FedAvgSettings", dict(local_steps=0), ValueError, "FedAvgSettings.local_steps"),
    ("FedAvgSettings", dict(min_answers=5), ValueError, "FedAvgSettings.min_answers"),
    ("FedAvgSettings", dict(shard_ranges=[(0, 10)]), ValueError, "FedAvgSettings.shard_ranges"),
    ("FedAvgSettings", dict(n_clients=1, shard_ranges=[(5, 5)]), ValueError, "FedAvgSettings.shard_ranges"),
    ("FedAvgSettings", dict(n_clients=1, shard_ranges=[5]), TypeError, "FedAvgSettings.shard_ranges"),
    ("FedAvgSettings", dict(average=None), TypeError, "FedAvgSettings.average"),
    ("FedAvgSettings", dict(slow={9: 2.0}), ValueError, "FedAvgSettings.slow"),
]


@pytest.mark.parametrize("cls, kwargs, error, match", BAD_SETTINGS)
def test_settings_refuse_a_bad_field_naming_it(cls, kwargs, error, match):
    import course_lib.async_ps as lesson

    with pytest.raises(error, match=match):
        getattr(lesson, cls)(**kwargs)


def test_settings_are_frozen_and_keywords_must_name_a_setting(data):
    import dataclasses

    from course_lib.async_ps import AsyncSettings

    settings = AsyncSettings(n_workers=2, slow={np.int64(2): 3})
    assert settings.slow == {2: 3.0} and type(next(iter(settings.slow))) is int  # as the workers look ranks up
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.n_workers = 3
    X, y = data
    with pytest.raises(TypeError, match="no setting n_worker;"):
        train_async(X, y, n_worker=3)      # a misspelt keyword never runs with the default
    with pytest.raises(TypeError, match="must be of type AsyncSettings"):
        train_async(X, y, {"n_workers": 3})
    with pytest.raises(ValueError, match="max_staleness"):
        train_async(X, y, AsyncSettings(policy="drop", max_staleness=2), policy="async")  # overrides are checked


@pytest.mark.parametrize("policy", ["async", "sync"])
def test_a_run_from_settings_equals_the_run_from_keywords(data, policy):
    from course_lib.async_ps import AsyncSettings

    X, y = data
    n_workers = 1 if policy == "async" else 2   # deterministic runs: one worker, or rounds that wait for all
    keywords = dict(n_workers=n_workers, n_updates=40, lr=0.1, batch_size=8, seed=5, policy=policy)
    by_keywords = train_async(X, y, **keywords)
    by_settings = train_async(X, y, AsyncSettings(**keywords))
    overridden = train_async(X, y, AsyncSettings(**dict(keywords, seed=0, lr=0.3)), seed=5, lr=0.1)
    def records(res):  # by version, then worker: a sync round's gradients arrive in any order
        rows = np.array([res.records[k] for k in ("version", "worker", "staleness", "applied", "lr")]).T
        return rows[np.lexsort(rows[:, 1::-1].T)]

    for res in (by_settings, overridden):
        assert np.array_equal(res.w, by_keywords.w) and res.version == by_keywords.version == 40
        assert np.array_equal(records(res), records(by_keywords))
    if policy == "async":
        assert np.array_equal(by_settings.w, serial_sgd(X, y, 40, 0.1, 8, seed=5)[0])


def test_hogwild_and_fedavg_from_settings_equal_their_runs_from_keywords(data, star4):
    from course_lib.async_ps import FedAvgSettings, HogwildSettings, fedavg_serial, train_fedavg

    p = make_sparse_problem(500, 300, 5, seed=1)
    hog = run_hogwild(p, HogwildSettings(n_workers=1, n_updates=1500, lr=0.4, seed=3))
    assert np.array_equal(hog.w, run_hogwild(p, n_workers=1, n_updates=1500, lr=0.4, seed=3).w)
    assert np.array_equal(hog.w, run_serial(p, 1500, 0.4, seed=3).w)
    X, y = data
    settings = FedAvgSettings(n_clients=4, n_rounds=4, local_steps=2, lr=0.1)
    fed = train_fedavg(X, y, settings, cluster=star4)
    again = train_fedavg(X, y, n_clients=4, n_rounds=4, local_steps=2, lr=0.1, cluster=star4)
    assert np.array_equal(fed.models, again.models)
    shards = [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert np.array_equal(fed.models, fedavg_serial(X, y, shards, 4, 2, 0.1))
    with pytest.raises(ValueError, match="go past the data"):
        train_fedavg(X[:900], y[:900], settings, shard_ranges=shards, cluster=star4)
