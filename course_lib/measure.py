"""Measure the communication cost model: time = latency + bytes / bandwidth.

A ping-pong between two ranks: rank 0 sends n bytes, rank 1 sends them back; half the
round trip is the one-way time. Fitting a line through (bytes, time) over many sizes
gives the intercept (latency, seconds) and the slope (1 / bandwidth, seconds per byte).
"""
from __future__ import annotations

import numpy as np

# The fit of lesson 00 (question ex00_2) lives with the reference answers; kept here under its old name.
from course_lib.reference.ex00 import fit_latency_bandwidth  # noqa: F401

DEFAULT_SIZES = tuple(int(s) for s in np.logspace(1, 7, 13).round())


def _pingpong(comm, sizes, repeats):
    if comm.rank > 1:
        return None
    peer = 1 - comm.rank
    out = []
    for n in sizes:
        buf = np.zeros(n, dtype=np.uint8)
        best = float("inf")
        for _ in range(repeats + 1):  # the first round trip warms up buffers
            comm.barrier() if comm.size == 2 else None
            if comm.rank == 0:
                start = comm.now()
                comm.send(buf, peer)
                buf = comm.recv(source=peer)
                best = min(best, (comm.now() - start) / 2)
            else:
                buf = comm.recv(source=peer)
                comm.send(buf, peer)
        out.append(best)
    return out


def pingpong(cluster, sizes=DEFAULT_SIZES, repeats: int = 5, network=None) -> dict:
    """One-way message time (best of ``repeats``) for each size in bytes, ranks 0 and 1.

    Returns ``{"bytes", "seconds", "stats"}``; lesson 00 fits latency and bandwidth to it,
    :func:`course_lib.costs.measure` the alpha and beta of the collectives' cost model."""
    sizes = [int(s) for s in sizes]
    if cluster.n_workers < 2:
        raise ValueError("a ping-pong needs a cluster of at least 2 workers")
    if any(s < 0 for s in sizes):
        raise ValueError("message sizes must be >= 0 bytes")
    kwargs = {} if network is None else {"network": network}
    res = cluster.run(_pingpong, sizes, repeats, **kwargs)
    return {"bytes": np.array(sizes, dtype=float), "seconds": np.array(res[0]), "stats": res.stats}
