"""Lesson 04, gossip: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex04_1  metropolis_weights(G)          Metropolis-Hastings mixing matrix from the degrees
ex04_2  mixing_rate(W)                 r = max(lambda_2, |lambda_n|)
ex04_3  gossip_step(comm, x, weights)  one synchronous gossip step inside a node process
ex04_4  iterations_to_reach(r, eps)    smallest t with r**t <= eps

The gossip runtime (:mod:`course_lib.gossip`) builds its default mixing matrix with
:func:`metropolis_weights`, reads r with :func:`mixing_rate`, and its node processes step with
:func:`gossip_step`, which sums in increasing rank order like the single-process references
of :mod:`course_lib.gossip.consensus`, so a run equals them to the last bit.
"""
from __future__ import annotations

import math

import numpy as np

# Above this size a node sends through isend, so that two neighbours sending big arrays to
# each other at the same time cannot both block on full Pipes.
_BIG = 16 * 1024


def metropolis_weights(G):
    """W_ij = 1 / (1 + max(d_i, d_j)) on the edges of G (nodes 0..n-1), W_ii = 1 - sum_j W_ij.

    The diagonal is summed over the sorted neighbours, a fixed order (reproducible to the bit)."""
    n = G.number_of_nodes()
    deg = [G.degree(i) for i in range(n)]
    W = np.zeros((n, n))
    for i, j in G.edges:
        W[i, j] = W[j, i] = 1.0 / (1.0 + max(deg[i], deg[j]))
    for i in range(n):
        W[i, i] = 1.0 - sum(W[i, j] for j in sorted(G.neighbors(i)))
    return W


def mixing_rate(W):
    """r = max(lambda_2, |lambda_n|) of the symmetric matrix W (eigvalsh sorts increasingly).

    Not lambda_2 alone: a very negative lambda_n (bipartite graphs) shrinks the error slowest."""
    ev = np.linalg.eigvalsh(np.asarray(W, dtype=float))
    return float(max(ev[-2], abs(ev[0])))


def gossip_step(comm, x, weights):
    """x_i <- sum_j W_ij x_j over i and its neighbours; ``weights`` = {j: W_ij}.

    Send x to every neighbour first (nobody waits before sending, so nobody deadlocks), then
    receive from each neighbour by source, and sum in increasing j."""
    nbrs = comm.neighbors
    big = getattr(x, "nbytes", 0) > _BIG
    pending = []
    for j in nbrs:
        if big:
            pending.append(comm.isend(x, j))
        else:
            comm.send(x, j)
    values = {comm.rank: x}
    for j in nbrs:
        values[j] = comm.recv(source=j)
    for req in pending:
        req.wait()
    with comm.compute("mix"):
        total = None
        for j in sorted(weights):
            term = weights[j] * values[j]
            total = term if total is None else total + term
        return total


def iterations_to_reach(r, eps):
    """Smallest integer t with r**t <= eps, for 0 < r < 1 and 0 < eps < 1.

    ceil(log eps / log r), then settled on the powers themselves: the logs are rounded, and at
    an exact power (eps = r**k) the quotient can come out a hair above k."""
    t = math.ceil(math.log(eps) / math.log(r))
    while t > 0 and r ** (t - 1) <= eps:
        t -= 1
    while r ** t > eps:
        t += 1
    return t
