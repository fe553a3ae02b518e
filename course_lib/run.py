"""Run one course program on either backend, with the same numbers out.

A program is a Python file that defines ``main(comm)`` (an SPMD function, as given to
``Cluster.run``) and may define ``CONFIG = dict(n_workers=..., graph=...)``.

    mpiexec -n 4 python -m course_lib.run examples/mapreduce_gd.py --out mpi.pkl
    python -m course_lib.run --local 4 examples/mapreduce_gd.py --out local.pkl

Both write ``{"backend", "size", "results" (by rank), "bytes" (P x P payload matrix)}``
with pickle, and print a short summary. Under MPI the results are gathered on rank 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import pickle
import sys

import numpy as np


def load_program(path: str):
    spec = importlib.util.spec_from_file_location("course_program", path)
    if spec is None:
        raise FileNotFoundError(f"no program at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["course_program"] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise AttributeError(f"{path} must define main(comm)")
    # Workers started by spawn or forkserver cannot import a file loaded by path:
    # ship the program's functions by value, as for a notebook cell.
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _summary(out: dict) -> str:
    return (f"backend={out['backend']} size={out['size']} total_bytes={int(out['bytes'].sum())} "
            f"rank0={_short(out['results'][0])}")


def _short(obj) -> str:
    text = repr(obj)
    return text if len(text) < 200 else text[:200] + "..."


def run_local(module, n_workers: int, start_method=None) -> dict:
    from .runtime.cluster import Cluster

    graph = getattr(module, "graph", None)
    graph = graph(n_workers) if callable(graph) else None
    with Cluster(n_workers, start_method=start_method, graph=graph) as cluster:
        res = cluster.run(module.main)
    return {"backend": "local", "size": n_workers, "results": list(res), "bytes": res.stats.bytes.copy()}


def run_mpi(module):
    """Run ``module.main`` on ``COMM_WORLD``. A rank that raises prints its error and aborts the job:
    MPI has no other way to free the ranks waiting for it (they would wait in their receive or
    collective until ``mpiexec`` is killed), and ``Abort`` also ends every rank at once."""
    from .runtime.mpi_backend import MPIComm, _mpi

    world = _mpi().COMM_WORLD
    try:
        graph = getattr(module, "graph", None)
        graph = graph(world.Get_size()) if callable(graph) else None
        comm = MPIComm(world, graph=graph)
        result = module.main(comm)
        results = world.gather(result, root=0)
        rows = world.gather(comm.stats.bytes[comm.rank], root=0)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt must end the job too
        _abort(world, exc)
    if world.Get_rank() != 0:
        return None
    return {"backend": "mpi", "size": world.Get_size(), "results": results, "bytes": np.array(rows)}


def _abort(world, exc: BaseException) -> None:
    import traceback

    rank = world.Get_rank()
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(f"rank {rank} of {world.Get_size()} raised {type(exc).__name__}; aborting the job:\n{text}")
    sys.stderr.flush()
    sys.stdout.flush()
    world.Abort(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("program", help="a .py file defining main(comm)")
    parser.add_argument("--local", type=int, metavar="P", help="run on a local Cluster(P) instead of MPI")
    parser.add_argument("--start-method", default=None)
    parser.add_argument("--out", help="write the results here (pickle)")
    args = parser.parse_args(argv)
    module = load_program(args.program)
    out = run_local(module, args.local, args.start_method) if args.local else run_mpi(module)
    if out is not None:
        print(_summary(out), flush=True)
        if args.out:
            with open(args.out, "wb") as f:
                pickle.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
