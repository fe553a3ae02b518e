"""Lesson 04, decentralized learning (gossip): visible checks.

ex04_1  metropolis_weights(G)            the Metropolis-Hastings mixing matrix of a graph
ex04_2  mixing_rate(W)                   r = max(lambda_2, |lambda_n|)
ex04_3  gossip_step(comm, x, weights)    one synchronous gossip step inside a node process
ex04_4  iterations_to_reach(r, eps)      the smallest t with r**t <= eps
"""
from fractions import Fraction as F

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_array,
    as_int,
    as_number,
    assert_no_helper,
    call_keeping_inputs,
    formula_mismatch,
    num,
    off_by,
    readable,
    refuse_helpers,
    watch_helpers,
    worst,
)

CHECK_TIMEOUT = 5.0  # seconds a gossip run may take (these take well under one)


def _graph(n, edges):
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from((int(i), int(j)) for i, j in edges)
    return G


def _edge_list(G):
    return sorted(tuple(sorted((int(i), int(j)))) for i, j in G.edges)


# ------------------------------------------------------------------------------ ex04_1
@harness
def run_metropolis(fn, n, edges):
    """Build the graph on nodes 0..n-1 with ``edges``, call ``fn(G)``; return (W, G's edges after, n after)."""
    G = _graph(n, edges)
    W = fn(G)
    return readable(W), _edge_list(G), G.number_of_nodes()


def check_mh_on(fn, n, edges, name, want):
    """``metropolis_weights`` on the graph (n, edges) must give the matrix ``want``."""
    edges = sorted(tuple(sorted(e)) for e in edges)
    W, after, n_after = run_metropolis(fn, n, edges)
    assert after == edges and n_after == n, (
        f"on a {name}, metropolis_weights must not change the graph it is given: it had {len(edges)} edges and "
        f"{n} nodes, after the call {len(after)} edges and {n_after} nodes.")
    W = as_array(W, f"on a {name}, W", shape=(n, n))
    W = W.astype(float)
    if not np.allclose(W, W.T, atol=1e-12):
        i, j = (int(v) for v in np.unravel_index(int(np.argmax(np.abs(W - W.T))), W.shape))
        raise AssertionError(f"on a {name}, W should be symmetric, but W[{i}, {j}] = {num(W[i, j])} and "
                             f"W[{j}, {i}] = {num(W[j, i])}.")
    rows = W.sum(axis=1)
    assert np.allclose(rows, 1, atol=1e-12), (
        f"on a {name}, every row of W should sum to 1 (W_ii = 1 - the row's edge weights); row "
        f"{int(np.argmax(np.abs(rows - 1)))} sums to {num(rows[np.argmax(np.abs(rows - 1))])}.")
    A = np.zeros((n, n), dtype=bool)
    for i, j in edges:
        A[i, j] = A[j, i] = True
    off = (np.abs(W) > 1e-12) & ~A & ~np.eye(n, dtype=bool)
    if off.any():
        i, j = (int(v) for v in np.argwhere(off)[0])
        raise AssertionError(f"on a {name}, nodes {i} and {j} are not neighbours, so W[{i}, {j}] should be 0, "
                             f"got {num(W[i, j])}.")
    want = np.asarray(want, dtype=float)
    assert np.allclose(W, want, rtol=0, atol=1e-12), (
        f"on a {name}, {worst(W, want, 'W')}: W_ij = 1 / (1 + max(d_i, d_j)) on an edge (the '1 +' keeps weight "
        "on the node itself), W_ii = 1 - the sum of the row's edge weights.")


def ring_matrix(n, w=1 / 3):
    """The n-node ring with weight w on each edge and 1 - 2w on the diagonal (MH weights for w = 1/3)."""
    eye = np.eye(n)
    return (1 - 2 * w) * eye + w * (np.roll(eye, 1, axis=1) + np.roll(eye, -1, axis=1))


def _fractions(rows):
    return np.array([[float(v) for v in r] for r in rows])


#: Star of 6 (node 0 is the hub with 5 leaves): degrees 5 and 1.
STAR6 = _fractions([[F(1, 6)] * 6] + [[F(1, 6)] + [F(5, 6) if j == i else 0 for j in range(1, 6)] for i in range(1, 6)])
#: A kite: the triangle 0-1-2 and the tail 2-3 (degrees 2, 2, 3, 1).
KITE_EDGES = [(0, 1), (0, 2), (1, 2), (2, 3)]
KITE = _fractions([[F(5, 12), F(1, 3), F(1, 4), 0], [F(1, 3), F(5, 12), F(1, 4), 0],
                   [F(1, 4), F(1, 4), F(1, 4), F(1, 4)], [0, 0, F(1, 4), F(3, 4)]])


@question("ex04_1", points=2, title="Build the Metropolis-Hastings mixing matrix", names=("metropolis_weights",))
def ex04_1(ns):
    """metropolis_weights(G) returns W with W_ij = 1/(1 + max(d_i, d_j)) on edges, W_ii = 1 - sum_j W_ij."""
    fn = ns["metropolis_weights"]
    check_mh_on(fn, 8, [(i, (i + 1) % 8) for i in range(8)], "ring of 8", ring_matrix(8))
    check_mh_on(fn, 6, [(0, j) for j in range(1, 6)], "star of 6", STAR6)
    check_mh_on(fn, 4, KITE_EDGES, "triangle with a tail", KITE)


#: The gossip lesson's spectrum(W) hands over lambda_2 and lambda_n: mixing_rate may not call it.
SPECTRUM = [("course_lib.gossip.mixing", "spectrum")]
#: The gossip runtime's exchange (send to every neighbour, receive theirs) and mix (the weighted sum)
#: are the two halves of gossip_step.
GOSSIP_HELPERS = [("course_lib.gossip.workers", "exchange"), ("course_lib.gossip.consensus", "mix")]


# ------------------------------------------------------------------------------ ex04_2
def check_rate(fn, W, want, name, hint=""):
    W = np.asarray(W, dtype=float)
    refuse_helpers(fn, (W,), SPECTRUM, "mixing_rate")
    got = as_number(call_keeping_inputs(fn, (W,), ("W",)), f"mixing_rate of the {name}")
    if abs(got - want) < 1e-9:
        return
    if abs(got - 1) < 1e-9:
        hint = (" 1 is lambda_1, the eigenvalue of the average (the all-ones direction), which mixing keeps as it is: "
                "r is about the error, the other directions, so it starts from the second largest eigenvalue.")
    raise formula_mismatch(f"for the {name}, mixing_rate returned {num(got, 9)}, which is {off_by(got, want)}: r is "
                           "the larger of lambda_2 (the second largest eigenvalue) and |lambda_n| (the magnitude of "
                           f"the smallest), the slowest factor by which a step shrinks the error.{hint}", want)


#: K(3,3) with MH weights 1/4 everywhere: eigenvalues 1, 1/4 (x4), -1/2, so r = |lambda_n| = 1/2.
K33 = np.array([[0.25 if (i < 3) != (j < 3) or i == j else 0.0 for j in range(6)] for i in range(6)])


@question("ex04_2", points=2, title="The rate r = max(lambda_2, |lambda_n|)", names=("mixing_rate",))
def ex04_2(ns):
    """mixing_rate(W) returns r = max(lambda_2, |lambda_n|) for a symmetric mixing matrix W, leaving W unchanged."""
    fn = ns["mixing_rate"]
    check_rate(fn, ring_matrix(10), 0.8726779962499649, "ring of 10 (weights 1/3)")
    check_rate(fn, K33, 0.5, "complete bipartite graph K(3,3) (weights 1/4)",
               " Its smallest eigenvalue is negative and larger in magnitude than lambda_2: the error along it "
               "flips sign every step and shrinks slowest, so r must look at |lambda_n| too.")


# ------------------------------------------------------------------------------ ex04_3
def _gossip_driver(comm, step, W, x0, steps):
    import sys

    seen = watch_helpers(GOSSIP_HELPERS)
    try:
        out = _gossip_steps(comm, step, W, x0, steps)
    finally:
        sys.setprofile(None)
    return out + ((seen[0] if seen else ""),)


def _gossip_steps(comm, step, W, x0, steps):
    i = comm.rank
    weights = {j: float(W[i, j]) for j in sorted(set(comm.neighbors) | {i})}
    x = np.array(x0[i], dtype=float)
    changed = False
    for _ in range(steps):
        before, wbefore = x.copy(), dict(weights)
        out = step(comm, x, weights)
        changed = changed or not np.array_equal(x, before, equal_nan=True) or weights != wbefore
        if not isinstance(out, (np.ndarray, list, tuple)) or np.shape(out) != x.shape:
            return readable(out), changed
        try:
            x = np.array(out, dtype=float)
        except (TypeError, ValueError):
            return readable(out), changed
    return x, changed


@harness
def run_gossip(fn, n, edges, W, x0, steps):
    """``steps`` gossip steps on the graph with the student's step; returns
    (each node's final value, messages sent per node, whether each node's x or weights changed in place,
    the first gossip helper each node called or "")."""
    from course_lib import Cluster

    with Cluster(n, graph=_graph(n, edges), timeout=CHECK_TIMEOUT) as c:
        res = c.run(_gossip_driver, fn, np.asarray(W), np.asarray(x0), steps)
        return ([r[0] for r in res], [int(res.stats.messages_sent(i)) for i in range(n)], [r[1] for r in res],
                [r[2] for r in res])


def check_gossip_step(step, n, edges, W, steps, d, name, seed=4):
    W = np.asarray(W, dtype=float)
    x0 = np.random.default_rng(seed).standard_normal((n, d))
    finals, sent, changed, used = run_gossip(step, n, edges, W, x0, steps)
    for i, u in enumerate(used):
        assert_no_helper("gossip_step", u, f"on node {i}")
    for i, c in enumerate(changed):
        assert not c, (f"on a {name}, node {i}'s gossip_step changed its argument x (or weights) in place: "
                       "return a new array and leave the arguments as they were.")
    want = np.linalg.matrix_power(W, steps) @ x0        # what gossip computes: the matrix iteration
    deg = {i: 0 for i in range(n)}
    for i, j in edges:
        deg[i] += 1
        deg[j] += 1
    for i, got in enumerate(finals):
        got = as_array(got, f"on a {name}, node {i}'s value (what gossip_step returns)", shape=(d,))
        assert np.allclose(got, want[i], rtol=0, atol=1e-12), (
            f"on a {name}, after {steps} steps node {i} should hold row {i} of W^t x0, but its "
            f"{worst(got, want[i], 'x')}: each step returns W_ii x_i + the sum over neighbours j of W_ij x_j, "
            "with x_j received from j itself.")
        assert sent[i] == steps * deg[i], (
            f"on a {name}, node {i} has {deg[i]} neighbours, so in {steps} steps it sends {steps * deg[i]} messages "
            f"(x once to each neighbour per step); it sent {sent[i]}.")


def weighted_matrix(n, edges, rule):
    """A symmetric mixing matrix with weight rule(i, j) on each edge and the rest on the diagonal."""
    W = np.zeros((n, n))
    for i, j in edges:
        W[i, j] = W[j, i] = rule(i, j)
    W[np.diag_indices(n)] = 1 - W.sum(axis=1)
    return W


@question("ex04_3", points=3, title="One gossip step in the worker", names=("gossip_step",))
def ex04_3(ns):
    """gossip_step(comm, x, weights) sends x to every neighbour, receives theirs, returns sum_j W_ij x_j as a
    new array (x and weights stay unchanged)."""
    edges = [(i, (i + 1) % 6) for i in range(6)] + [(0, 3)]          # a ring of 6 with one chord
    W = weighted_matrix(6, edges, lambda i, j: 0.1 + 0.05 * ((i + j) % 3))
    check_gossip_step(ns["gossip_step"], 6, edges, W, steps=5, d=2, name="ring of 6 with a chord")


# ------------------------------------------------------------------------------ ex04_4
def check_iterations(fn, cases):
    """``cases``: [(r, eps, the smallest t with r**t <= eps)]."""
    for r, eps, want in cases:
        t = as_int(fn(r, eps), f"iterations_to_reach({num(r)}, {num(eps)})")
        if t == want:
            continue
        call = f"iterations_to_reach({num(r)}, {num(eps)}) = {t}"
        if t < want:
            raise formula_mismatch(f"{call} is too few: r**{t} = {num(r ** t)} is still above eps; the answer is the "
                                   "smallest t with r**t <= eps.", want)
        raise formula_mismatch(f"{call} is too many: a smaller t already has r**t <= eps (the error reaching eps "
                               "exactly counts as reached); the answer is the smallest such t.", want)


@question("ex04_4", points=2, title="Predict the iterations to reach an error eps", names=("iterations_to_reach",))
def ex04_4(ns):
    """iterations_to_reach(r, eps) is the smallest t with r**t <= eps."""
    check_iterations(ns["iterations_to_reach"], [(0.5, 1e-3, 10), (0.9, 1e-6, 132), (0.99, 0.05, 299),
                                                 (0.25, 0.0625, 2), (0.5, 2.0 ** -29, 29), (0.125, 2.0 ** -21, 7)])
