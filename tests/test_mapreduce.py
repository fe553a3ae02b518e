"""Lesson 01: MapReduce gradient descent against the single-process baseline and the formulas."""
import os

import numpy as np
import pytest

import course_lib as cl
from course_lib.mapreduce import (
    LeastSquares,
    Logistic,
    SpeedupModel,
    bytes_per_iteration,
    checkpoint,
    fit_latency_bandwidth,
    gd_serial,
    make_least_squares,
    make_logistic,
    map_shard,
    mapreduce_gd,
    pin_blas,
    reduce_results,
    server_link_time,
    shard_ranges,
    words_per_iteration,
)

PROBLEMS = {"least_squares": LeastSquares(), "logistic": Logistic()}


def data(problem, n=1003, d=7, seed=1):
    if problem == "logistic":
        return make_logistic(n, d, seed=seed)[:2]
    return make_least_squares(n, d, seed=seed)[:2]


def close(a, b, tol=1e-12):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) <= tol * max(1.0, np.max(np.abs(b)))


# ---------------------------------------------------------------- single process
@pytest.mark.parametrize("n,m", [(10, 1), (10, 3), (1003, 4), (7, 7), (100, 6)])
def test_shard_ranges_follow_array_split(n, m):
    got = shard_ranges(n, m)
    want = [(int(a[0]), int(a[-1]) + 1) for a in np.array_split(np.arange(n), m)]
    assert got == want
    assert sum(hi - lo for lo, hi in got) == n


def test_shard_ranges_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        shard_ranges(3, 4)
    with pytest.raises(ValueError, match=">= 1"):
        shard_ranges(3, 0)


@pytest.mark.parametrize("name", ["least_squares", "logistic"])
def test_gradient_matches_finite_differences(name):
    X, y = data(name, n=50, d=4)
    p = PROBLEMS[name]
    w = np.random.default_rng(3).standard_normal(4) * 0.3
    eps = 1e-6
    fd = [(p.loss(X, y, w + eps * e) - p.loss(X, y, w - eps * e)) / (2 * eps) for e in np.eye(4)]
    assert np.allclose(p.gradient(X, y, w), fd, atol=1e-7)
    G, losses = p.per_sample(X, y, w)
    assert np.allclose(G.mean(axis=0), p.gradient(X, y, w)) and np.isclose(losses.mean(), p.loss(X, y, w))


@pytest.mark.parametrize("reduce", ["sum", "mean", "collect"])
@pytest.mark.parametrize("name", ["least_squares", "logistic"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_map_then_reduce_is_the_full_gradient(reduce, name, m):
    X, y = data(name)
    p = PROBLEMS[name]
    w = np.linspace(-1, 1, X.shape[1])
    ranges = shard_ranges(len(X), m)
    outs = [map_shard(p, X[lo:hi], y[lo:hi], w, reduce) for lo, hi in ranges]
    g, loss = reduce_results(outs, [hi - lo for lo, hi in ranges], reduce)
    assert close(g, p.gradient(X, y, w)) and close(loss, p.loss(X, y, w))


def test_multi_output_least_squares():
    X, Y, _ = make_least_squares(301, 5, k=3, seed=2)
    p = LeastSquares()
    W = np.ones((5, 3))
    outs = [map_shard(p, X[lo:hi], Y[lo:hi], W, r) for r in ["collect"] for lo, hi in shard_ranges(301, 2)]
    g, _ = reduce_results(outs, [151, 150], "collect")
    assert close(g.reshape(5, 3), p.gradient(X, Y, W))


def test_serial_gd_converges_to_lstsq():
    X, y = data("least_squares", n=500, d=5)
    w, losses = gd_serial("least_squares", X, y, iters=300)
    assert np.allclose(w, LeastSquares().solution(X, y), atol=1e-8)
    assert np.all(np.diff(losses) <= 1e-15)  # step 1/L: the loss never goes up


def test_serial_gd_logistic_decreases():
    X, y = data("logistic", n=500, d=5)
    w, losses = gd_serial("logistic", X, y, iters=200)
    assert losses[-1] < 0.6 * losses[0]
    assert np.all(np.diff(losses) <= 1e-15)


def test_words_formula_by_hand():
    assert words_per_iteration(3, 10, "sum") == (30, 33)
    assert words_per_iteration(3, 10, "mean") == (30, 33)
    assert words_per_iteration(3, 10, "collect", n_samples=100) == (30, 1100)
    assert bytes_per_iteration(2, 4) == 8 * (8 + 10)
    with pytest.raises(ValueError, match="n_samples"):
        words_per_iteration(3, 10, "collect")
    with pytest.raises(ValueError, match="reduce"):
        words_per_iteration(3, 10, "median")


def test_cost_model():
    m = SpeedupModel(t_compute=1.0, latency=0.01, bandwidth=8e6, n_params=1000)
    assert np.isclose(m.time(1), 1.0 + 0.02 + (8000 + 8008) / 8e6)
    s = m.speedup(np.arange(1, 9))
    assert np.all(np.diff(s) > 0) and np.all(s < np.arange(1, 9) + 1e-12)
    ideal = SpeedupModel(t_compute=1.0)
    assert np.allclose(ideal.speedup(np.arange(1, 5)), np.arange(1, 5))
    # incast: the server's link takes the p answers (8008 B) one after the other, after the first copy of w
    assert np.isclose(m.communication(4), 0.02 + (8000 + 4 * 8008) / 8e6)
    assert np.isclose(m.communication(4), server_link_time(4, 8000, 8008, 0.01, 8e6))
    # collect: the answers are the busier direction by far; without the downlink they would shrink with p
    assert np.isclose(server_link_time(4, 80, 8000, 0.0, 1.0), 4 * 8000 + 80)
    assert np.isclose(server_link_time(4, 80, 8000, 0.0, 1.0, downlink=False), 4 * 80 + 8000)
    # a straggler 3x slower: the iteration takes 3x the compute share
    assert np.isclose(ideal.time(2, slowest=3.0), 1.5)
    # on 2 cores, 3 workers share them (1/2 each), but the straggler maps its third on a core
    # of its own (it sleeps the rest): 4 * 1/3, of which 4/3 - 1/2 is the others' wait
    on_two = SpeedupModel(t_compute=1.0, cores=2.0)
    assert np.isclose(on_two.time(3, slowest=4.0), 4 / 3) and np.isclose(on_two.sync(3, slowest=4.0), 4 / 3 - 1 / 2)
    assert np.isclose(on_two.sync(3, slowest=1.2), 0.0)   # 1.2/3 < 1/2: it keeps up with the shared maps


def test_fit_latency_bandwidth():
    nb = np.array([0, 1e3, 1e5, 1e6])
    lat, bw = fit_latency_bandwidth(nb, 2e-5 + nb / 1e9)
    assert np.isclose(lat, 2e-5) and np.isclose(bw, 1e9)


def test_checkpoint_roundtrip(tmp_path):
    assert checkpoint.load(tmp_path) is None
    checkpoint.save(tmp_path, np.arange(3.0), 7, [1.0, 0.5], {"a": 1})
    w, it, losses, meta = checkpoint.load(tmp_path)
    assert np.array_equal(w, np.arange(3.0)) and it == 7 and np.array_equal(losses, [1.0, 0.5])
    assert [f for f in os.listdir(tmp_path) if "tmp" in f] == []


def test_pin_blas_sets_the_environment(monkeypatch):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    assert pin_blas(1) is False  # numpy is already imported in this process
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ["MKL_NUM_THREADS"] == "1"


def test_pinned_blas_restores_what_was_there_even_after_an_error(monkeypatch):
    from course_lib.mapreduce.blas import BLAS_VARS, pinned_blas

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    before = {var: os.environ.get(var) for var in BLAS_VARS}
    with pytest.raises(RuntimeError, match="inside"):
        with pinned_blas(1):
            assert all(os.environ[var] == "1" for var in BLAS_VARS)
            raise RuntimeError("inside")
    assert {var: os.environ.get(var) for var in BLAS_VARS} == before
    assert os.environ["OMP_NUM_THREADS"] == "3" and "OPENBLAS_NUM_THREADS" not in os.environ


# ---------------------------------------------------------------- real processes
@pytest.fixture(scope="module")
def cluster5():
    with cl.Cluster(5) as c:
        yield c


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_parallel_equals_serial_and_bytes_equal_formula(m):
    X, y = data("least_squares")  # N = 1003: not divisible by 2, 3, 4
    iters = 15
    with cl.Cluster(m + 1) as c:
        res = mapreduce_gd(c, "least_squares", X, y, iters=iters)
    w, losses = gd_serial("least_squares", X, y, iters=iters)
    assert close(res.w, w) and close(res.losses, losses)
    d = X.shape[1]
    assert res.stats.total_bytes == iters * bytes_per_iteration(m, d, "sum")
    down, up = words_per_iteration(m, d)
    assert res.words_per_iteration == down + up
    assert res.bytes_per_iteration == bytes_per_iteration(m, d)
    assert res.stats.bytes[0, 1:].sum() == iters * down * 8  # only w goes down
    # one w down and one answer up per worker per iteration, plus one stop each
    assert res.stats.total_messages == iters * 2 * m + m


@pytest.mark.parametrize("reduce", ["mean", "collect"])
@pytest.mark.parametrize("name", ["least_squares", "logistic"])
def test_reduce_variants_equal_serial(cluster5, reduce, name):
    X, y = data(name, n=501)
    res = mapreduce_gd(cluster5, name, X, y, iters=10, reduce=reduce)
    w, losses = gd_serial(name, X, y, iters=10)
    assert close(res.w, w) and close(res.losses, losses)
    assert res.stats.total_bytes == 10 * bytes_per_iteration(4, X.shape[1], reduce, n_samples=501)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_start_methods(start_method):
    X, y = data("logistic", n=203, d=3)
    with cl.Cluster(3, start_method=start_method) as c:
        res = mapreduce_gd(c, "logistic", X, y, iters=5)
    assert close(res.w, gd_serial("logistic", X, y, iters=5)[0])


def test_killed_worker_is_reexecuted_with_identical_result(cluster5):
    X, y = data("least_squares")
    clean = mapreduce_gd(cluster5, "least_squares", X, y, iters=12)
    hurt = mapreduce_gd(cluster5, "least_squares", X, y, iters=12, faults={2: cl.Fault("kill", step=4)})
    assert np.array_equal(hurt.w, clean.w) and np.array_equal(hurt.losses, clean.losses)
    assert set(hurt.failures) == {2}
    assert hurt.reexecuted == [{"iteration": 4, "shard": 1, "dead_rank": 2, "new_rank": 1}]
    redo = [e for e in hurt.timeline if e.kind == "compute" and "re-executed" in e.label]
    assert len(redo) == 1 and redo[0].rank == 1 and redo[0].label == "map shard 1 (re-executed)"
    # after the fault, rank 1 maps shards 0 and 1 every iteration
    later = [e for e in hurt.timeline if e.rank == 1 and e.label == "map shard 1"]
    assert len(later) == 12 - 5


def test_raising_worker_is_given_up_after_task_timeout(cluster5):
    # a worker whose fn raised keeps its Pipe open: only a timeout tells the server
    X, y = data("least_squares", n=301)
    clean = mapreduce_gd(cluster5, "least_squares", X, y, iters=6)
    hurt = mapreduce_gd(cluster5, "least_squares", X, y, iters=6, task_timeout=1.0,
                        faults={3: cl.Fault("raise", step=2)})
    assert set(hurt.failures) == {3} and np.array_equal(hurt.w, clean.w)
    assert hurt.reexecuted == [{"iteration": 2, "shard": 2, "dead_rank": 3, "new_rank": 1}]
    with pytest.raises(ValueError, match="task_timeout"):
        mapreduce_gd(cluster5, "least_squares", X, y, task_timeout=0)


def test_server_death_resumes_from_checkpoint(tmp_path, cluster5):
    X, y = data("logistic", n=401)
    clean = mapreduce_gd(cluster5, "logistic", X, y, iters=20)
    with cl.Cluster(5) as c:
        dead = mapreduce_gd(c, "logistic", X, y, iters=20, checkpoint_dir=tmp_path, checkpoint_every=5,
                            faults={0: cl.Fault("kill", step=13)})
    assert not dead.completed and 0 in dead.failures
    assert checkpoint.load(tmp_path)[1] == 10  # the last checkpoint before iteration 13
    back = mapreduce_gd(cluster5, "logistic", X, y, iters=20, checkpoint_dir=tmp_path, resume=True)
    assert back.start_iteration == 10 and back.completed
    assert np.array_equal(back.w, clean.w) and np.array_equal(back.losses, clean.losses)
    assert len(back.time_per_iteration) == 10


def test_resume_refuses_another_job(tmp_path, cluster5):
    X, y = data("logistic", n=401)
    mapreduce_gd(cluster5, "logistic", X, y, iters=5, checkpoint_dir=tmp_path, checkpoint_every=5)
    with pytest.raises(ValueError, match="another job"):
        mapreduce_gd(cluster5, "logistic", X, y, iters=5, lr=0.1, checkpoint_dir=tmp_path, resume=True)


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
@pytest.mark.slow  # a long scenario: make test, not make test-fast
def test_straggler_sets_the_pace(cluster5):
    X, y = make_least_squares(40_000, 50, seed=0)[:2]
    iters = 6
    fast = mapreduce_gd(cluster5, "least_squares", X, y, iters=iters)
    slow = mapreduce_gd(cluster5, "least_squares", X, y, iters=iters, slow={3: 10.0})
    assert np.array_equal(fast.w, slow.w)

    def phases(run, rank):
        return [e for e in run.timeline if e.rank == rank and e.kind == "compute"]

    maps3, reduces = phases(slow, 3), phases(slow, 0)
    assert len(maps3) == len(reduces) == iters
    # synchronous: no reduce starts before the straggler's map of that iteration has ended
    assert all(r.start >= m.end for m, r in zip(maps3, reduces))
    # every iteration lasts at least the straggler's map, and the others spend most of it waiting
    assert np.all(slow.time_per_iteration >= [m.duration for m in maps3])
    busy1 = sum(e.duration for e in phases(slow, 1))
    assert busy1 < 0.5 * sum(m.duration for m in maps3)


def test_bad_input(cluster5):
    X, y = data("least_squares", n=50)
    with pytest.raises(ValueError, match="reduce"):
        mapreduce_gd(cluster5, "least_squares", X, y, reduce="max")
    with pytest.raises(ValueError, match="problem"):
        mapreduce_gd(cluster5, "ridge", X, y)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        mapreduce_gd(cluster5, "least_squares", X, y, checkpoint_every=3)
    with pytest.raises(ValueError, match="N rows"):
        mapreduce_gd(cluster5, "least_squares", X, y[:10])


def test_cost_model_core_ceiling():
    m = SpeedupModel(t_compute=1.0, cores=2.0)
    assert np.allclose(m.speedup([1, 2, 3, 8]), [1, 2, 2, 2])


# ---------------------------------------------------------------------------- settings
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(iters=0), ValueError, "MapReduceSettings.iters"),
    (dict(iters=2.5), TypeError, "MapReduceSettings.iters must be an int"),
    (dict(lr=0), ValueError, "MapReduceSettings.lr"),
    (dict(reduce="max"), ValueError, "MapReduceSettings.reduce"),
    (dict(checkpoint_every=3), ValueError, "checkpoint_every needs a checkpoint_dir"),
    (dict(resume=True), ValueError, "resume needs a checkpoint_dir"),
    (dict(checkpoint_dir="/tmp", checkpoint_every=0), ValueError, "MapReduceSettings.checkpoint_every"),
    (dict(checkpoint_dir=3), TypeError, "MapReduceSettings.checkpoint_dir"),
    (dict(resume="yes"), TypeError, "MapReduceSettings.resume"),
    (dict(task_timeout=-1), ValueError, "MapReduceSettings.task_timeout"),
    (dict(network="fast"), TypeError, "MapReduceSettings.network"),
    (dict(slow=[3]), TypeError, "MapReduceSettings.slow"),
    (dict(faults={1: "kill"}), TypeError, "fault"),
    (dict(on_failure="ignore"), ValueError, "MapReduceSettings.on_failure"),
    (dict(timeout=0), ValueError, "MapReduceSettings.timeout"),
])
def test_settings_refuse_a_bad_field_naming_it(kwargs, error, match):
    from course_lib.mapreduce import MapReduceSettings

    with pytest.raises(error, match=match):
        MapReduceSettings(**kwargs)


def test_a_run_from_settings_equals_the_run_from_keywords(cluster5):
    from course_lib.mapreduce import MapReduceSettings

    X, y = data("least_squares", n=303)
    by_keywords = mapreduce_gd(cluster5, "least_squares", X, y, iters=7, reduce="mean", lr=0.2)
    settings = MapReduceSettings(iters=7, reduce="mean", lr=0.2)
    by_settings = mapreduce_gd(cluster5, "least_squares", X, y, settings)
    overridden = mapreduce_gd(cluster5, "least_squares", X, y, MapReduceSettings(iters=2, reduce="sum"),
                              iters=7, reduce="mean", lr=0.2)
    for res in (by_settings, overridden):
        assert np.array_equal(res.w, by_keywords.w) and np.array_equal(res.losses, by_keywords.losses)
        assert res.reduce == "mean" and res.iterations == 7
    assert close(by_settings.w, gd_serial("least_squares", X, y, iters=7, lr=0.2)[0])
    with pytest.raises(TypeError, match="no setting iterations;"):
        mapreduce_gd(cluster5, "least_squares", X, y, iterations=7)
