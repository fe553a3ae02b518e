"""Visible checks of lesson 04 (decentralized learning: gossip and D-PSGD)."""
import math

import networkx as nx
import numpy as np

from course_lib.grading import question


def _expected_mh(G):
    n = G.number_of_nodes()
    W = np.zeros((n, n))
    for i, j in G.edges:
        W[i, j] = W[j, i] = 1.0 / (1 + max(G.degree(i), G.degree(j)))
    W[np.diag_indices(n)] = 1 - W.sum(axis=1)
    return W


def check_mh_on(fn, G, name):
    n = G.number_of_nodes()
    W = np.asarray(fn(G.copy()), dtype=float)
    assert W.shape == (n, n), f"on a {name} with {n} nodes W must be {n} x {n}, got shape {W.shape}"
    assert np.allclose(W, W.T, atol=1e-12), f"W is not symmetric on a {name}: W[i, j] must equal W[j, i]"
    assert np.allclose(W.sum(axis=1), 1, atol=1e-12), (
        f"rows of W must sum to 1 on a {name} (set W_ii = 1 - sum of the row's edge weights)")
    A = nx.to_numpy_array(G, nodelist=range(n)) != 0
    off = (np.abs(W) > 1e-12) & ~A & ~np.eye(n, dtype=bool)
    assert not off.any(), f"W has weight between nodes that are not neighbours on a {name}"
    ev = np.linalg.eigvalsh(W)
    assert ev[0] > -1 + 1e-9, (
        f"on a {name} your W has eigenvalue {ev[0]:.3f}: gossip oscillates for ever. "
        "Metropolis-Hastings weights are 1 / (1 + max(d_i, d_j)): the '1 +' keeps weight on the node itself")
    E = _expected_mh(G)
    i, j = np.unravel_index(np.argmax(np.abs(W - E)), W.shape)
    assert np.abs(W - E).max() < 1e-12, (
        f"on a {name}, W[{i},{j}] = {W[i, j]:.4f} but Metropolis-Hastings gives {E[i, j]:.4f}")


@question("ex04_1", points=2, title="Build the Metropolis-Hastings mixing matrix",
          names=("metropolis_weights",), timeout=30)
def ex04_1(ns):
    """metropolis_weights(G) returns W with W_ij = 1/(1 + max(d_i, d_j)) on edges, W_ii = 1 - sum_j W_ij."""
    fn = ns["metropolis_weights"]
    check_mh_on(fn, nx.cycle_graph(8), "ring of 8")
    check_mh_on(fn, nx.star_graph(5), "star of 6")


def _bipartite_W():
    # K_{3,3}: MH weights 1/4 everywhere, eigenvalues 1, 1/4 (x4), -1/2: r = |lambda_n| = 1/2.
    G = nx.complete_bipartite_graph(3, 3)
    return _expected_mh(G)


@question("ex04_2", points=2, title="The rate r = max(lambda_2, |lambda_n|)",
          names=("mixing_rate",), timeout=30)
def ex04_2(ns):
    """mixing_rate(W) returns r = max(lambda_2, |lambda_n|) for a symmetric mixing matrix W."""
    fn = ns["mixing_rate"]
    W = _expected_mh(nx.cycle_graph(10))
    r = float(fn(W.copy()))
    expect = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / 10)
    assert abs(r - expect) < 1e-9, f"ring of 10: expected r = {expect:.6f}, got {r:.6f}"
    r = float(fn(_bipartite_W()))
    assert abs(r - 0.5) < 1e-9, (
        f"complete bipartite K(3,3): expected r = 0.5, got {r:.6f}. Its eigenvalues are 1, 1/4 and "
        "-1/2: the most negative eigenvalue shrinks the error slowest, so r must look at |lambda_n| too")


def _make_driver(step):
    # A closure: cloudpickle ships it (and the student's step function) to the workers by value.
    def driver(comm, W, x0, steps):
        i = comm.rank
        weights = {j: float(W[i, j]) for j in sorted(set(comm.neighbors) | {i})}
        x = np.array(x0[i], dtype=float)
        for _ in range(steps):
            x = np.asarray(step(comm, x, weights), dtype=float)
        return x
    return driver


def check_gossip_step(step, G, steps, d, name, start_method=None):
    from course_lib import Cluster

    n = G.number_of_nodes()
    W = _expected_mh(G)
    x0 = np.random.default_rng(4).standard_normal((n, d))
    with Cluster(n, graph=G, start_method=start_method, timeout=30) as c:
        res = c.run(_make_driver(step), W, x0, steps)
    got = np.stack([np.reshape(r, (d,)) for r in res])
    want = np.linalg.matrix_power(W, steps) @ x0
    err = np.abs(got - want).max()
    assert err < 1e-12, (f"on a {name}, after {steps} steps node values differ from W^t x0 by {err:.2e}. "
                         "Each node must return W_ii x_i + sum over neighbours j of W_ij x_j")
    for i in range(n):
        sent = res.stats.messages_sent(i)
        deg = G.degree(i)
        assert sent == steps * deg, (
            f"node {i} has {deg} neighbours and sent {sent} messages in {steps} steps; "
            f"one step sends x once to each neighbour ({steps * deg} in all)")


@question("ex04_3", points=3, title="One gossip step in the worker", names=("gossip_step",), timeout=90)
def ex04_3(ns):
    """gossip_step(comm, x, weights) sends x to every neighbour, receives theirs, returns sum_j W_ij x_j."""
    check_gossip_step(ns["gossip_step"], nx.cycle_graph(6), steps=5, d=2, name="ring of 6")


@question("ex04_4", points=2, title="Predict the iterations to reach an error eps",
          names=("iterations_to_reach",), timeout=30)
def ex04_4(ns):
    """iterations_to_reach(r, eps) is the smallest t with r**t <= eps."""
    fn = ns["iterations_to_reach"]
    for r, eps in [(0.5, 1e-3), (0.9, 1e-6), (0.99, 0.05)]:
        t = fn(r, eps)
        assert isinstance(t, (int, np.integer)), f"iterations_to_reach must return an int, got {type(t).__name__}"
        want = math.ceil(math.log(eps) / math.log(r))
        assert t == want, f"iterations_to_reach({r}, {eps}) returned {t}; r**t must just reach eps: {want}"
