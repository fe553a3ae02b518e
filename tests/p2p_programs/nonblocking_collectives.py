"""Non-blocking allreduce: what course_lib's ``iallreduce(x).wait()`` returns is what mpi4py's
``Iallreduce(x, out)`` leaves in ``out`` (dtype, shape, values), with several started before
any is waited for. mpi4py has only the buffer form; course_lib has the object form (the
lowercase name), so the program starts each through :func:`start`. Values are exact in floating
point (halves, small integers), so the order of additions cannot show."""
import numpy as np

from p2p_programs.common import show


def start(comm, x, op):
    """Start a non-blocking allreduce of ``x``; return (request, a function that waits for the result)."""
    if hasattr(comm, "iallreduce"):                    # course_lib
        req = comm.iallreduce(x, op=op)
        return req, req.wait
    out = np.empty_like(x)                             # mpi4py
    req = comm.Iallreduce(x, out, op=op)
    return req, lambda: (req.Wait(), out)[1]


def main(comm, MPI):
    r = comm.rank
    cases = [(np.arange(6, dtype=np.int64) * (r + 1), MPI.SUM),
             (np.full(4, r, dtype=np.int32), MPI.MAX),
             (np.array([0.5, 0.25, -2.0]) * (r + 1), MPI.SUM),
             (np.arange(3.0) + r, MPI.MIN),
             (np.full((2, 3), r, dtype=np.float32), MPI.SUM),
             (np.arange(4, dtype=np.int16) + r, MPI.PROD)]
    started = [start(comm, x, op) for x, op in cases]        # all in flight before the first wait
    out = [f"{show(x)} -> {show(wait())}" for (_, wait), (x, _) in zip(started, cases)]
    req, wait = start(comm, np.full(5, 2.0 ** r), MPI.SUM)
    out.append(f"powers of two -> {show(wait())}")
    return out
