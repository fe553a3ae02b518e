"""A tiny in-process simulator: p threads and unbounded queues play the ranks.

It exists only so the algorithms can be unit-tested in milliseconds; the course runs
them on real processes. Bytes are counted the way the runtime counts them (an ndarray:
``nbytes``; anything else: its pickle plus out-of-band buffers).

>>> res, nbytes, nmsgs = simulate(4, lambda t: allgather.ring(t, t.rank))
"""
from __future__ import annotations

import pickle
import queue
import threading

import numpy as np


def payload_bytes(obj) -> int:
    if type(obj) is np.ndarray and not obj.dtype.hasobject:
        return obj.nbytes
    bufs = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return len(body) + sum(b.raw().nbytes for b in bufs)


class RankFailed(Exception):
    """Another rank raised: this rank's wait stops (the runtime's Cluster does the same)."""


class SimTransport:
    POLL = 0.02  # seconds between looks at the abort flag while a receive waits

    def __init__(self, rank, size, queues, nbytes, nmsgs, timeout, abort=None):
        self.rank, self.size = rank, size
        self._q, self._bytes, self._msgs, self._timeout = queues, nbytes, nmsgs, timeout
        self._abort = abort if abort is not None else threading.Event()

    def send(self, obj, dest):
        if not 0 <= dest < self.size or dest == self.rank:
            raise ValueError(f"rank {self.rank}: bad destination {dest}")
        if type(obj) is np.ndarray:
            obj = obj.copy()  # a real message is a copy
        self._bytes[self.rank, dest] += payload_bytes(obj)
        self._msgs[self.rank, dest] += 1
        self._q[self.rank][dest].put(obj)

    def recv(self, source):
        if not 0 <= source < self.size or source == self.rank:
            raise ValueError(f"rank {self.rank}: bad source {source}")
        waited = 0.0
        while waited < self._timeout:  # in slices, so that a failure elsewhere ends the wait at once
            if self._abort.is_set():
                raise RankFailed(f"rank {self.rank} stopped waiting for rank {source}: another rank failed")
            try:
                return self._q[source][self.rank].get(timeout=self.POLL)
            except queue.Empty:
                waited += self.POLL
        raise TimeoutError(f"rank {self.rank} waited {self._timeout}s for rank {source}: deadlock?")

    def sendrecv(self, obj, dest, source):
        self.send(obj, dest)
        return self.recv(source)


def simulate(p, fn, *args, timeout=10.0):
    """Run ``fn(t, *args)`` on p threads; return (results, bytes[p, p], messages[p, p])."""
    queues = [[queue.Queue() for _ in range(p)] for _ in range(p)]
    nbytes = np.zeros((p, p), np.int64)
    nmsgs = np.zeros((p, p), np.int64)
    results, errors = [None] * p, [None] * p
    abort = threading.Event()

    def body(r):
        try:
            results[r] = fn(SimTransport(r, p, queues, nbytes, nmsgs, timeout, abort), *args)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[r] = e
            abort.set()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(p)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # the cause, not the ranks that stopped because of it
    for r, e in sorted(enumerate(errors), key=lambda re_: isinstance(re_[1], RankFailed)):
        if e is not None:
            raise RuntimeError(f"rank {r} failed: {e!r}") from e
    for src in range(p):
        for dst in range(p):
            if not queues[src][dst].empty():
                raise RuntimeError(f"message from {src} to {dst} never received")
    return results, nbytes, nmsgs
