"""Lesson 04: instructor-only checks (other graphs, other matrices, the measured error)."""
import networkx as nx
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions import as_int, assert_no_helper, call_keeping_inputs, refuse_helpers
from course_lib.questions.ex04 import (
    SPECTRUM,
    check_gossip_step,
    check_iterations,
    check_mh_on,
    check_rate,
    run_gossip,
    run_metropolis,
)
from course_lib.reference.ex04 import iterations_to_reach, metropolis_weights, mixing_rate


def edges_of(G):
    return [(int(i), int(j)) for i, j in G.edges]


@hidden_check("ex04_1", case="other graphs (regular, torus, random, path)")
def more_graphs(ns):
    fn = ns["metropolis_weights"]
    graphs = [("regular", "random 3-regular graph", nx.random_regular_graph(3, 12, seed=1)),
              ("regular", "3x4 torus", nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 4, periodic=True))),
              ("unequal", "random graph", nx.erdos_renyi_graph(15, 0.3, seed=5)),
              ("path", "path of 5", nx.path_graph(5))]
    says = {"regular": "wrong on a regular graph (every node has the same degree): each edge weighs one over "
                       "one plus the degree, the rest of the row goes on the diagonal",
            "unequal": "wrong on a graph whose nodes have different degrees: an edge's weight uses the larger "
                       "degree of its two ends, and the diagonal takes what the row's edges leave",
            "path": "wrong on a path, whose two end nodes have a single neighbour"}
    for kind, name, G in graphs:
        n, edges = G.number_of_nodes(), sorted(tuple(sorted(e)) for e in edges_of(G))
        _, after, n_after = run_metropolis(fn, n, edges)
        with hidden_property("changes the graph it is given (its nodes or edges)"):
            assert after == edges and n_after == n, f"on a {name}, the graph changed"
        with hidden_property(says[kind]):
            check_mh_on(fn, n, edges_of(G), name, metropolis_weights(G))


@hidden_check("ex04_2", case="other mixing matrices, a negative eigenvalue")
def more_matrices(ns):
    fn = ns["mixing_rate"]
    rng = np.random.default_rng(0)
    for k in range(4):
        G = nx.erdos_renyi_graph(12, 0.4, seed=k)
        W = np.zeros((12, 12))
        for i, j in G.edges:
            W[i, j] = W[j, i] = rng.uniform(0.05, 0.3)
        W /= max(1.0, W.sum(axis=1).max())
        W[np.diag_indices(12)] = 1 - W.sum(axis=1)
        with hidden_property("calls the lesson's spectrum helper: compute the eigenvalues yourself"):
            refuse_helpers(fn, (W,), SPECTRUM, "mixing_rate")
        with hidden_property("changes the matrix W it is given"):
            call_keeping_inputs(fn, (W,), ("W",))
        with hidden_property("wrong on random mixing matrices with unequal weights: r is the larger of the "
                             "second largest eigenvalue and the magnitude of the smallest one"):
            check_rate(fn, W, mixing_rate(W), f"random mixing matrix {k + 1} on 12 nodes")
    with hidden_property("wrong when the smallest eigenvalue is negative and larger in magnitude than the second "
                         "largest: r must look at its absolute value"):
        check_rate(fn, np.array([[0.1, 0.9], [0.9, 0.1]]), 0.8, "two nodes with W = [[.1, .9], [.9, .1]]",
                   " Its eigenvalues are 1 and -0.8.")


@hidden_check("ex04_3", case="a graph with unequal degrees")
def other_graphs(ns):
    step = ns["gossip_step"]
    G = nx.lollipop_graph(4, 2)                                        # a clique and a tail: unequal weights
    n, edges, W = G.number_of_nodes(), edges_of(G), metropolis_weights(G)
    x0 = np.random.default_rng(5).standard_normal((n, 3))
    _, _, changed, used = run_gossip(step, n, edges, np.asarray(W, dtype=float), x0, 4)
    with hidden_property("calls a gossip helper of the course library: send, receive and mix yourself"):
        for i, u in enumerate(used):
            assert_no_helper("gossip_step", u, f"on node {i}")
    with hidden_property("changes its argument x or weights in place: return a new array"):
        assert not any(changed), "a node changed x or weights in place"
    with hidden_property("wrong on a graph with unequal degrees: each node returns W_ii x_i plus the sum of "
                         "W_ij x_j over its neighbours, with x_j received from j, one message to each neighbour "
                         "per step"):
        check_gossip_step(step, n, edges, W, steps=4, d=3, name="lollipop graph", seed=5)


@hidden_check("ex04_4", case="other rates and targets, the measured error of a ring")
def more_cases_and_the_measured_error(ns):
    fn = ns["iterations_to_reach"]

    def cases(pairs):
        return [(r, eps, iterations_to_reach(r, eps)) for r, eps in pairs]

    with hidden_property("returns something other than an int (a float, even a whole one, is not an int)"):
        as_int(fn(0.3, 1e-9), "iterations_to_reach's result")
    with hidden_property("wrong when eps is exactly a power of r: r**t equal to eps counts as reached"):
        check_iterations(fn, cases([(0.5, 2.0 ** -k) for k in (1, 3, 17, 31, 40)]
                                   + [(0.75, 0.75 ** 11), (0.75, 0.75 ** 13)]))
    with hidden_property("wrong for other rates and targets, including a rate close to one"):
        check_iterations(fn, cases([(0.3, 1e-9), (0.999, 0.5)]))
    W = np.zeros((16, 16))
    for i in range(16):
        W[i, (i + 1) % 16] = W[(i + 1) % 16, i] = 1 / 3
    W[np.diag_indices(16)] = 1 / 3
    ev, V = np.linalg.eigh(W)
    r, v = ev[-2], V[:, -2]
    for eps in (1e-2, 1e-4):
        t = int(fn(r, eps))
        # From the slowest eigenvector the error shrinks exactly like r^t.
        e = [np.linalg.norm(np.linalg.matrix_power(W, s) @ v) for s in (t - 1, t)]
        with hidden_property("on a ring, the error measured after your number of iterations is still above eps, "
                             "or was below it one iteration earlier"):
            assert e[1] <= eps * (1 + 1e-9) and e[0] > eps, (
                f"on a ring of 16, eps = {eps:g}: after your {t} iterations the measured error is {e[1]:.3g} "
                f"(and {e[0]:.3g} one step earlier); the answer is the first t with r^t <= eps.")
