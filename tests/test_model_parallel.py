"""Lesson 06: tensor and pipeline parallelism against the single-process network.

Real worker processes; byte counts checked exactly against the ring formulas; the
pipeline bubble exact in schedule steps and within 20% of the formula in a timeline.
"""
from fractions import Fraction

import numpy as np
import pytest

import course_lib as cl
import course_lib.model_parallel as mp

TOL = 1e-10


def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# ----------------------------------------------------------------------------- single process
def test_reference_gradients_match_finite_differences():
    params = mp.init_mlp(4, 6, 3, seed=2)
    X, T = mp.make_data(5, 4, 3, seed=3)
    g = mp.backward(params, mp.forward(params, X), T)
    eps = 1e-6
    rng = np.random.default_rng(0)
    for k in params:
        for _ in range(3):
            idx = tuple(rng.integers(0, n) for n in params[k].shape)
            P = {kk: v.copy() for kk, v in params.items()}
            P[k][idx] += eps
            lp = mp.loss(mp.forward(P, X)["Y"], T)
            P[k][idx] -= 2 * eps
            lm = mp.loss(mp.forward(P, X)["Y"], T)
            assert abs((lp - lm) / (2 * eps) - g[k][idx]) < 1e-7, k


def test_deep_reference_equals_two_layer_network():
    params = mp.init_mlp(4, 6, 3, seed=2)
    X, T = mp.make_data(5, 4, 3, seed=3)
    g = mp.backward(params, mp.forward(params, X), T)
    L, gd = mp.deep_forward_backward([(params["W1"], params["b1"]), (params["W2"], params["b2"])], X, T)
    assert L == pytest.approx(mp.loss(mp.forward(params, X)["Y"], T), abs=1e-14)
    assert maxdiff(gd[0][0], g["W1"]) < 1e-14 and maxdiff(gd[1][0], g["W2"]) < 1e-14


@pytest.mark.parametrize("kind", mp.SCHEDULES)
@pytest.mark.parametrize("costs", [(1, 1), (1, 2), (2, 3)])
def test_schedule_bubble_is_exactly_the_formula(kind, costs):
    t_f, t_b = costs
    for p in range(1, 7):
        for m in range(1, 13):
            sim = mp.simulate(kind, p, m, t_f, t_b)
            assert sim["steps"] == (m + p - 1) * (t_f + t_b)
            assert all(b == m * (t_f + t_b) for b in sim["busy"])
            assert sim["bubble"] == Fraction(p - 1, m + p - 1) == mp.bubble_formula(p, m)
            assert isinstance(sim["bubble"], Fraction)


def test_schedules_are_valid_and_1f1b_stashes_less():
    for p in range(1, 6):
        for m in range(1, 9):
            for kind in mp.SCHEDULES:
                for s in range(p):
                    ops = mp.stage_ops(kind, p, m, s)
                    assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
                    # a micro-batch's backward never comes before its forward on a stage
                    assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
            assert mp.simulate("gpipe", p, m)["peak_stash"] == [m] * p
            assert mp.simulate("1f1b", p, m)["peak_stash"] == [min(p - s, m) for s in range(p)]


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="schedule"):
        mp.simulate("zigzag", 2, 2)
    with pytest.raises(ValueError, match="m >= 1"):
        mp.bubble_formula(2, 0)
    with pytest.raises(ValueError, match="at least one"):
        mp.split_ranges(2, 3)
    with pytest.raises(ValueError, match="stages"):
        mp.stage_layers(2, 3)
    with pytest.raises(ValueError, match="2-D"):
        mp.forward(mp.init_mlp(2, 2, 2), np.zeros(3))
    with pytest.raises(ValueError, match="compute events"):
        mp.measured_bubble([])


def test_byte_formulas_and_parameter_memory():
    assert mp.allreduce_bytes(4, 10) == 2 * 3 * 80 and mp.allgather_bytes(1, 10) == 0
    assert mp.split_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    per = [max(mp.tp_param_bytes(32, 96, 8, p)) for p in (1, 2, 3, 4, 6)]
    assert per[0] == mp.param_bytes(mp.init_mlp(32, 96, 8))
    assert all(a > b for a, b in zip(per, per[1:]))
    # only the replicated b2 keeps memory per worker above total / p
    assert per[3] == (32 * 96 + 96 + 96 * 8) // 4 * 8 + 8 * 8


def test_block_factorisation_serial_reduces_loss():
    U, V, losses = mp.mf_serial(20, 16, 4, 2, epochs=20, lr=0.02)
    assert losses[-1] < 0.5 * losses[0]
    assert mp.mf_bytes_per_worker(20, 16, 4, 4) * 3 < mp.mf_full_bytes(20, 16, 4)


# ----------------------------------------------------------------------------- real processes
@pytest.fixture(scope="module")
def net():
    params = mp.init_mlp(5, 10, 3, seed=0)
    X, T = mp.make_data(8, 5, 3, seed=1)
    cache = mp.forward(params, X)
    return params, X, T, cache, mp.backward(params, cache, T)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_tensor_parallel_equals_serial(p, net):
    params, X, T, cache, g = net
    with cl.Cluster(p) as cluster:
        res = cluster.run(mp.tp_mlp_step, params, X, T)
    G = mp.assemble_grads(res)
    for k in ("W1", "b1", "W2", "b2"):
        assert maxdiff(G[k], g[k]) < TOL, k
    for r in res:
        assert maxdiff(r["Y"], cache["Y"]) < TOL and maxdiff(r["dX"], g["X"]) < TOL
        assert r["loss"] == pytest.approx(mp.loss(cache["Y"], T), abs=TOL)
    # one allreduce of Y forward, one of dX backward, nothing else
    assert res.stats.total_bytes == mp.tp_step_bytes(8, 5, 3, p)
    assert sum(r["fwd_bytes"] for r in res) == mp.allreduce_bytes(p, 8 * 3)
    assert [r["param_bytes"] for r in res] == mp.tp_param_bytes(5, 10, 3, p)
    if p > 1:
        assert max(r["param_bytes"] for r in res) < mp.param_bytes(params)


def _gather_worker(comm, params, X):
    s = mp.shard_mlp(params, comm.size, comm.rank)
    return mp.column_parallel_forward(comm, X, s["W1"], s["b1"], gather=True)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_column_parallel_allgather_bytes(start_method, net):
    params, X, T, cache, g = net
    p = 4                                     # 10 hidden units: uneven shards 3, 3, 2, 2
    with cl.Cluster(p, start_method=start_method) as cluster:
        res = cluster.run(_gather_worker, params, X)
    for A in res:
        assert maxdiff(A, cache["A"]) < TOL
    assert res.stats.total_bytes == mp.allgather_bytes(p, cache["A"].size)
    assert res.stats.total_messages == p * (p - 1)


def _allreduce_worker(comm, n):
    x = np.arange(n, dtype=float) * (comm.rank + 1)
    return mp.ring_allreduce(comm, x)


def test_ring_allreduce_uneven_sizes():
    p, n = 3, 7
    with cl.Cluster(p) as cluster:
        res = cluster.run(_allreduce_worker, n)
    for y in res:
        assert maxdiff(y, np.arange(n) * 6.0) == 0
    assert res.stats.total_bytes == mp.allreduce_bytes(p, n)


def _scatter_worker(comm, params, A):
    s = mp.shard_mlp(params, comm.size, comm.rank)
    a, b = s["cols"]
    return mp.row_parallel_forward(comm, A[:, a:b], s["W2"], s["b2"], scatter=True)


@pytest.mark.parametrize("p", [2, 3])
def test_row_parallel_reduce_scatter_gives_row_blocks_for_half_the_bytes(p, net):
    params, X, T, cache, g = net                 # B = 8 rows: blocks 3,3,2 for p = 3
    with cl.Cluster(p) as cluster:
        res = cluster.run(_scatter_worker, params, cache["A"])
    for Yr, rows in zip(res, np.array_split(np.arange(8), p)):
        assert maxdiff(Yr, cache["Y"][rows]) < TOL
    assert res.stats.total_bytes == mp.reduce_scatter_bytes(p, cache["Y"].size) == mp.allreduce_bytes(p, 24) // 2


def test_schedule_and_timeline_plots_draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_lib.model_parallel.plots import plot_schedule, plot_timeline
    from course_lib.runtime.trace import Event
    sim = mp.simulate("1f1b", 3, 4)
    ax = plot_schedule(sim)
    assert len(ax.collections) == 3 * 2 * 4          # one bar per op
    ev = [Event(s, "compute", a, b, f"{op}{i}") for s, op, i, a, b in sim["events"]]
    ax = plot_timeline(ev + [Event(0, "recv", 0.0, 1.0, "x")], 3)
    assert len(ax.collections) == 24
    plt.close("all")


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_pipeline_gradients_equal_serial(p):
    layers = mp.init_deep([5, 8, 7, 6, 3], seed=4)     # 4 layers on p stages
    X, T = mp.make_data(12, 5, 3, seed=5)
    L, gref = mp.deep_forward_backward(layers, X, T)
    with cl.Cluster(p) as cluster:
        for kind in mp.SCHEDULES:
            for m in (1, 3, 4):
                res = cluster.run(mp.pipeline_step, layers, X, T, m, kind)
                G = mp.assemble_pipeline_grads(res)
                assert len(G) == len(layers)
                for (dW, db), (rW, rb) in zip(G, gref):
                    assert maxdiff(dW, rW) < TOL and maxdiff(db, rb) < TOL
                assert res[-1]["loss"] == pytest.approx(L, abs=TOL)
                # every boundary carries the activations forward and their gradient back
                bounds = [hi for lo, hi in mp.stage_layers(len(layers), p)][:-1]
                widths = [layers[b][0].shape[0] for b in bounds]
                assert res.stats.total_bytes == sum(2 * 12 * w * 8 for w in widths)
                assert res.stats.total_messages == 2 * m * (p - 1)
                want = [m] * p if kind == "gpipe" else [min(p - s, m) for s in range(p)]
                assert [r["peak_stash"] for r in res] == want


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
@pytest.mark.slow  # a long scenario: make test, not make test-fast
def test_pipeline_measured_bubble_matches_formula():
    p = 4
    layers = mp.init_deep([4, 6, 6, 6, 2], seed=3)
    X, T = mp.make_data(16, 4, 2, seed=4)
    with cl.Cluster(p) as cluster:
        for kind, ms in (("gpipe", (1, 2, 4, 8)), ("1f1b", (2, 8))):
            for m in ms:
                res = cluster.run(mp.pipeline_step, layers, X, T, m, kind, t_f=0.04, t_b=0.04)
                got, want = mp.measured_bubble(res.timeline, p), float(mp.bubble_formula(p, m))
                assert abs(got - want) <= 0.2 * want, (kind, m, got, want)


def test_block_owned_matrix_factorisation():
    n, n_cols, k, p = 24, 18, 3, 3
    U, V, losses = mp.mf_serial(n, n_cols, k, p, epochs=4, lr=0.02)
    need = mp.mf_bytes_per_worker(n, n_cols, k, p)
    budget = need                               # fits on p workers ...
    assert mp.mf_full_bytes(n, n_cols, k) > 2 * budget   # ... but not on one
    with cl.Cluster(p) as cluster:
        res = cluster.run(mp.mf_worker, n, n_cols, k, epochs=4, lr=0.02, budget_bytes=budget)
        assert maxdiff(np.vstack([r["U"] for r in res]), U) == 0
        assert maxdiff(np.vstack([r["V"] for r in res]), V) == 0
        assert np.allclose(np.sum([r["losses"] for r in res], axis=0), losses, rtol=1e-12)
        assert all(r["peak_bytes"] <= budget for r in res)
        assert res.stats.total_bytes == 4 * p * n_cols * k * 8     # every V block crosses p links per epoch
    with cl.Cluster(1) as cluster:
        with pytest.raises(cl.WorkerError, match="budget"):
            cluster.run(mp.mf_worker, n, n_cols, k, epochs=1, budget_bytes=budget)


@pytest.mark.parametrize("mode", ["ring", "server"])
def test_data_parallel_step_equals_serial(mode, net):
    params, X, T, cache, g = net
    p = 3
    with cl.Cluster(p) as cluster:
        res = cluster.run(mp.data_parallel_step, params, X, T, mode)
    n = mp.param_bytes(params) // 8
    for r in res:
        for k in params:
            assert maxdiff(r["grads"][k], g[k]) < TOL
        assert r["param_bytes"] == mp.param_bytes(params)
    assert res.stats.total_bytes == 2 * (p - 1) * n * 8
    if mode == "server":
        assert res.stats.bytes_sent(0) == (p - 1) * n * 8


def test_run_on_first_ranks_of_a_bigger_cluster(net):
    params, X, T, cache, g = net
    with cl.Cluster(4) as cluster:
        for p in (1, 3):
            res = mp.run_on(cluster, p, mp.tp_mlp_step, params, X, T)
            assert len(res) == p
            assert maxdiff(mp.assemble_grads(res)["W1"], g["W1"]) < TOL
            assert res.stats.total_bytes == mp.tp_step_bytes(8, 5, 3, p)
            assert res.stats.bytes[p:].sum() == 0 and res.stats.bytes[:, p:].sum() == 0
        # a worker that refuses (over its memory budget) does not break the cluster
        with pytest.raises(cl.WorkerError, match="budget"):
            mp.run_on(cluster, 1, mp.mf_worker, 24, 18, 3, epochs=1, budget_bytes=100)
        assert len(mp.run_on(cluster, 2, mp.pipeline_step, mp.init_deep([5, 4, 3]), X, T, 2)) == 2
        with pytest.raises(ValueError, match="between 1 and"):
            mp.run_on(cluster, 5, mp.tp_mlp_step, params, X, T)


# ---------------------------------------------------------------- in-graph and between-graph replication
@pytest.mark.parametrize("p", [1, 2, 3])
def test_in_graph_replicas_equal_serial_and_between_graph_bytes(p, net):
    """One client's graph of p replicas gives the full-batch gradient, each rank runs only its nodes,
    and it moves what between-graph replication with the parameters on rank 0 moves: 2 (p - 1) models."""
    params, X, T, cache, g = net
    nodes = mp.in_graph_data_parallel(params, X, T, p)
    assert [n.device for n in nodes] == [0] + list(range(p)) + [0]
    with cl.Cluster(p) as cluster:
        res = cluster.run(mp.run_graph, nodes)
        between = cluster.run(mp.data_parallel_step, params, X, T, "server")
    want = np.concatenate([g[k].ravel() for k in ("W1", "b1", "W2", "b2")])
    assert maxdiff(res[0]["grad"], want) < TOL
    assert [sorted(r) for r in res[1:]] == [[f"replica{r}/grad"] for r in range(1, p)]
    assert res.stats.total_bytes == between.stats.total_bytes == 2 * (p - 1) * mp.param_bytes(params)
    assert res.stats.total_messages == 2 * (p - 1)


def test_in_graph_model_parallel_forward_equals_serial(net):
    params, X, T, cache, g = net
    nodes = mp.in_graph_model_parallel(params, X, 3)
    with cl.Cluster(3) as cluster:
        res = cluster.run(mp.run_graph, nodes)
    assert maxdiff(res[0]["Y"], cache["Y"]) < TOL
    B, D = X.shape
    assert res.stats.total_bytes == 2 * (B * D + B * 3) * 8    # X out to 2 workers, 2 partial sums back
    assert "X" in mp.graph_table(nodes) and "rank 2" in mp.graph_table(nodes)


def test_a_graph_runs_in_any_topological_order_across_ranks():
    """Inputs made on another rank arrive by tag, whatever rank made them and in which order."""
    nodes = [mp.Node("a", 1, lambda: 2.0), mp.Node("b", 0, lambda: 3.0),
             mp.Node("c", 1, lambda a, b: a * b, ("a", "b")), mp.Node("d", 0, lambda c, a: c + a, ("c", "a"))]
    with cl.Cluster(2) as cluster:
        res = cluster.run(mp.run_graph, nodes)
    assert res[0] == {"b": 3.0, "d": 8.0} and res[1] == {"a": 2.0, "c": 6.0}


# -- interleaved 1F1B and activation recomputation (Narayanan et al. 2021, sections 2.2.2 and 3.5) --------
@pytest.mark.parametrize("costs", [(1, 1), (1, 2), (2, 3)])
def test_interleaved_bubble_is_exactly_the_formula_and_v1_is_1f1b(costs):
    t_f, t_b = costs
    for p in range(1, 7):
        for k in (1, 2, 3):
            m = k * p
            for v in (1, 2, 3, 4):
                sim = mp.simulate_interleaved(p, m, v, t_f, t_b)
                busy = sum(sim["busy"])
                assert all(b == m * (t_f + t_b) for b in sim["busy"])
                assert sim["bubble"] == mp.interleaved_bubble(p, m, v) == Fraction(p - 1, v * m + p - 1)
                # the paper's bubble time fraction: idle over busy
                assert (p * sim["steps"] - busy) / busy == Fraction(p - 1, v * m)
                assert isinstance(sim["bubble"], Fraction)
            one = mp.simulate("1f1b", p, m, t_f, t_b)
            inter = mp.simulate_interleaved(p, m, 1, t_f, t_b)
            assert inter["steps"] == one["steps"] and inter["peak_stash"] == one["peak_stash"]


def test_interleaved_schedule_is_valid():
    for p in range(1, 6):
        for m in (p, 2 * p):
            for v in (1, 2, 3):
                for d in range(p):
                    ops = mp.interleaved_ops(p, m, v, d)
                    want = [(op, i, c) for op in "FB" for i in range(m) for c in range(v)]
                    assert sorted(ops) == sorted(want)
                    # a chunk micro-batch's backward never comes before its forward
                    assert all(ops.index(("F", i, c)) < ops.index(("B", i, c)) for i in range(m) for c in range(v))
                sim = mp.simulate_interleaved(p, m, v)
                start = {(d, op, i, c): a for (d, op, i, a, _), c in zip(sim["events"], sim["chunks"])}
                end = {(d, op, i, c): b for (d, op, i, _, b), c in zip(sim["events"], sim["chunks"])}
                for (d, op, i, c), a in start.items():     # virtual stage g = c p + d waits for g - 1 (or g + 1)
                    g = c * p + d
                    if op == "F" and g > 0:
                        assert a >= end[((g - 1) % p, "F", i, (g - 1) // p)]
                    if op == "B" and g < v * p - 1:
                        assert a >= end[((g + 1) % p, "B", i, (g + 1) // p)]
    with pytest.raises(ValueError, match="multiple of p"):
        mp.interleaved_ops(4, 6, 2, 0)
    with pytest.raises(ValueError, match="v >= 1"):
        mp.simulate_interleaved(2, 2, 0)


def test_interleaved_schedule_plot_draws_every_op():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_lib.model_parallel.plots import plot_schedule
    sim = mp.simulate_interleaved(2, 4, 2, t_f=1, t_b=2)
    ax = plot_schedule(sim)
    assert len(ax.collections) == 2 * 2 * 4 * 2
    assert "t_b=2" in ax.get_title() and "v=2" in ax.get_title()
    plt.close("all")


@pytest.mark.parametrize("kind", mp.SCHEDULES)
def test_recomputation_gives_the_same_gradients_and_holds_only_stage_inputs(kind):
    layers = mp.init_deep([5, 8, 7, 6, 3], seed=4)     # 4 layers on 2 stages
    X, T = mp.make_data(12, 5, 3, seed=5)
    L, gref = mp.deep_forward_backward(layers, X, T)
    m, p = 4, 2
    rows = 12 // m
    with cl.Cluster(p) as cluster:
        runs = {rc: cluster.run(mp.pipeline_step, layers, X, T, m, kind, recompute=rc) for rc in (False, True)}
    for rc, res in runs.items():
        for (dW, db), (rW, rb) in zip(mp.assemble_pipeline_grads(res), gref):
            assert maxdiff(dW, rW) < TOL and maxdiff(db, rb) < TOL
        assert res[-1]["loss"] == pytest.approx(L, abs=TOL)
        labels = [e.label for e in res.timeline if e.kind == "compute"]
        assert sum(x.startswith("R") for x in labels) == (p * m if rc else 0)
        assert sum(x.startswith("F") for x in labels) == sum(x.startswith("B") for x in labels) == p * m
        for r in res:      # the CPU its ops took: recomputation only where asked for
            assert r["cpu_seconds"].keys() == {"F", "R", "B"} and r["cpu_seconds"]["F"] > 0 < r["cpu_seconds"]["B"]
            assert (r["cpu_seconds"]["R"] > 0) == rc
    for s, (lo, hi) in enumerate(mp.stage_layers(len(layers), p)):
        held = m if kind == "gpipe" else min(m, p - s)
        inputs = layers[lo][0].shape[0]
        outputs = sum(W.shape[1] for W, _ in layers[lo:hi])
        assert runs[True][s]["peak_stash_bytes"] == held * rows * inputs * 8
        assert runs[False][s]["peak_stash_bytes"] == held * rows * (inputs + outputs) * 8
        assert runs[True][s]["peak_stash"] == runs[False][s]["peak_stash"] == held
