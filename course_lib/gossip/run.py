"""Drivers: start one process per node on ``Cluster(n, graph=G)`` and collect the results.

Each returns a :class:`GossipRun` with the trajectory (steps+1, n[, d]) and the runtime's
``RunResult`` (stats: bytes per link; timeline; wall time). Pass ``cluster=`` to reuse a
running cluster (its graph must contain G's edges), or let the driver start and stop one.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .consensus import consensus_error, pairwise_schedule
from .dpsgd import LeastSquares
from .mixing import check_mixing_matrix, metropolis_hastings
from .topologies import exchange_order, validate_graph, warn_if_disconnected
from .workers import centralised_sgd_worker, dpsgd_worker, gossip_worker, pairwise_worker

__all__ = ["GossipRun", "run_gossip", "run_pairwise", "run_dpsgd", "run_centralised_sgd",
           "busiest_node_bytes"]


@dataclass
class GossipRun:
    """A trajectory measured on real processes, and the run that produced it."""

    traj: np.ndarray          # (steps+1, n[, d]) values of every node after every step
    run: object               # the runtime's RunResult (stats, timeline, wall_time), as in GDResult and PSResult

    @property
    def errors(self) -> np.ndarray:
        """The consensus error of every step (:func:`consensus_error`)."""
        return consensus_error(self.traj)

    @property
    def stats(self):
        return self.run.stats

    @property
    def wall_time(self) -> float:
        return self.run.wall_time

    @property
    def result(self):
        """:attr:`run`, under the name the lesson 04 notebook uses."""
        return self.run


def busiest_node_bytes(stats) -> int:
    """max over nodes of bytes sent + bytes received (payload), from a run's Stats."""
    b = np.asarray(stats.bytes)
    return int((b.sum(axis=0) + b.sum(axis=1)).max())


@contextmanager
def _cluster(n, G, cluster, start_method, **kw):
    if cluster is not None:
        if cluster_size(cluster) != n:
            raise ValueError(f"the cluster has {cluster_size(cluster)} workers but the graph {n} nodes")
        _check_same_edges(cluster, G)
        yield cluster
        return
    from course_lib import Cluster
    with Cluster(n, start_method=start_method, graph=G, **kw) as c:
        yield c


def _edges(G):
    return {tuple(sorted(e)) for e in G.edges}


def _check_same_edges(cluster, G):
    """The workers talk to every Pipe they have, so the cluster's graph must be G itself."""
    import networkx as nx

    H = getattr(cluster, "graph", None)
    if H is None:   # full mesh
        H = nx.complete_graph(cluster_size(cluster))
    if _edges(H) != _edges(G):
        raise ValueError("the cluster's graph differs from G: start it with Cluster(n, graph=G)")


def cluster_size(cluster):
    for name in ("n_workers", "size", "n"):
        v = getattr(cluster, name, None)
        if isinstance(v, int):
            return v
    return len(cluster)


def run_gossip(G, x0, steps: int, W=None, *, cluster=None, start_method=None, **run_kw) -> GossipRun:
    """Synchronous gossip x <- W x for ``steps`` steps, one process per node.

    ``W`` defaults to the Metropolis-Hastings matrix of G. A disconnected G gets a
    DisconnectedGraphWarning naming its components.
    """
    n = validate_graph(G)
    warn_if_disconnected(G, stacklevel=2)
    W = metropolis_hastings(G, warn=False) if W is None else check_mixing_matrix(W, G)
    x0 = np.asarray(x0, dtype=float)
    if x0.shape[0] != n:
        raise ValueError(f"x0 needs one row per node: {x0.shape[0]} rows for {n} nodes")
    with _cluster(n, G, cluster, start_method) as c:
        res = c.run(gossip_worker, W, x0, steps, **run_kw)
    return GossipRun(np.stack(list(res), axis=1), res)


def run_pairwise(G, x0, ticks: int, seed: int = 0, *, cluster=None, start_method=None,
                 **run_kw) -> GossipRun:
    """Randomized pairwise gossip for ``ticks`` ticks; trajectory (ticks+1, n[, d])."""
    n = validate_graph(G)
    warn_if_disconnected(G, stacklevel=2)
    x0 = np.asarray(x0, dtype=float)
    schedule = pairwise_schedule(G, ticks, seed)
    with _cluster(n, G, cluster, start_method) as c:
        res = c.run(pairwise_worker, x0, schedule, **run_kw)
    traj = np.empty((ticks + 1,) + x0.shape)
    traj[:] = x0
    for i, (mine, values) in enumerate(res):
        # Node i holds values[m] from tick mine[m] + 1 until its next event.
        for m, k in enumerate(mine):
            traj[k + 1:, i] = values[m]
    return GossipRun(traj, res)


def _shared(c, a):
    return c.share(np.ascontiguousarray(a))


def run_dpsgd(G, problem: LeastSquares, steps: int, lr: float, batch: int, seed: int = 0, W=None, *,
              cluster=None, start_method=None, compute_seconds: float = 0.0, **run_kw) -> GossipRun:
    """D-PSGD on ``problem`` (shard i on node i); trajectory of every local model (steps+1, n, d).

    The nodes exchange models in the rounds of :func:`exchange_order` (no incast).
    ``compute_seconds > 0``: every gradient is padded to that long (emulated computation; the
    models are the same)."""
    n = validate_graph(G)
    if problem.n_nodes != n:
        raise ValueError(f"problem has {problem.n_nodes} shards for {n} nodes")
    warn_if_disconnected(G, stacklevel=2)
    W = metropolis_hastings(G, warn=False) if W is None else check_mixing_matrix(W, G)
    with _cluster(n, G, cluster, start_method) as c:
        X, y = _shared(c, problem.X), _shared(c, problem.y)
        res = c.run(dpsgd_worker, X, y, problem.shards, W, steps, lr, batch, seed, exchange_order(G),
                    compute_seconds, **run_kw)
    return GossipRun(np.stack(list(res), axis=1), res)


def run_centralised_sgd(problem: LeastSquares, steps: int, lr: float, batch: int, seed: int = 0,
                        asynchronous: bool = False, *, cluster=None, start_method=None, compute_seconds: float = 0.0,
                        **run_kw) -> GossipRun:
    """Server + n workers on a star of n+1 processes (sync: lesson 01; async: lesson 03).

    ``compute_seconds > 0``: every worker's gradient is padded to that long (emulated computation).

    The trajectory is the server's w, shape (steps+1, d). A given ``cluster`` must be
    ``Cluster(n + 1, graph=nx.star_graph(n))``.
    """
    import networkx as nx

    n = problem.n_nodes
    with _cluster(n + 1, nx.star_graph(n), cluster, start_method) as c:
        X, y = _shared(c, problem.X), _shared(c, problem.y)
        res = c.run(centralised_sgd_worker, X, y, problem.shards, steps, lr, batch, seed,
                    asynchronous, compute_seconds, **run_kw)
    return GossipRun(res[0], res)
