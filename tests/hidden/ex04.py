"""Lesson 04: instructor-only checks (other graphs, other matrices, the measured error)."""
import networkx as nx
import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex04 import check_gossip_step, check_iterations, check_mh_on, check_rate
from course_lib.reference.ex04 import iterations_to_reach, metropolis_weights, mixing_rate


def edges_of(G):
    return [(int(i), int(j)) for i, j in G.edges]


@hidden_check("ex04_1", case="other graphs (regular, torus, random, path)")
def more_graphs(ns):
    fn = ns["metropolis_weights"]
    graphs = [("random 3-regular graph", nx.random_regular_graph(3, 12, seed=1)),
              ("3x4 torus", nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 4, periodic=True))),
              ("random graph", nx.erdos_renyi_graph(15, 0.3, seed=5)),
              ("path of 5", nx.path_graph(5))]
    for name, G in graphs:
        check_mh_on(fn, G.number_of_nodes(), edges_of(G), name, metropolis_weights(G))


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
        check_rate(fn, W, mixing_rate(W), f"random mixing matrix {k + 1} on 12 nodes")
    check_rate(fn, np.array([[0.1, 0.9], [0.9, 0.1]]), 0.8, "two nodes with W = [[.1, .9], [.9, .1]]",
               " Its eigenvalues are 1 and -0.8.")


@hidden_check("ex04_3", case="a graph with unequal degrees")
def other_graphs(ns):
    step = ns["gossip_step"]
    G = nx.lollipop_graph(4, 2)                                        # a clique and a tail: unequal weights
    check_gossip_step(step, G.number_of_nodes(), edges_of(G), metropolis_weights(G), steps=4, d=3,
                      name="lollipop graph", seed=5)


@hidden_check("ex04_4", case="other rates and targets, the measured error of a ring")
def more_cases_and_the_measured_error(ns):
    fn = ns["iterations_to_reach"]
    cases = [(0.5, 2.0 ** -k) for k in (1, 3, 17, 40)] + [(0.75, 0.75 ** 11), (0.3, 1e-9), (0.999, 0.5)]
    check_iterations(fn, [(r, eps, iterations_to_reach(r, eps)) for r, eps in cases])
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
        assert e[1] <= eps * (1 + 1e-9) and e[0] > eps, (
            f"on a ring of 16, eps = {eps:g}: after your {t} iterations the measured error is {e[1]:.3g} "
            f"(and {e[0]:.3g} one step earlier); the answer is the first t with r^t <= eps.")
