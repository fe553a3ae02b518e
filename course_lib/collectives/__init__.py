"""Collective communication (lesson 02), built from point-to-point messages.

Every algorithm is a plain function of a transport (``rank``, ``size``, ``send``,
``recv``, ``sendrecv``; see :mod:`._p2p`), grouped by collective in ``ALGORITHMS``::

    ALGORITHMS["allreduce"]["ring"](t, x, SUM)

On a communicator the same algorithms are methods with mpi4py's arguments and an
extra ``algorithm=`` keyword (``comm.allreduce(x, op=SUM, algorithm="ring")``); the
runtime's ``Comm`` inherits :class:`CollectivesMixin`. Costs: :mod:`course_lib.costs`.

Modules: barrier, broadcast (bcast/scatter/gather), allgather, alltoall, reduction
(reduce, reduce_scatter, scan, exscan), allreduce, scatter_gather (the seeds' ScatterGather),
groups (Split, Group, sub-communicators), shmem (shared-memory allreduce),
sharp (in-network aggregation: an allreduce summed by a switch process, Graham et al. 2016),
sim (in-process simulator for quick tests).
"""
from ..runtime import registry
from ..runtime.collective_api import DEFAULTS, CollectivesMixin, register_extension
from ..runtime.groups import UNDEFINED, Group, SubComm
from . import allgather, allreduce, alltoall, barrier, broadcast, reduction, sharp, shmem
from ._p2p import CollectiveMismatch, chunk_bounds, chunk_sizes, fold_roles
from .scatter_gather import classify as classify_scatter_gather
from .scatter_gather import scatter_gather
from .scatter_gather import (
    scatter_gather as ScatterGather,  # the seeds' name: ScatterGather(comm, data, src, dst, unit, total)
)

# Every algorithm of this lesson is a row (function, time formula, rounds, exact traffic) that the
# runtime's communicators and the cost model (course_lib.costs) read alike.
ROWS = [*barrier.ROWS, *broadcast.ROWS, *allgather.ROWS, *alltoall.ROWS, *reduction.ROWS, *allreduce.ROWS]
for _row in ROWS:
    registry.register(_row)
# The same, as {collective: {algorithm: function}}: ALGORITHMS["allreduce"]["ring"](t, x, SUM).
ALGORITHMS = {c: {row.name: row.run for row in ROWS if row.collective == c} for c in registry.COLLECTIVES}
register_extension("scatter_gather", scatter_gather)
register_extension("allreduce_shm", shmem.allreduce_shm)

__all__ = ["CollectivesMixin", "CollectiveMismatch", "ALGORITHMS", "DEFAULTS", "Group", "SubComm", "UNDEFINED",
           "chunk_bounds", "chunk_sizes", "fold_roles", "classify_scatter_gather", "ScatterGather",
           "token_ring_barrier", "dissemination_barrier", "sharp"]


def token_ring_barrier(comm):
    """The seeds' token-ring barrier on a communicator (2p - 1 messages in a row)."""
    comm.barrier_with("token_ring")


def dissemination_barrier(comm):
    """Dissemination barrier (Hensgen, Finkel & Manber 1988): ceil(lg p) rounds."""
    comm.barrier_with("dissemination")
