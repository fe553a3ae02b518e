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


def metropolis_weights(G):
    """Metropolis-Hastings mixing matrix of the graph G (nodes 0..n-1), as an (n, n) array:

    W_ij = 1 / (1 + max(d_i, d_j)) on the edges of G, W_ii = 1 - sum_j W_ij, 0 elsewhere."""
    n = G.number_of_nodes()
    deg = [G.degree(i) for i in range(n)]
    W = np.zeros((n, n))
    for i, j in G.edges:
        # the '1 +' keeps weight on the node itself, so every row sums to 1 with W_ii >= 0
        W[i, j] = W[j, i] = 1.0 / (1.0 + max(deg[i], deg[j]))
    for i in range(n):
        # summed over the sorted neighbours, a fixed order: reproducible to the bit
        W[i, i] = 1.0 - sum(W[i, j] for j in sorted(G.neighbors(i)))
    return W


def mixing_rate(W):
    """r = max(lambda_2, |lambda_n|) of the symmetric mixing matrix W."""
    # eigvalsh sorts increasingly: ev[-1] = 1, ev[-2] = lambda_2, ev[0] = lambda_n.
    # Not lambda_2 alone: a very negative lambda_n (bipartite graphs) shrinks the error slowest.
    ev = np.linalg.eigvalsh(np.asarray(W, dtype=float))
    return float(max(ev[-2], abs(ev[0])))


def gossip_step(comm, x, weights):
    """One synchronous gossip step at node comm.rank: x_i <- sum_j W_ij x_j over i and its neighbours,
    ``weights`` = {j: W_ij} for j = comm.rank and each neighbour."""
    # Send x to every neighbour first, then receive: nobody waits before sending, so nobody
    # deadlocks. Above 16 KiB a blocking send could wait for its neighbour to read, while that
    # neighbour is itself blocked sending to us: isend lets both sends go on at once.
    big = getattr(x, "nbytes", 0) > 16 * 1024
    pending = []
    for j in comm.neighbors:
        if big:
            pending.append(comm.isend(x, j))
        else:
            comm.send(x, j)
    values = {comm.rank: x}
    for j in comm.neighbors:
        values[j] = comm.recv(source=j)    # by source: the sum pairs each W_ij with x_j
    for req in pending:
        req.wait()
    # summed in increasing j, the order of the matrix iteration W @ x: a run equals it to the last bit
    with comm.compute("mix"):   # the timeline shows the sum as this node's computation
        return sum(weights[j] * values[j] for j in sorted(weights))


def iterations_to_reach(r, eps):
    """Smallest integer t with r**t <= eps, for 0 < r < 1 and 0 < eps < 1."""
    t = math.ceil(math.log(eps) / math.log(r))
    # The logs are rounded, and at an exact power (eps = r**k) the quotient can come out a hair
    # above k: settle t on the powers themselves.
    while t > 0 and r ** (t - 1) <= eps:
        t -= 1
    while r ** t > eps:
        t += 1
    return t
