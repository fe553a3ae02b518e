"""The object collectives return what mpi4py's return: same type, dtype, shape and value.

mpi4py's lowercase collectives pickle Python objects and combine them with the op's Python
operator, so a 0-d array summed with a 0-d array is a numpy scalar, a list summed with a list
is their concatenation, and one process returns its own object. The programs record what
came back, type included."""
import numpy as np

from p2p_programs.common import show


def _values(rank: int) -> list:
    return [rank + 1, 0.5 * rank, np.float64(rank), np.int32(rank + 2), np.array(1.5 + rank),
            np.array(rank, dtype=np.int64), np.arange(3.0) + rank, np.full((2, 2), rank, dtype=np.float32),
            [rank], (rank, rank)]


def main(comm, MPI):
    out = []
    root = comm.size - 1
    for v in _values(comm.rank):
        for name, op in (("SUM", MPI.SUM), ("MAX", MPI.MAX), ("PROD", MPI.PROD)):
            if name != "SUM" and (isinstance(v, (list, tuple)) or np.size(v) != 1):  # mpi4py: whole objects
                continue
            out.append(f"allreduce {name} {show(v)} -> {show(comm.allreduce(v, op=op))}")
            out.append(f"reduce {name} -> {show(comm.reduce(v, op=op, root=root))}")
        if not isinstance(v, (list, tuple)):
            out.append(f"scan -> {show(comm.scan(v))}")
            out.append(f"exscan -> {show(comm.exscan(v))}")
        out.append(f"bcast -> {show(comm.bcast(v, root=root))}")
        out.append(f"allgather -> {[show(x) for x in comm.allgather(v)]}")
        out.append(f"gather -> {comm.gather(show(v), root=0)}")
    out.append(f"scatter -> {show(comm.scatter([np.array(r) for r in range(comm.size)] if comm.rank == 0 else None))}")
    parts = [np.array(comm.rank * 10 + d) for d in range(comm.size)]
    out.append(f"alltoall -> {[show(x) for x in comm.alltoall(parts)]}")
    return out
