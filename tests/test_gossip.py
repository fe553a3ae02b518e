"""Lesson 04: gossip and D-PSGD, checked against the spectrum and single-process references."""
import math
import subprocess
import sys
import textwrap
import warnings

import networkx as nx
import numpy as np
import pytest

import course_lib.gossip as gs

START_METHODS = ["fork", "spawn", "forkserver"]


def mh(G):
    return gs.metropolis_hastings(G)


def random_x0(n, d=3, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d))


BOUND_GRAPHS = {
    "ring12": lambda: gs.ring(12),
    "ring9": lambda: gs.ring(9),
    "torus16": lambda: gs.torus(16),
    "torus24": lambda: gs.torus(24),
    "expander20": lambda: gs.expander(20, 3, seed=1),
    "erdos_renyi20": lambda: gs.erdos_renyi(20, 0.25, seed=2),
    "hypercube16": lambda: gs.hypercube(16),
}


# --- closed forms ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 4, 5, 8, 13, 32, 64])
def test_ring_lambda2_closed_form(n):
    s = gs.spectrum(mh(gs.ring(n)))
    assert abs(s.lambda_2 - (1 / 3 + 2 / 3 * math.cos(2 * math.pi / n))) < 1e-12
    assert abs(s.lambda_2 - gs.ring_lambda2(n)) < 1e-12


@pytest.mark.parametrize("n", [3, 5, 10, 40])
def test_star_and_complete_closed_forms(n):
    assert abs(gs.spectrum(mh(gs.star(n))).lambda_2 - (1 - 1 / n)) < 1e-12
    W = mh(gs.complete(n))
    assert abs(gs.spectrum(W).lambda_2) < 1e-12
    assert np.allclose(W, np.full((n, n), 1 / n), atol=1e-15)


@pytest.mark.parametrize("G", [gs.torus(16), gs.hypercube(8), gs.hypercube(32)], ids=["torus16", "cube8", "cube32"])
def test_lambda_n_is_minus_lambda_2_on_torus_and_hypercube(G):
    s = gs.spectrum(mh(G))
    assert abs(s.lambda_n + s.lambda_2) < 1e-12
    assert s.r == pytest.approx(max(s.lambda_2, abs(s.lambda_n)))


# --- mixing matrices ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(gs.TOPOLOGIES))
@pytest.mark.parametrize("n", [8, 16])
def test_metropolis_hastings_is_valid(name, n):
    G = gs.make_topology(name, n, seed=3)
    W = mh(G)
    gs.check_mixing_matrix(W, G)
    deg = dict(G.degree)
    for i, j in G.edges:
        assert W[i, j] == 1 / (1 + max(deg[i], deg[j]))
    s = gs.spectrum(W)
    assert abs(s.eigenvalues[0] - 1) < 1e-12 and s.r < 1 and s.lambda_n > -1


def test_check_mixing_matrix_rejects_bad_matrices():
    G = gs.ring(5)
    W = mh(G)
    bad = W.copy()
    bad[0, 1] += 0.1
    bad[0, 0] -= 0.1
    with pytest.raises(ValueError, match="symmetric"):
        gs.check_mixing_matrix(bad, G)
    with pytest.raises(ValueError, match="sum to 1"):
        gs.check_mixing_matrix(W * 1.01, G)
    off = W.copy()
    off[0, 2] = off[2, 0] = 0.1
    off[0, 0] -= 0.1
    off[2, 2] -= 0.1
    with pytest.raises(ValueError, match="not an edge"):
        gs.check_mixing_matrix(off, G)
    with pytest.raises(ValueError, match="square"):
        gs.check_mixing_matrix(np.ones((2, 3)))


def test_graph_validation_messages():
    with pytest.raises(ValueError, match="undirected"):
        mh(nx.DiGraph([(0, 1)]))
    with pytest.raises(ValueError, match="0..2"):
        mh(nx.Graph([("a", "b"), ("b", "c")]))
    G = gs.ring(4)
    G.add_edge(1, 1)
    with pytest.raises(ValueError, match="self-loops"):
        mh(G)
    with pytest.raises(ValueError, match="power of 2"):
        gs.hypercube(12)
    with pytest.raises(ValueError, match="unknown topology"):
        gs.make_topology("mesh", 4)


# --- consensus against r^t ------------------------------------------------------------------
def steps_for(r, floor=1e-7):
    return int(math.log(floor) / math.log(r))


@pytest.mark.parametrize("name", sorted(BOUND_GRAPHS))
def test_error_ratio_below_r_to_the_t(name):
    G = BOUND_GRAPHS[name]()
    W = mh(G)
    r = gs.spectrum(W).r
    T = steps_for(r)
    for seed in range(3):
        traj = gs.gossip_reference(W, random_x0(G.number_of_nodes(), seed=seed), T, G)
        e = gs.consensus_error(traj)
        ratio = e / e[0]
        t = np.arange(T + 1)
        assert np.all(ratio <= r ** t * (1 + 1e-9)), (name, seed)
        assert np.abs(traj[-1].mean(axis=0) - traj[0].mean(axis=0)).max() < 1e-13  # average kept


@pytest.mark.parametrize("name", sorted(BOUND_GRAPHS))
def test_lambda2_eigenvector_decays_exactly(name):
    G = BOUND_GRAPHS[name]()
    W = mh(G)
    ev, V = np.linalg.eigh(W)
    lam2, v = ev[-2], V[:, -2]
    T = steps_for(abs(lam2), 1e-6)
    e = gs.consensus_error(gs.gossip_reference(W, v, T, G))
    t = np.arange(T + 1)
    assert np.max(np.abs(e / e[0] - abs(lam2) ** t)) < 1e-9


@pytest.mark.parametrize("name", ["ring12", "ring9", "torus16", "torus24", "expander20", "erdos_renyi20"])
def test_fitted_decay_slope_matches_log_r(name):
    G = BOUND_GRAPHS[name]()
    W = mh(G)
    r = gs.spectrum(W).r
    T = steps_for(r, 1e-10)
    e = gs.consensus_error(gs.gossip_reference(W, random_x0(G.number_of_nodes(), seed=7), T, G))
    fitted = gs.fit_decay_rate(e)
    assert abs(math.log(fitted) - math.log(r)) <= 0.03 * abs(math.log(r)), (fitted, r)


def test_reference_equals_matrix_power():
    G = gs.expander(16, 3, seed=0)
    W = mh(G)
    x0 = random_x0(16, 4)
    traj = gs.gossip_reference(W, x0, 40, G)
    assert np.max(np.abs(traj[-1] - np.linalg.matrix_power(W, 40) @ x0)) < 1e-12


def test_wrong_weights_make_an_even_ring_oscillate():
    G = gs.ring(8)
    W = nx.to_numpy_array(G) / 2                      # 1 / max(d_i, d_j) = 1/2, W_ii = 0
    assert gs.spectrum(W).lambda_n == pytest.approx(-1)
    x0 = np.array([1.0, -1] * 4)
    e = gs.consensus_error(gs.gossip_reference(W, x0, 50))
    assert np.allclose(e, e[0])                       # never agrees


@pytest.mark.parametrize("r,eps", [(0.5, 1e-3), (0.9, 1e-6), (0.99, 1e-2), (0.6, 0.6 ** 7)])
def test_iterations_to_eps(r, eps):
    t = gs.iterations_to_eps(r, eps)
    assert r ** t <= eps < r ** (t - 1)
    assert gs.iterations_to_eps(1.0, 0.1) == math.inf


# --- disconnected graphs --------------------------------------------------------------------
def test_disconnected_graph_warns_naming_components_and_never_agrees():
    G = nx.disjoint_union(gs.ring(5), gs.path(3))
    with pytest.warns(gs.DisconnectedGraphWarning, match=r"2 components \{0, 1, 2, 3, 4\}, \{5, 6, 7\}"):
        W = gs.metropolis_hastings(G)
    assert gs.spectrum(W).lambda_2 == pytest.approx(1)
    x0 = random_x0(8, 2)
    traj = gs.gossip_reference(W, x0, 300, G)
    per = gs.component_errors(traj, gs.components(G))
    assert per[-1].max() < 1e-8 * per[0].max()
    assert gs.consensus_error(traj)[-1] > 0.1 * gs.consensus_error(traj)[0]
    assert np.allclose(traj[-1, :5], x0[:5].mean(axis=0)) and np.allclose(traj[-1, 5:], x0[5:].mean(axis=0))


def test_connected_graph_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gs.metropolis_hastings(gs.ring(6))


# --- randomized pairwise gossip -------------------------------------------------------------
def test_pairwise_keeps_average_and_follows_expected_rate():
    G = gs.ring(10)
    Wb = gs.pairwise_expected_matrix(G)
    gs.check_mixing_matrix(Wb, G)
    lam = gs.spectrum(Wb).lambda_2
    ticks = 400
    msq = np.zeros(ticks + 1)
    x0 = random_x0(10, 1, seed=1)
    for seed in range(60):
        traj = gs.pairwise_reference(x0, gs.pairwise_schedule(G, ticks, seed))
        assert np.abs(traj[-1].mean() - x0.mean()) < 1e-12
        msq += gs.consensus_error(traj) ** 2 / 60
    # Boyd et al. (2006): E||x_k - avg||^2 <= lambda_2(E W)^k ||x_0 - avg||^2
    k = np.arange(ticks + 1)
    assert np.all(msq / msq[0] <= 1.3 * lam ** k)
    assert msq[-1] / msq[0] < 0.05


# --- D-PSGD references ----------------------------------------------------------------------
def test_dpsgd_reference_converges_and_reaches_consensus():
    prob = gs.make_least_squares(800, 10, 8, seed=0)
    G = gs.ring(8)
    traj = gs.dpsgd_reference(prob, mh(G), G, 300, lr=0.5, batch=16)
    xbar = traj.mean(axis=1)
    sub = prob.suboptimality(xbar)
    assert sub[-1] < 0.05 * sub[0]
    spread = np.linalg.norm(traj[-1] - xbar[-1])
    assert spread < 0.2 * np.linalg.norm(xbar[-1])
    c = gs.centralised_sgd_reference(prob, 300, lr=0.5, batch=16)
    assert prob.suboptimality(c[-1]) < 0.05 * prob.suboptimality(c[0])


def test_least_squares_shards_cover_rows():
    prob = gs.make_least_squares(103, 4, 5, iid=False)
    assert prob.shards[0][0] == 0 and prob.shards[-1][1] == 103
    assert all(a[1] == b[0] for a, b in zip(prob.shards, prob.shards[1:]))
    with pytest.raises(ValueError):
        gs.make_least_squares(3, 2, 5)


# --- real processes -------------------------------------------------------------------------
@pytest.mark.parametrize("start_method", START_METHODS)
def test_real_gossip_equals_matrix_iteration(start_method):
    G = gs.torus(8)                                   # 2 x 4 torus
    W = mh(G)
    x0 = random_x0(8, 2, seed=3)
    steps = 15
    run = gs.run_gossip(G, x0, steps, start_method=start_method)
    ref = gs.gossip_reference(W, x0, steps, G)
    assert np.array_equal(run.traj, ref)              # same summation order: bit for bit
    for t in (1, 7, steps):
        assert np.abs(run.traj[t] - np.linalg.matrix_power(W, t) @ x0).max() < 1e-12
    # Only edges carry bytes: one x per neighbour per step.
    A = nx.to_numpy_array(G, nodelist=range(8)) != 0
    assert np.array_equal(run.stats.bytes, np.where(A, steps * x0[0].nbytes, 0))
    assert np.array_equal(run.stats.messages, np.where(A, steps, 0))


def test_real_gossip_on_random_graph_meets_the_bound():
    G = gs.erdos_renyi(14, 0.3, seed=4)
    W = mh(G)
    r = gs.spectrum(W).r
    run = gs.run_gossip(G, random_x0(14, 3, seed=5), 60, start_method="fork")
    assert np.array_equal(run.traj, gs.gossip_reference(W, run.traj[0], 60, G))
    e = run.errors
    assert np.all(e / e[0] <= r ** np.arange(61) * (1 + 1e-9))


def test_real_gossip_rejects_weights_off_the_graph():
    G = gs.ring(5)
    W = mh(gs.complete(5))
    with pytest.raises(ValueError, match="not an edge"):
        gs.run_gossip(G, random_x0(5), 3, W=W, start_method="fork")


def test_real_disconnected_run_agrees_only_within_components():
    G = nx.disjoint_union(gs.ring(4), gs.ring(3))
    x0 = random_x0(7, 1, seed=2)
    with pytest.warns(gs.DisconnectedGraphWarning, match=r"\{0, 1, 2, 3\}, \{4, 5, 6\}"):
        run = gs.run_gossip(G, x0, 80, start_method="fork")
    per = gs.component_errors(run.traj, gs.components(G))
    assert per[-1].max() < 1e-10
    assert run.errors[-1] > 0.1 * run.errors[0]
    assert run.stats.bytes[:4, 4:].sum() == 0 and run.stats.bytes[4:, :4].sum() == 0


def test_real_pairwise_gossip_equals_reference():
    G = gs.expander(10, 3, seed=0)
    x0 = random_x0(10, 2, seed=6)
    run = gs.run_pairwise(G, x0, 300, seed=9, start_method="fork")
    ref = gs.pairwise_reference(x0, gs.pairwise_schedule(G, 300, seed=9))
    assert np.array_equal(run.traj, ref)
    assert run.stats.total_messages == 2 * 300        # one message each way per tick
    assert run.result is run.run                      # the name the notebook reads


def test_real_dpsgd_and_centralised_sgd_equal_their_references():
    prob = gs.make_least_squares(480, 6, 6, iid=False, seed=1)
    G = gs.ring(6)
    run = gs.run_dpsgd(G, prob, 40, lr=0.5, batch=8, seed=2, start_method="fork")
    ref = gs.dpsgd_reference(prob, mh(G), G, 40, lr=0.5, batch=8, seed=2)
    assert np.abs(run.traj - ref).max() < 1e-12
    # Busiest node: degree 2, sends and receives one model per neighbour per step.
    assert gs.busiest_node_bytes(run.stats) == 2 * 2 * 40 * prob.dim * 8
    c = gs.run_centralised_sgd(prob, 40, lr=0.5, batch=8, seed=2, start_method="fork")
    assert np.abs(c.traj - gs.centralised_sgd_reference(prob, 40, lr=0.5, batch=8, seed=2)).max() < 1e-12
    # The server receives n gradients and sends n models per step (plus one small stop message each).
    assert c.stats.bytes_received(0) == 6 * 40 * prob.dim * 8
    stop = c.stats.bytes_sent(0) - 6 * 40 * prob.dim * 8
    assert 0 < stop <= 6 * 16 and gs.busiest_node_bytes(c.stats) == c.stats.bytes_sent(0) + c.stats.bytes_received(0)
    a = gs.run_centralised_sgd(prob, 40, lr=0.5, batch=8, seed=2, asynchronous=True, start_method="fork")
    assert a.traj.shape == (41, prob.dim)
    sub = prob.suboptimality(a.traj)
    assert sub[-1] < 0.2 * sub[0]


SIXTY_FOUR = """
import resource, sys, time
import numpy as np
import course_lib.gossip as gs
if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    G = gs.make_topology(sys.argv[1], 64)
    x0 = np.random.default_rng(0).standard_normal((64, 2))
    t = time.perf_counter()
    run = gs.run_gossip(G, x0, 10, start_method="fork")
    ok = np.array_equal(run.traj, gs.gossip_reference(gs.metropolis_hastings(G), x0, 10, G))
    print("OK" if ok else "MISMATCH", round(time.perf_counter() - t, 2))
"""


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["ring", "hypercube"])
def test_64_node_processes_with_fd_limit_1024(topology, tmp_path):
    script = tmp_path / "sixty_four.py"
    script.write_text(textwrap.dedent(SIXTY_FOUR))
    out = subprocess.run([sys.executable, str(script), topology], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("OK"), out.stdout + out.stderr[-2000:]


def test_a_cluster_is_reused_and_must_have_the_graph():
    from course_lib import Cluster

    G = gs.ring(5)
    x0 = random_x0(5, 1)
    with Cluster(5, graph=G, start_method="fork") as c:
        a = gs.run_gossip(G, x0, 5, cluster=c)
        b = gs.run_gossip(G, 2 * x0, 5, cluster=c)
        assert np.array_equal(2 * a.traj, b.traj)
        with pytest.raises(ValueError, match="graph differs"):
            gs.run_gossip(gs.path(5), x0, 5, cluster=c)
        with pytest.raises(ValueError, match="5 workers"):
            gs.run_gossip(gs.ring(4), x0[:4], 5, cluster=c)


# --- the emulated network: D-PSGD against the server (Lian et al. 2017) ----------------------
@pytest.mark.parametrize("G", [gs.ring(16), gs.torus(16), gs.hypercube(16), gs.ring(7), gs.expander(12, 3, seed=2)],
                         ids=["ring16", "torus16", "cube16", "ring7", "expander12"])
def test_exchange_rounds_are_matchings_covering_every_edge_once(G):
    rounds = gs.exchange_rounds(G)
    edges = [e for matching in rounds for e in matching]
    assert sorted(edges) == sorted(tuple(sorted(e)) for e in G.edges)
    for matching in rounds:
        nodes = [i for e in matching for i in e]
        assert len(nodes) == len(set(nodes))              # no node twice in a round
    order = gs.exchange_order(G)
    assert all(sorted(order[i]) == sorted(G.neighbors(i)) for i in G)
    if nx.is_bipartite(G) and len({d for _, d in G.degree}) == 1:   # Konig: exactly d rounds
        d = G.degree(0)
        assert len(rounds) == d
        # each edge sits at the same position in both ends' orders: round k talks to round k
        assert all(order[i].index(j) == order[j].index(i) for i, j in G.edges)


def test_iteration_time_models_state_what_they_charge():
    from course_lib import Network

    m, c, alpha, t = 160, 1e-3, 5e-4, 8e-3
    for downlink in (True, False):
        net = Network(latency=alpha, bandwidth=m / t, downlink=downlink)
        d = gs.dpsgd_iteration_time(4, m, net, c)
        assert d.seconds == pytest.approx(c + 4 * t + alpha, rel=1e-12) and d.incast == 0
        s = gs.server_iteration_time(16, m, net, c)
        assert s.seconds == pytest.approx(c + 17 * t + 2 * alpha, rel=1e-12) and s.incast == 0
        assert s.charges_receiver is downlink and d.charges_receiver is downlink
        assert s.directions == ("sender's uplink and receiver's downlink" if downlink else "sender's uplink only")
    instant = gs.server_iteration_time(16, m, Network(), c)
    assert instant.seconds == c and not instant.charges_receiver
    # the downlink's queue, when p messages are ready at the same moment: (p - 1) transmissions
    from course_lib.gossip.network_time import _delivered
    assert _delivered([1.0] * 5, 0.25) == pytest.approx(2.0)
    assert _delivered([1.0, 1.25, 1.5], 0.25) == pytest.approx(1.5)   # already spaced: no queue
    with pytest.raises(ValueError, match="one latency and one bandwidth"):
        gs.dpsgd_iteration_time(2, m, Network(latency=alpha, bandwidth=1e6, links={(0, 1): (0.0, 1e3)}))


EMULATED_P, EMULATED_STEPS, MESSAGE_SECONDS = 8, 8, 8e-3


@pytest.fixture(scope="module")
def emulated_runs():
    """D-PSGD on a ring of 8 and the synchronous server with 8 workers, on an instant network and on
    one where a model takes 8 ms on a link (latency 0.5 ms)."""
    from course_lib import Network

    prob = gs.make_least_squares(640, 20, EMULATED_P, seed=3, heterogeneity=1.0)
    m = prob.dim * 8
    nets = {"instant": Network(), "slow": Network(latency=5e-4, bandwidth=m / MESSAGE_SECONDS)}
    runs = {}
    for name, net in nets.items():
        runs["ring", name] = gs.run_dpsgd(gs.ring(EMULATED_P), prob, 3 * EMULATED_STEPS if name == "instant"
                                          else EMULATED_STEPS, 0.5, 8, seed=1, start_method="fork", network=net)
        runs["server", name] = gs.run_centralised_sgd(prob, 3 * EMULATED_STEPS if name == "instant" else EMULATED_STEPS,
                                                      0.5, 8, seed=1, start_method="fork", network=net)
    return prob, nets, runs


def test_busiest_node_bytes_on_an_emulated_network_are_the_formula(emulated_runs):
    """Exactly 2 deg m per iteration for D-PSGD, 2 p m plus p stop messages for the server; the
    network changes no value: the trajectories equal the single-process references."""
    prob, nets, runs = emulated_runs
    m, G = prob.dim * 8, gs.ring(EMULATED_P)
    ring, server = runs["ring", "slow"], runs["server", "slow"]
    assert gs.busiest_node_bytes(ring.stats) == gs.dpsgd_busiest_bytes(G, m, EMULATED_STEPS) \
        == 2 * 2 * m * EMULATED_STEPS
    assert gs.busiest_node_bytes(server.stats) == gs.server_busiest_bytes(EMULATED_P, m, EMULATED_STEPS) \
        == 2 * EMULATED_P * m * EMULATED_STEPS + EMULATED_P * 4
    assert np.array_equal(ring.traj, gs.dpsgd_reference(prob, mh(G), G, EMULATED_STEPS, 0.5, 8, seed=1))
    assert np.array_equal(server.traj, gs.centralised_sgd_reference(prob, EMULATED_STEPS, 0.5, 8, seed=1))
    assert len(gs.iteration_starts(ring, range(EMULATED_P))) == EMULATED_STEPS


@pytest.mark.timing
def test_dpsgd_beats_the_server_on_a_slow_emulated_network_as_the_model_says(emulated_runs):
    """Server: (p + 1) m beta + 2 alpha per iteration, ring: 2 m beta + alpha (plus c, the iteration on
    the instant network). Margins: the emulated sleeps end in a spin that shares the cores."""
    prob, nets, runs = emulated_runs
    m = prob.dim * 8
    c = {who: gs.seconds_per_iteration(runs[who, "instant"], ranks) for who, ranks in
         [("ring", range(EMULATED_P)), ("server", range(1, EMULATED_P + 1))]}
    ring = gs.seconds_per_iteration(runs["ring", "slow"], range(EMULATED_P))
    server = gs.seconds_per_iteration(runs["server", "slow"], range(1, EMULATED_P + 1))
    ring_model = gs.dpsgd_iteration_time(2, m, nets["slow"], c["ring"]).seconds
    server_model = gs.server_iteration_time(EMULATED_P, m, nets["slow"], c["server"]).seconds
    assert 0.7 < ring / ring_model < 1.4, (ring, ring_model)
    assert 0.8 < server / server_model < 1.25, (server, server_model)
    assert server / ring > 2.5
    assert 0.6 < (server / ring) / (server_model / ring_model) < 1.5


# --- what lesson 04's figures and widget rely on ------------------------------------------
@pytest.mark.parametrize("n", range(4, 33))
def test_torus_note_says_what_torus_builds(n):
    """The widget prints torus_note(n): empty exactly when torus(n) is 4-regular; otherwise it names the
    degree the graph really has, and the n it proposes do give a 4-regular torus."""
    note = gs.torus_note(n)
    degrees = {d for _, d in gs.torus(n).degree}
    assert (note == "") == (degrees == {4})
    if note:
        assert len(degrees) == 1
        degree = degrees.pop()
        assert ("a ring" in note) == (degree == 2) and ("3 neighbours" in note) == (degree == 3)
        proposed = [int(m) for m in note.rsplit(": ", 1)[1].split(" and ")]
        assert proposed and all({d for _, d in gs.torus(m).degree} == {4} for m in proposed)
        assert all(gs.torus_note(m) for m in range(min(proposed) + 1, max(proposed)) if m != n)


def test_emulated_compute_changes_the_time_not_the_models():
    """compute_seconds pads every gradient phase to that long; the models are those of the plain run."""
    prob = gs.make_least_squares(240, 4, 4, iid=False, seed=1)
    G = gs.ring(4)
    plain = gs.run_dpsgd(G, prob, 6, lr=0.5, batch=8, seed=2, start_method="fork")
    slow = gs.run_dpsgd(G, prob, 6, lr=0.5, batch=8, seed=2, start_method="fork", compute_seconds=0.02)
    assert np.array_equal(plain.traj, slow.traj)
    gradients = [e.duration for e in slow.result.timeline.of(kind="compute") if e.label == "gradient"]
    assert len(gradients) == 4 * 6 and min(gradients) >= 0.02
    server = gs.run_centralised_sgd(prob, 6, lr=0.5, batch=8, seed=2, start_method="fork", compute_seconds=0.02)
    assert np.array_equal(server.traj, gs.run_centralised_sgd(prob, 6, lr=0.5, batch=8, seed=2,
                                                              start_method="fork").traj)
    worker_gradients = [e.duration for e in server.result.timeline.of(kind="compute") if e.label == "gradient"]
    assert len(worker_gradients) == 4 * 6 and min(worker_gradients) >= 0.02
