"""Lesson 04's gossip and D-PSGD on any backend, Pipes/links only along a ring's edges.

    mpiexec -n 4 python -m course_lib.run examples/gossip.py
    python -m course_lib.run --local 4 examples/gossip.py
"""
import networkx as nx
import numpy as np

from course_lib.gossip.dpsgd import make_least_squares
from course_lib.gossip.mixing import metropolis_hastings
from course_lib.gossip.workers import dpsgd_worker, gossip_worker


def graph(n):
    """The topology: the runner builds links only along its edges."""
    return nx.cycle_graph(n)


def main(comm):
    G = graph(comm.size)
    W = metropolis_hastings(G)
    x0 = np.arange(comm.size, dtype=float)
    consensus = gossip_worker(comm, W, x0, steps=20)
    problem = make_least_squares(n_samples=400, dim=5, n_nodes=comm.size, seed=1)
    models = dpsgd_worker(comm, problem.X, problem.y, problem.shards, W, steps=25, lr=0.2, batch=8, seed=0)
    return {"consensus": consensus, "dpsgd": models}
