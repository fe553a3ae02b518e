"""Lesson 02's collectives on any backend: every algorithm of allreduce and allgather.

    mpiexec -n 4 python -m course_lib.run examples/collectives.py
    python -m course_lib.run --local 4 examples/collectives.py
"""
import numpy as np

import course_lib.collectives  # noqa: F401  (registers lesson 02's variants used below: reduce_bcast, ...)
from course_lib import SUM


def main(comm):
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(1001)  # ragged: 1001 is not a multiple of the worker count
    out = {}
    for algorithm in ("reduce_bcast", "ring", "rabenseifner"):
        out[f"allreduce/{algorithm}"] = comm.allreduce(x, op=SUM, algorithm=algorithm)
    for algorithm in ("ring", "recursive_doubling", "bruck"):
        out[f"allgather/{algorithm}"] = comm.allgather(comm.rank * 10, algorithm=algorithm)
    out["bcast"] = comm.bcast({"root says": comm.rank} if comm.rank == 0 else None, root=0)
    out["scan"] = comm.scan(comm.rank + 1)
    return out
