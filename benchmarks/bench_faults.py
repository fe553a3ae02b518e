"""Failure latency: how long a worker's error, death or hang takes to reach the parent.

The promise (developers' guide): a worker that raises, dies or hangs gives a clear error naming
its rank within 2 s, under fork, spawn and forkserver. The tests check the mechanism (the error
comes through the failure path, long before the run's own timeout); the number lives here,
measured on a quiet machine. ``python -m benchmarks.bench_faults``.
"""
from __future__ import annotations

import os
import re
import time

TARGET_S = 2.0


def _noop(comm):
    return comm.rank


def _raise_on(comm, raising):
    if comm.rank in raising:
        raise ValueError(f"rank {comm.rank} fails on purpose, raised at {time.time():.6f}")
    time.sleep(30)  # the others are busy: only the failure path can end the run early


DIE_AFTER_S = 0.5


def _die_on(comm, rank):
    if comm.rank == rank:
        time.sleep(DIE_AFTER_S)
        os._exit(3)
    time.sleep(30)


def _latencies(n: int, start_method: str) -> dict[str, float]:
    """Seconds from each failure to the parent's error. Each case starts on warm workers (a failed
    run restarts them, and that start-up is not the failure's latency)."""
    from course_lib import Cluster, WorkerError, WorkerTimeout

    out = {}
    with Cluster(n, start_method=start_method, timeout=60) as cluster:
        for label, fn, arg in (("one raises", _raise_on, [n // 2]), ("all raise", _raise_on, list(range(n)))):
            cluster.run(_noop)
            try:
                cluster.run(fn, arg)
            except WorkerError as err:
                raised = re.search(r"raised at (\d+\.\d+)", str(err))
                out[label] = time.time() - float(raised.group(1))
        cluster.run(_noop)
        t0 = time.time()
        try:
            cluster.run(_die_on, n - 1)
        except WorkerError:
            out["one dies"] = time.time() - t0 - DIE_AFTER_S
        cluster.run(_noop)
        t0 = time.time()
        try:
            cluster.run(_raise_on, [], timeout=1.0)
        except WorkerTimeout:
            out["hang past a 1 s timeout"] = time.time() - t0 - 1.0
    return out


def run() -> None:
    print(f"{'start method':<12} {'workers':>7}  {'case':<26} {'seconds':>8}  target < {TARGET_S:g} s")
    for start_method, sizes in (("fork", (8, 64)), ("spawn", (8, 64)), ("forkserver", (8, 64))):
        for n in sizes:
            for case, seconds in _latencies(n, start_method).items():
                verdict = "ok" if seconds < TARGET_S else "SLOW"
                print(f"{start_method:<12} {n:>7}  {case:<26} {seconds:8.2f}  {verdict}", flush=True)


if __name__ == "__main__":
    run()
