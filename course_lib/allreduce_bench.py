"""Allreduce measured side by side: shared memory, ring over Pipes, MPI, and memcpy.

Algorithm bandwidth = message bytes / time of one allreduce (the convention of
nccl-tests). memcpy of the same bytes is the ceiling on one machine: an allreduce must
at least read every rank's vector and write the result.

    python -m course_lib.allreduce_bench                     # local methods, prints a table
    mpiexec -n 2 python -m course_lib.allreduce_bench --mpi  # MPI_Allreduce, JSON on rank 0
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

DEFAULT_SIZES = [2 ** k for k in range(12, 26, 2)]  # bytes: 4 KB .. 32 MB


def _best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def memcpy_bandwidth(sizes, repeats: int = 5) -> list[float]:
    out = []
    for nbytes in sizes:
        src = np.ones(nbytes // 4, dtype=np.float32)
        dst = np.empty_like(src)
        out.append(nbytes / _best_time(lambda: np.copyto(dst, src), repeats))
    return out


def _local_worker(comm, sizes, method, repeats, workspaces):
    from .collectives.shmem import allreduce_shm

    out = []
    for nbytes, ws in zip(sizes, workspaces):
        x = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
        best = float("inf")
        for _ in range(repeats + 1):  # one warm-up
            comm.barrier()
            t = time.perf_counter()
            if method == "shm":
                y = allreduce_shm(comm, x, workspace=ws)
            else:
                y = comm.allreduce(x, algorithm="ring")
            comm.barrier()
            best = min(best, time.perf_counter() - t)
        expected = comm.size * (comm.size + 1) / 2
        if not np.all(y == expected):
            raise AssertionError(f"{method} allreduce gave a wrong sum on rank {comm.rank}")
        out.append(nbytes / best)
    return out


def local_bandwidth(cluster, sizes, method: str, repeats: int = 3) -> list[float]:
    """Algorithm bandwidth of course_lib's allreduce ("shm" or "ring") on ``cluster``."""
    if method not in ("shm", "ring"):
        raise ValueError(f"method must be 'shm' or 'ring', got {method!r}")
    p = cluster.n_workers
    workspaces = [cluster.share(np.zeros((p, s // 4), dtype=np.float32)) if method == "shm" else None
                  for s in sizes]
    try:
        return cluster.run(_local_worker, list(sizes), method, repeats, workspaces)[0]
    finally:
        for ws in workspaces:
            if ws is not None:
                ws.release()


def mpiexec_path() -> str | None:
    here = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi_bandwidth(n_procs: int, sizes, repeats: int = 3, timeout: float = 300) -> dict:
    """Run this module under ``mpiexec -n n_procs``: MPI_Allreduce and course_lib ring over MPI."""
    exe = mpiexec_path()
    if exe is None:
        raise FileNotFoundError("mpiexec not found: install the mpi extra (pip install '.[mpi]')")
    cmd = [exe, "-n", str(n_procs), sys.executable, "-m", "course_lib.allreduce_bench", "--mpi",
           "--repeats", str(repeats), "--sizes", *map(str, sizes)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parents[1])] + sys.path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"mpiexec failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def _mpi_main(sizes, repeats):
    from mpi4py import MPI

    from .runtime.mpi_backend import MPIComm

    comm = MPIComm()
    world = comm.mpi
    native, ring = [], []
    for nbytes in sizes:
        x = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
        y = np.empty_like(x)
        best_native = best_ring = float("inf")
        for _ in range(repeats + 1):
            world.Barrier()
            t = time.perf_counter()
            world.Allreduce(x, y, op=MPI.SUM)
            world.Barrier()
            best_native = min(best_native, time.perf_counter() - t)
            world.Barrier()
            t = time.perf_counter()
            comm.allreduce(x, algorithm="ring")
            world.Barrier()
            best_ring = min(best_ring, time.perf_counter() - t)
        native.append(nbytes / best_native)
        ring.append(nbytes / best_ring)
    if comm.rank == 0:
        print(json.dumps({"sizes": list(sizes), "mpi_allreduce": native, "course_ring_on_mpi": ring,
                          "library": MPI.Get_library_version().splitlines()[0].strip()}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mpi", action="store_true", help="run as an MPI program (under mpiexec)")
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-p", type=int, default=2, help="processes for the local methods")
    args = parser.parse_args(argv)
    if any(s % 4 or s <= 0 for s in args.sizes):
        parser.error("sizes must be positive multiples of 4 bytes (float32)")
    if args.mpi:
        _mpi_main(args.sizes, args.repeats)
        return 0
    from .runtime.cluster import Cluster

    with Cluster(args.p) as cluster:
        shm_bw = local_bandwidth(cluster, args.sizes, "shm", args.repeats)
        ring_bw = local_bandwidth(cluster, args.sizes, "ring", args.repeats)
    mem = memcpy_bandwidth(args.sizes)
    print(f"{'bytes':>12} {'memcpy':>10} {'shm':>10} {'ring':>10}  (GB/s)")
    for s, a, b, c in zip(args.sizes, mem, shm_bw, ring_bw):
        print(f"{s:>12,} {a / 1e9:>10.2f} {b / 1e9:>10.2f} {c / 1e9:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
