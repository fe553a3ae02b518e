"""Allreduce measured side by side: course_lib's engines, MPICH's MPI_Allreduce, and memcpy.

Every engine is timed by the same procedure, :func:`timed_tries`: ``tries`` batches of
back-to-back allreduces of float32 vectors; before each batch the ranks line up on a fast
barrier of the engine's own (``MPI_Barrier`` for MPI, a shared-memory SpinBarrier for
course_lib), so the start of a batch is not skewed by tens of microseconds of Pipe
wake-ups. A try's time is the slowest rank's time per call in that batch; we report the
best and the median over tries. Small messages run several calls per batch
(:func:`iterations`) so a batch lasts long enough to time.

memcpy of the same bytes, in one process, is the ceiling on one machine: an allreduce
must at least read every rank's vector and write the result.

``bind=True`` pins rank r to core r mod (cores) for both engines (``mpiexec -bind-to
core``, and ``os.sched_setaffinity`` in course_lib's workers for the measurement only), as
MPI launchers do on clusters. It matters on a busy machine: ranks that wait by yielding
their core (course_lib's SpinBarrier) can be left on one core by the scheduler, and then
every wait is a context switch (4 KB on 2 ranks here: 58 µs unbound, 5.7 µs bound), while
MPICH's ranks, which never stop polling, get spread over the cores anyway.

Engines: "shm" (allreduce_shm on a reused workspace, waiting on shared counters),
"shm_pipes" (the same, waiting on dissemination barriers over Pipes), "ring" (ring
allreduce over Pipes) and "mpi" (``MPI_Allreduce`` under ``mpiexec``).

    python -m course_lib.beyond_one_machine.allreduce_benchmark -p 2 4 --tries 20 --rounds 3  # the tables
    mpiexec -n 2 python -m course_lib.beyond_one_machine.allreduce_benchmark --mpi  # MPI alone, JSON on rank 0
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from ..collectives.shmem import allreduce_shm
from ..runtime.cluster import Cluster
from ..runtime.mpi_backend import mpiexec_path
from ..runtime.shm_sync import SpinBarrier, control_words

SIZES = [4 * 2 ** 10, 64 * 2 ** 10, 2 ** 20, 4 * 2 ** 20, 16 * 2 ** 20]   # bytes
COURSE_ENGINES = ("shm", "shm_pipes", "ring")
# One name, colour and marker per engine for every figure of lesson 07 (the line chart and the bar
# widget draw an engine alike); a second process count of the same engine changes the line style or
# the hatching, never the colour.
ENGINE_NAMES = {"shm": "shared memory, spin counters", "shm_pipes": "shared memory, Pipe barriers",
                "ring": "ring over Pipes", "mpi": "MPI_Allreduce (MPICH)", "memcpy": "memcpy (ceiling)"}
ENGINE_COLORS = {"shm": "tab:blue", "shm_pipes": "tab:orange", "ring": "tab:green", "mpi": "tab:red",
                 "memcpy": "black"}
ENGINE_MARKERS = {"shm": "o", "shm_pipes": "s", "ring": "^", "mpi": "D", "memcpy": "x"}
_MODULE = "course_lib.beyond_one_machine.allreduce_benchmark"   # run by name under mpiexec (--mpi)


def iterations(nbytes: int) -> int:
    """Calls per timed batch: enough that a batch of small messages lasts ~100 µs or more."""
    return int(max(1, min(64, 256 * 1024 // nbytes)))


def timed_tries(call, line_up, tries: int, iters: int) -> list[float]:
    """Seconds per call of ``call`` in each of ``tries`` batches of ``iters`` calls (one warm-up)."""
    call()
    out = []
    for _ in range(tries):
        line_up()
        t = time.perf_counter()
        for _ in range(iters):
            call()
        out.append((time.perf_counter() - t) / iters)
    return out


def clearly_faster(a: dict, b: dict) -> bool:
    """Whether ``a`` (a :func:`summary`) was faster than ``b`` beyond the spread of the tries: its
    median try beat ``b``'s best try, so more than half of ``a``'s tries were faster than every one of
    ``b``'s. Closer than that, the difference is within the noise of the tries."""
    return a["median"] < b["best"]


def summary(times) -> dict:
    times = np.asarray(times, dtype=float)
    return {"best": float(times.min()), "median": float(np.median(times)), "tries": int(times.size),
            "times": times.tolist()}


# -- memcpy ---------------------------------------------------------------------
def unaliased_pair(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A source and a destination of ``nbytes`` (float32) whose addresses differ by 2048 mod 4096.

    Two arrays allocated one after the other usually sit a few bytes apart modulo 4096, and
    then the CPU takes each load for one that depends on the store just before it at the same
    offset in its page ("4K aliasing", Intel's optimization manual): on this machine a 64 KB
    copy so placed ran at 3 GB/s instead of 33. A ceiling must not measure that accident."""
    n = nbytes // 4
    src = np.ones(n, dtype=np.float32)
    room = np.empty(n + 2048, dtype=np.float32)              # 8 KB of slack to choose the offset
    shift = (src.ctypes.data + 2048 - room.ctypes.data) % 4096
    start = shift // 4
    dst = room[start:start + n]
    return src, dst


def measure_memcpy(sizes, tries: int = 20) -> list[dict]:
    """Time of one copy of each size (the ceiling), by the same procedure, in this process,
    between buffers placed so that they do not alias (:func:`unaliased_pair`)."""
    out = []
    for nbytes in sizes:
        src, dst = unaliased_pair(nbytes)
        times = timed_tries(functools.partial(np.copyto, dst, src), lambda: None, tries, iterations(nbytes))
        out.append(summary(times))
    return out


# -- course_lib on a Cluster ---------------------------------------------------------
def _course_worker(comm, sizes, engine, tries, workspaces, control, bind=False):
    unbound = _bind_to_core(comm.rank) if bind else None

    # Only lines ranks up before a batch: it protects no data, so it is fine on any CPU.
    line_up = SpinBarrier(control.array, comm.size, comm.rank, timeout=None)
    expected = comm.size * (comm.size + 1) / 2
    out = []
    try:
        for nbytes, ws in zip(sizes, workspaces):
            x = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
            if engine == "ring":
                call = functools.partial(comm.allreduce, x, algorithm="ring")
            else:
                sync = "pipes" if engine == "shm_pipes" else "auto"
                call = functools.partial(allreduce_shm, comm, x, workspace=ws, sync=sync)
            out.append(timed_tries(call, line_up.barrier, tries, iterations(nbytes)))
            if not np.all(call() == expected):
                raise AssertionError(f"{engine} allreduce gave a wrong sum on rank {comm.rank}")
    finally:
        line_up.close()
        if unbound is not None:
            os.sched_setaffinity(0, unbound)
    return out


def _bind_to_core(rank: int):
    """Pin this process to core ``rank`` mod cores; return the previous affinity (or None)."""
    if not hasattr(os, "sched_setaffinity"):
        return None                      # macOS, Windows: no affinity API in Python
    before = os.sched_getaffinity(0)
    cores = sorted(before)
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    return before


def measure_course(cluster, sizes, engine: str = "shm", tries: int = 20, bind: bool = False) -> list[dict]:
    """Per-call time of course_lib's allreduce ``engine`` on ``cluster``, per size."""
    if engine not in COURSE_ENGINES:
        raise ValueError(f"engine must be one of {COURSE_ENGINES}, got {engine!r}")
    p = cluster.n_workers
    workspaces = [cluster.share(np.zeros((p, s // 4), dtype=np.float32)) if engine != "ring" else None
                  for s in sizes]
    control = cluster.share(np.zeros(control_words(p), dtype=np.int64))
    try:
        per_rank = cluster.run(_course_worker, list(sizes), engine, tries, workspaces, control, bind)
    finally:
        for shared in workspaces + [control]:
            if shared is not None:
                shared.release()
    # a try lasts as long as its slowest rank
    return [summary(np.max([r[i] for r in per_rank], axis=0)) for i in range(len(sizes))]


# -- MPICH under mpiexec -----------------------------------------------------------------
def measure_mpi(n_procs: int, sizes, tries: int = 20, timeout: float = 300, bind: bool = False) -> dict:
    """Run this module under ``mpiexec -n n_procs``; per-size summaries of MPI_Allreduce."""
    exe = mpiexec_path()
    if exe is None:
        raise FileNotFoundError("mpiexec not found: install the mpi extra (pip install '.[mpi]')")
    cmd = [exe, "-bind-to", "core" if bind else "none", "-n", str(n_procs),
           sys.executable, "-m", _MODULE, "--mpi",
           "--tries", str(tries), "--sizes", *map(str, sizes)]
    # the folder that holds course_lib, so the MPI ranks import this same copy
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parents[2])] + sys.path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"mpiexec failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def _mpi_main(sizes, tries):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    results = []
    for nbytes in sizes:
        x = np.full(nbytes // 4, world.rank + 1, dtype=np.float32)
        y = np.empty_like(x)
        one_allreduce = functools.partial(world.Allreduce, x, y, op=MPI.SUM)
        times = timed_tries(one_allreduce, world.Barrier, tries, iterations(nbytes))
        if not np.all(y == world.size * (world.size + 1) / 2):
            raise AssertionError(f"MPI_Allreduce gave a wrong sum on rank {world.rank}")
        everyone = world.gather(times, root=0)
        if world.rank == 0:
            results.append(summary(np.max(everyone, axis=0)))
    if world.rank == 0:
        print(json.dumps({"sizes": list(sizes), "mpi": results,
                          "library": MPI.Get_library_version().splitlines()[0].strip()}), flush=True)


# -- all of them, one table ----------------------------------------------------------------
def compare(ps=(2, 4), sizes=SIZES, tries: int = 20, engines=("shm", "mpi"), rounds: int = 1,
            bind: bool = False) -> dict:
    """Measure ``engines`` at every p and size in one run; memcpy once per size.

    With ``rounds`` > 1 the whole sweep is repeated and the tries pooled, so that a burst
    of load from other jobs hits every engine alike. Returns ``{"sizes": [...], "memcpy":
    [summary...], "library": str, (engine, p): [summary per size], ...}``; "mpi" is left
    out if mpiexec is missing.
    """
    pooled: dict = {}

    def add(key, summaries):
        for i, s in enumerate(summaries):
            pooled.setdefault(key, [[] for _ in sizes])[i].extend(s["times"])

    library = None
    for _ in range(rounds):
        add("memcpy", measure_memcpy(sizes, tries))
        for p in ps:
            local = [e for e in engines if e in COURSE_ENGINES]
            if local:
                with Cluster(p) as cluster:
                    for engine in local:
                        add((engine, p), measure_course(cluster, sizes, engine, tries, bind))
            if "mpi" in engines and mpiexec_path() is not None:
                mpi = measure_mpi(p, sizes, tries, bind=bind)
                add(("mpi", p), mpi["mpi"])
                library = mpi["library"]
    out = {"sizes": list(sizes), "library": library, "bind": bind}
    out.update({key: [summary(t) for t in per_size] for key, per_size in pooled.items()})
    return out


def format_table(result: dict, stat: str = "best") -> str:
    """Microseconds per call (``stat`` over tries), and shm's speed relative to MPI."""
    sizes = result["sizes"]
    keys = [k for k in result if isinstance(k, tuple)]
    head = f"{'bytes':>10} {'memcpy':>9}" + "".join(f"{e + ' p=' + str(p):>15}" for e, p in keys)
    ratio_ps = [p for e, p in keys if e == "shm" and ("mpi", p) in result]
    head += "".join(f"{'mpi/shm p=' + str(p):>13}" for p in ratio_ps)
    bound = "ranks bound to cores" if result.get("bind") else "ranks not bound to cores"
    lines = [f"{stat} of {result['memcpy'][0]['tries']} tries, µs per call, {bound} "
             f"(ratio > 1: course_lib shm faster)", head]
    for i, s in enumerate(sizes):
        row = f"{s:>10,} {result['memcpy'][i][stat] * 1e6:>9.1f}"
        row += "".join(f"{result[k][i][stat] * 1e6:>15.1f}" for k in keys)
        row += "".join(f"{result[('mpi', p)][i][stat] / result[('shm', p)][i][stat]:>12.2f}x"
                       for p in ratio_ps)
        lines.append(row)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mpi", action="store_true", help="run as an MPI program (under mpiexec)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the sweep, pooling the tries")
    parser.add_argument("--bind", action="store_true", help="pin rank r to core r mod cores (both engines)")
    parser.add_argument("-p", type=int, nargs="+", default=[2, 4], help="process counts")
    parser.add_argument("--engines", nargs="+", default=["shm", "mpi"],
                        choices=list(COURSE_ENGINES) + ["mpi"])
    args = parser.parse_args(argv)
    if any(s % 4 or s <= 0 for s in args.sizes):
        parser.error("sizes must be positive multiples of 4 bytes (float32)")
    if args.mpi:
        _mpi_main(args.sizes, args.tries)
        return 0
    result = compare(args.p, args.sizes, args.tries, args.engines, args.rounds, args.bind)
    print(format_table(result, "best"))
    print(format_table(result, "median"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
