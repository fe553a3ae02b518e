"""Probe the machine: how many cores, and how many really run in parallel.

``os.cpu_count()`` tells how many logical CPUs exist; a container, a JupyterHub quota or
hyper-threading may give you fewer *effective* cores. We measure it: run the same busy
loop in k processes at once; if each still does its loop in the same time, k cores
work in parallel. effective_cores = k * t(1) / t(k), maximised over k.

Every lesson that sizes a sweep by the machine asks :func:`usable_cores` (never
``os.cpu_count()`` itself), so the environment variable ``COURSE_USABLE_CORES`` can make a
2-core CI machine run the lessons as a 1-core container or a 16-core laptop would size them;
and every speedup ceiling is :func:`measured_parallelism`, lesson 00's measurement, so the
course states one ceiling, not two.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import platform
import sys
import time


def busy_loop(n: int = 3_000_000) -> float:
    """Pure-Python arithmetic (no BLAS, no I/O): seconds to run it."""
    start = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i % 7
    return time.perf_counter() - start


def _timed_busy(comm, n):
    comm.barrier()  # start together
    return busy_loop(n)


def logical_cores() -> int:
    return os.cpu_count() or 1


CORES_VARIABLE = "COURSE_USABLE_CORES"

#: The largest number of busy workers :func:`measured_parallelism` starts. Lessons 00 and 01
#: state it; it keeps the probe a few seconds long on a 16-core laptop (and on a 2-core machine
#: told it has 16 cores, where each extra worker only takes turns).
PROBE_CAP = 8


def usable_cores() -> int:
    """CPUs this process may run on (affinity / cgroup cpusets), where the OS tells.

    ``COURSE_USABLE_CORES=n`` overrides it, so the tests can size the lessons' sweeps as a
    1-core container or a 16-core laptop would without owning one; it changes what the
    lessons *plan*, never what they measure.
    """
    given = os.environ.get(CORES_VARIABLE)
    if given is not None:
        if not given.strip().isdecimal() or int(given) < 1:
            raise ValueError(f"{CORES_VARIABLE} must be a positive integer (a core count), got {given!r}")
        return int(given)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return logical_cores()


def measured_parallelism(cap: int = PROBE_CAP) -> dict:
    """Lesson 00's probe, the one ceiling of every speedup in the course (lessons 00 and 01).

    One more busy worker than the usable cores (to see the curve flatten past them), at most
    ``cap``, at least 2 (so a 1-core machine shows that a second worker buys nothing).
    Returns :func:`effective_parallelism`'s dict.
    """
    return effective_parallelism(max_workers=max(2, min(usable_cores() + 1, cap)), n=1_000_000)


def effective_parallelism(max_workers: int | None = None, n: int = 2_000_000, start_method=None,
                          repeats: int = 2) -> dict:
    """Measure effective cores with real worker processes.

    Returns {"k": [...], "time": [...], "speedup": [...], "effective_cores": float}: time[i] is the
    slowest worker's loop time with k[i] busy workers (the fastest of ``repeats`` runs), and
    speedup_k = min(k, k * t(1) / t(k)). The cap: k workers cannot beat k cores, and a speedup above
    k only means that the k = 1 runs were slowed by another program (it gave 2.53 effective cores on
    a 2-core machine). speedup_1 = 1, so the effective parallelism is at least one core.
    """
    from .runtime.cluster import Cluster

    max_workers = max_workers or min(usable_cores() + 1, 8)
    ks, times = [], []
    for k in range(1, max_workers + 1):
        with Cluster(k, start_method=start_method) as cluster:
            best = min(max(cluster.run(_timed_busy, n)) for _ in range(repeats))
        ks.append(k)
        times.append(best)
    speedup = [min(float(k), k * times[0] / t) for k, t in zip(ks, times)]
    return {"k": ks, "time": times, "speedup": speedup, "effective_cores": max(speedup)}


def describe() -> dict:
    """What a student should know about the machine before measuring anything."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "logical_cores": logical_cores(),
        "usable_cores": usable_cores(),
        "default_start_method": mp.get_start_method(allow_none=False),
        "available_start_methods": mp.get_all_start_methods(),
    }
