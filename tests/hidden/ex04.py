"""Instructor-only checks of lesson 04."""
import math

import networkx as nx
import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex04 import check_gossip_step, check_mh_on


@hidden_check("ex04_1")
def ex04_1_more_graphs(ns):
    fn = ns["metropolis_weights"]
    check_mh_on(fn, nx.random_regular_graph(3, 12, seed=1), "random 3-regular graph")
    check_mh_on(fn, nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 4, periodic=True)), "3x4 torus")
    G = nx.erdos_renyi_graph(15, 0.3, seed=5)
    check_mh_on(fn, G, "random graph")
    before = sorted(G.edges)
    fn(G)
    assert sorted(G.edges) == before, "metropolis_weights must not change the graph it is given"


@hidden_check("ex04_2")
def ex04_2_more_matrices(ns):
    fn = ns["mixing_rate"]
    rng = np.random.default_rng(0)
    for k in range(5):
        G = nx.erdos_renyi_graph(12, 0.4, seed=k)
        W = np.zeros((12, 12))
        for i, j in G.edges:
            W[i, j] = W[j, i] = rng.uniform(0.05, 0.3)
        W /= max(1.0, W.sum(axis=1).max())
        W[np.diag_indices(12)] = 1 - W.sum(axis=1)
        ev = np.linalg.eigvalsh(W)
        assert abs(float(fn(W.copy())) - max(ev[-2], abs(ev[0]))) < 1e-9, "wrong rate on a random mixing matrix"
    W = np.array([[0.1, 0.9], [0.9, 0.1]])
    assert abs(float(fn(W)) - 0.8) < 1e-9, "two nodes with W = [[.1,.9],[.9,.1]]: eigenvalues 1 and -0.8, r = 0.8"


@hidden_check("ex04_3")
def ex04_3_other_graphs(ns):
    step = ns["gossip_step"]
    # A hub with several neighbours, vector values (start methods are covered by the visible check).
    check_gossip_step(step, nx.star_graph(4), steps=4, d=3, name="star of 5")


@hidden_check("ex04_4")
def ex04_4_matches_measurement(ns):
    fn = ns["iterations_to_reach"]
    G = nx.cycle_graph(16)
    W = np.zeros((16, 16))
    for i, j in G.edges:
        W[i, j] = W[j, i] = 1 / 3
    W[np.diag_indices(16)] = 1 / 3
    ev, V = np.linalg.eigh(W)
    r, v = ev[-2], V[:, -2]
    for eps in (1e-2, 1e-4):
        t = int(fn(r, eps))
        # From the slowest eigenvector the error shrinks exactly like r^t.
        e = [np.linalg.norm(np.linalg.matrix_power(W, s) @ v) for s in (t - 1, t)]
        assert e[1] <= eps * (1 + 1e-9) and e[0] > eps, (
            f"ring of 16, eps={eps}: after your {t} iterations the measured error is {e[1]:.3g} "
            f"(and {e[0]:.3g} one step earlier); predict the first t with r^t <= eps")
