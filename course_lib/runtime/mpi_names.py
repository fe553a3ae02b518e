"""An ``MPI``-like namespace, so one program text runs on course_lib and on mpi4py.

``from course_lib import MPI`` (or ``from mpi4py import MPI``), then ``MPI.ANY_SOURCE``,
``MPI.ANY_TAG``, ``MPI.PROC_NULL``, ``MPI.UNDEFINED``, ``MPI.Status()``,
``MPI.Request.waitall(...)``, ``MPI.SUM``, ``MPI.COMM_NULL``, ``MPI.BYTE``...

The special values are numbers as in Open MPI (ANY_SOURCE -1, PROC_NULL -2); MPICH
numbers them differently (ANY_SOURCE -2, PROC_NULL -1), so a portable program compares
with the names, never with the numbers. What course_lib does not provide is simply
absent here (an AttributeError names it); on a communicator it raises NotImplementedError.
"""
from __future__ import annotations

import time

from .comm import Comm, Deadlock, PeerLost
from .constants import ANY_SOURCE, ANY_TAG, MAX_TAG, PROC_NULL, UNDEFINED
from .mpi_errors import ERR_ROOT, MPIError
from .ops import MAX, MAXLOC, MIN, MINLOC, NO_OP, OP_NULL, PROD, REPLACE, SUM, Op
from .p2p import Request, Status

Intracomm = Comm
Exception = MPIError  # noqa: A001 - mpi4py's name: MPI.Exception
COMM_NULL = None      # what Split(color=UNDEFINED) and Create_group return to non-members
REQUEST_NULL = None
SUCCESS = 0
TAG_UB = MAX_TAG - 1  # the largest tag (mpi4py: comm.Get_attr(MPI.TAG_UB); MPICH: 2**29 - 1)


class Datatype:
    """Enough of an MPI datatype for ``Status.Get_count(datatype)``: a name and a size in bytes."""

    def __init__(self, name: str, size: int):
        self.name, self.size = name, size

    def Get_size(self) -> int:
        return self.size

    def __repr__(self):
        return f"<course_lib MPI.{self.name}>"


BYTE, CHAR = Datatype("BYTE", 1), Datatype("CHAR", 1)
INT, LONG, INT64_T = Datatype("INT", 4), Datatype("LONG", 8), Datatype("INT64_T", 8)
FLOAT, DOUBLE = Datatype("FLOAT", 4), Datatype("DOUBLE", 8)


def Wtime() -> float:
    """Seconds on a monotonic clock (MPI_Wtime)."""
    return time.perf_counter()


# In a worker process: its communicator, and its own one-process communicator once asked for.
_world: Comm | None = None
_self: Comm | None = None


def bind_world(comm: Comm) -> None:
    """Called once by each worker: ``MPI.COMM_WORLD`` is then its communicator."""
    global _world, _self
    _world, _self = comm, None


def __getattr__(name: str):
    """``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` in a worker, as mpi4py code reads them: the worker's
    communicator, and a communicator of this rank alone (made without messages)."""
    global _self
    if name not in ("COMM_WORLD", "COMM_SELF"):
        raise AttributeError(f"course_lib's MPI has no {name!r} (see course_lib/runtime/mpi_names.py)")
    if _world is None:
        raise AttributeError(f"MPI.{name} exists in a worker process: use the comm your function receives "
                             "(cluster.run(fn) calls fn(comm, ...))")
    if name == "COMM_WORLD":
        return _world
    if _self is None:
        from .groups import Group

        _self = _world.Create_group(Group([_world.rank]))
    return _self


#: The MPI standard whose object interface this follows (mpi4py's ``MPI.Get_version()``): a feature
#: of a later standard raises NotImplementedError, which mpi4py's own tests accept below this version.
VERSION = (3, 1)


THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
#: What a worker's communicator allows threads to do (MPI_Query_thread).
THREAD_LEVEL = THREAD_MULTIPLE   # receives from several threads work (a read lock per link)


def Query_thread() -> int:
    """The thread level of this process's communicators (mpi4py's ``MPI.Query_thread()``)."""
    return THREAD_LEVEL


def Get_version() -> tuple[int, int]:
    """(major, minor) of the MPI standard this namespace follows (MPI_Get_version)."""
    return VERSION


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """mpi4py's ``MPI.get_vendor()``: who implements MPI here, and its version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        parts = [int(x) for x in version("course_lib").split(".")[:3] if x.isdigit()]
    except PackageNotFoundError:
        parts = []
    return "course_lib", tuple((parts + [0, 0, 0])[:3])


__all__ = ["ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED", "TAG_UB", "COMM_NULL", "REQUEST_NULL", "SUCCESS",
           "Status", "Request", "Comm", "Intracomm", "Datatype", "BYTE", "CHAR", "INT", "LONG", "INT64_T", "FLOAT",
           "DOUBLE", "SUM", "PROD", "MAX", "MIN", "MAXLOC", "MINLOC", "Op", "Wtime", "PeerLost", "Deadlock",
           "Get_version", "get_vendor", "Exception", "ERR_ROOT", "REPLACE", "NO_OP", "OP_NULL",
           "Query_thread", "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE"]
