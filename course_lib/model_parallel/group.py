"""Run a p-worker program on the first p workers of a bigger cluster.

Starting worker processes is the slow part of a run (seconds under ``spawn``), so a
notebook keeps one cluster and runs p = 1, 2, 3, ... on its first p ranks: the other
ranks return at once and send nothing, so traffic and timelines are those of p workers.
"""
from __future__ import annotations

import numpy as np

__all__ = ["FirstRanks", "run_on"]


class FirstRanks:
    """Ranks ``0..size-1`` of ``comm`` seen as a communicator of their own.

    Point-to-point (``send``, ``isend``, ``recv``, ``sendrecv``, ``compute``, ``stats``, ``now``), and the
    one collective this lesson's layers use, ``allreduce(x, algorithm="ring")``: ranks are the
    same numbers, so messages need no translation.
    """

    def __init__(self, comm, size: int):
        if not 1 <= size <= comm.size:
            raise ValueError(f"cannot use {size} of {comm.size} workers")
        self._comm, self.size, self.rank = comm, int(size), comm.rank

    def _peer(self, r):
        if not 0 <= r < self.size:
            raise ValueError(f"rank {r} is outside this group of {self.size}")
        return r

    def send(self, obj, dest, tag=0):
        return self._comm.send(obj, self._peer(dest), tag=tag)

    def isend(self, obj, dest, tag=0):
        return self._comm.isend(obj, self._peer(dest), tag=tag)

    def recv(self, source, tag=-1):
        return self._comm.recv(source=self._peer(source), tag=tag)

    def sendrecv(self, sendobj, dest, source, sendtag=0, recvtag=-1):
        return self._comm.sendrecv(sendobj, dest=self._peer(dest), sendtag=sendtag,
                                   source=self._peer(source), recvtag=recvtag)

    def compute(self, label="compute"):
        return self._comm.compute(label)

    def now(self):
        return self._comm.now()

    @property
    def stats(self):
        return self._comm.stats

    def allreduce(self, sendobj, algorithm="ring"):
        """Sum over the group, on every rank: the ring of :mod:`.exchange` (reduce-scatter, then
        allgather), which moves the same bytes as the runtime's ``comm.allreduce(x, algorithm="ring")``."""
        if algorithm != "ring":
            raise ValueError(f"a group of the first ranks only has the ring allreduce, not {algorithm!r}")
        from .exchange import ring_allgather, ring_reduce_scatter

        x = np.asarray(sendobj)
        if self.size == 1:
            return x.copy()
        return ring_allgather(self, ring_reduce_scatter(self, x.reshape(-1)), axis=0).reshape(x.shape)


def _on_first(comm, p, fn, args, kwargs):
    if comm.rank >= p:
        return None
    return fn(FirstRanks(comm, p), *args, **kwargs)


def run_on(cluster, p: int, fn, *args, **kwargs):
    """``cluster.run(fn, ...)`` on ranks ``0..p-1`` only; returns the RunResult cut to p entries.

    Its ``stats`` and ``timeline`` are the whole cluster's, where the other ranks did nothing.
    """
    n = len(cluster.run(_noop)) if not hasattr(cluster, "n_workers") else cluster.n_workers
    if not 1 <= int(p) <= n:
        raise ValueError(f"p must be between 1 and the cluster's {n} workers, got {p}")
    res = cluster.run(_on_first, int(p), fn, args, kwargs)
    del res[int(p):]
    return res


def _noop(comm):
    return None
