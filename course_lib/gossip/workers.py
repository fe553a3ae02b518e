"""What each node process runs. Node i is rank i; it only has Pipes to its graph neighbours.

Gossip steps with :func:`gossip_step` (question ex04_3, from :mod:`course_lib.reference.ex04`);
D-PSGD with :func:`exchange` and :func:`course_lib.gossip.consensus.mix`, so that it can follow
:func:`course_lib.gossip.topologies.exchange_order`. Both sum in increasing rank order, so their
results equal the single-process references bit for bit.
"""
from __future__ import annotations

import time

import numpy as np

from course_lib.reference.ex04 import gossip_step  # question ex04_3

from .consensus import mix
from .dpsgd import minibatch_gradient, node_rng

__all__ = ["exchange", "node_weights", "gossip_step", "gossip_worker", "pairwise_worker",
           "dpsgd_worker", "centralised_sgd_worker", "emulate_compute"]

# Above this size a send goes through isend, so that two neighbours sending big arrays to
# each other at the same time cannot both block on full Pipes.
_BIG = 16 * 1024


def exchange(comm, x, tag: int = 0, order=None) -> dict:
    """Send ``x`` to every neighbour, receive theirs. Returns {rank: value}, self included.

    ``order``: the neighbours in the order to send to and receive from (default
    ``comm.neighbors``); :func:`course_lib.gossip.topologies.exchange_order` gives one in
    which no node has two models arriving at once."""
    nbrs = comm.neighbors if order is None else list(order)
    if sorted(nbrs) != sorted(comm.neighbors):
        raise ValueError(f"node {comm.rank}: order {nbrs} is not its neighbours {comm.neighbors}")
    big = getattr(x, "nbytes", 0) > _BIG
    reqs = []
    for j in nbrs:
        if big:
            reqs.append(comm.isend(x, j, tag=tag))
        else:
            comm.send(x, j, tag=tag)
    vals = {comm.rank: x}
    for j in nbrs:
        vals[j] = comm.recv(source=j, tag=tag)
    for r in reqs:
        r.wait()
    return vals


def node_weights(comm, W) -> dict:
    """Row ``comm.rank`` of W over itself and its neighbours, checked against the Pipes."""
    W = np.asarray(W, dtype=float)
    i, n = comm.rank, comm.size
    if W.shape != (n, n):
        raise ValueError(f"W has shape {W.shape} but the cluster has {n} nodes")
    allowed = set(comm.neighbors) | {i}
    extra = [j for j in range(n) if W[i, j] != 0 and j not in allowed]
    if extra:
        raise ValueError(f"node {i}: W[{i}, {extra[0]}] = {W[i, extra[0]]} but {extra[0]} is not a "
                         f"neighbour (neighbours: {comm.neighbors})")
    return {j: float(W[i, j]) for j in sorted(allowed)}


def gossip_worker(comm, W, x0, steps: int):
    """Run ``steps`` synchronous gossip steps from x0[rank]; return this node's trajectory."""
    weights = node_weights(comm, W)
    x = np.array(np.asarray(x0, dtype=float)[comm.rank])
    traj = np.empty((steps + 1,) + x.shape)
    traj[0] = x
    for t in range(steps):
        x = gossip_step(comm, x, weights)
        traj[t + 1] = x
    return traj


def pairwise_worker(comm, x0, schedule):
    """Randomized pairwise gossip (Boyd et al. 2006) following a shared schedule.

    At each tick k with ``schedule[k] = (a, b)``, nodes a and b swap values and both keep
    0.5 * (x_a + x_b). A node acts only on its own ticks, in schedule order; pairs that do not
    touch run at the same time. Returns (ticks where this node changed, values after them).
    """
    schedule = np.asarray(schedule)
    i = comm.rank
    x = np.array(np.asarray(x0, dtype=float)[i])
    mine = np.flatnonzero(((schedule[:, 0] == i) | (schedule[:, 1] == i)) & (schedule[:, 0] != schedule[:, 1]))
    values = np.empty((mine.size,) + x.shape)
    for m, k in enumerate(mine):
        a, b = int(schedule[k, 0]), int(schedule[k, 1])
        other = b if a == i else a
        xo = comm.sendrecv(x, dest=other, source=other)
        with comm.compute("average"):
            x = 0.5 * (x + xo) if i == a else 0.5 * (xo + x)   # always x_lo + x_hi
        values[m] = x
    return mine, values


def emulate_compute(started: float, compute_seconds: float) -> None:
    """Sleep until ``compute_seconds`` have passed since ``started`` (a ``time.perf_counter()``).

    Emulated computation: the gradients of these lessons take tens of microseconds, too short to
    see on a timeline beside messages; padding each to ``compute_seconds`` makes the phase as long
    as a larger model's would be, without using a core (16 sleeping nodes share 2 cores freely).
    The result is the same: only the time changes."""
    left = compute_seconds - (time.perf_counter() - started)
    if left > 0:
        time.sleep(left)


def dpsgd_worker(comm, X, y, shards, W, steps: int, lr: float, batch: int, seed: int = 0, order=None,
                 compute_seconds: float = 0.0):
    """D-PSGD (Lian et al. 2017) at node ``rank``; X, y are SharedArrays (zero-copy views).

    Each step: gradient at the current local model on a minibatch of the local shard,
    exchange models with the neighbours (in ``order[rank]``, if given), x_i <- sum_j W_ij x_j - lr * g_i.
    ``compute_seconds > 0`` pads each gradient to that long (:func:`emulate_compute`).
    Returns the trajectory of the local model, shape (steps+1, d).
    """
    X, y = np.asarray(X), np.asarray(y)
    weights = node_weights(comm, W)
    shard = shards[comm.rank]
    rng = node_rng(seed, comm.rank)
    x = np.zeros(X.shape[1])
    traj = np.empty((steps + 1, x.size))
    traj[0] = x
    for t in range(steps):
        with comm.compute("gradient"):
            started = time.perf_counter()
            g = minibatch_gradient(X, y, shard, x, batch, rng)
            emulate_compute(started, compute_seconds)
        values = exchange(comm, x, order=None if order is None else order[comm.rank])
        with comm.compute("mix"):
            x = mix(weights, values) - lr * g
        traj[t + 1] = x
    return traj


def centralised_sgd_worker(comm, X, y, shards, steps: int, lr: float, batch: int, seed: int = 0,
                           asynchronous: bool = False, compute_seconds: float = 0.0):
    """A server (rank 0) and n workers (ranks 1..n) on a star: lesson 01 / lesson 03 shape.

    Synchronous (lesson 01, MapReduce): the server sends w to every worker, gathers all n
    minibatch gradients, averages them in rank order and steps. Asynchronous (lesson 03,
    parameter server): the server applies each gradient as it arrives and sends the new w
    back to that worker only; it stops after ``steps * n`` updates. Worker k uses shard k-1.
    ``compute_seconds > 0`` pads each worker's gradient to that long (:func:`emulate_compute`).
    The server returns the trajectory of w, one row per n applied gradients.
    """
    X, y = np.asarray(X), np.asarray(y)
    if comm.rank != 0:
        return _gradient_worker(comm, X, y, shards[comm.rank - 1], batch, node_rng(seed, comm.rank - 1),
                                compute_seconds)
    serve = _serve_asynchronously if asynchronous else _serve_synchronously
    traj = serve(comm, np.zeros(X.shape[1]), steps, lr)
    for k in range(1, comm.size):  # everyone gets a last message: None means stop
        comm.send(None, k)
    return np.array(traj)


def _serve_synchronously(comm, w, steps: int, lr: float) -> list:
    """w <- w - lr * (g_1 + ... + g_n) / n, the gradients of w added in rank order; w after each step."""
    n = comm.size - 1
    traj = [w.copy()]
    for _ in range(steps):
        for k in range(1, n + 1):
            comm.send(w, k)
        gs = [comm.recv(source=k) for k in range(1, n + 1)]
        with comm.compute("update"):
            acc = gs[0].copy()
            for g in gs[1:]:
                acc = acc + g
            w = w - lr * acc / n
        traj.append(w.copy())
    return traj


def _serve_asynchronously(comm, w, steps: int, lr: float) -> list:
    """w <- w - lr * g / n for each gradient as it arrives, ``steps * n`` of them; w after every n."""
    n = comm.size - 1
    total = steps * n
    traj = [w.copy()]
    for k in range(1, n + 1):
        comm.send(w, k)
    for u in range(1, total + 1):
        src, g = comm.recv_any()
        with comm.compute("update"):
            w = w - lr * g / n          # same step per sample as the sync run
        if u % n == 0:
            traj.append(w.copy())
        if u <= total - n:              # enough work left for this worker
            comm.send(w, src)
    return traj


def _gradient_worker(comm, X, y, shard, batch: int, rng, compute_seconds: float = 0.0) -> None:
    """Answer every w from the server with a minibatch gradient on ``shard``, until None."""
    while True:
        w = comm.recv(source=0)
        if w is None:
            return None
        with comm.compute("gradient"):
            started = time.perf_counter()
            g = minibatch_gradient(X, y, shard, w, batch, rng)
            emulate_compute(started, compute_seconds)
        comm.send(g, 0)
