"""Collective communication (lesson 02), built from point-to-point messages.

Every algorithm is a plain function of a transport (``rank``, ``size``, ``send``,
``recv``, ``sendrecv``; see :mod:`._p2p`), grouped by collective in ``ALGORITHMS``::

    ALGORITHMS["allreduce"]["ring"](t, x, SUM)

On a communicator the same algorithms are methods with mpi4py's arguments and an
extra ``algorithm=`` keyword (``comm.allreduce(x, op=SUM, algorithm="ring")``); the
runtime's ``Comm`` inherits :class:`CollectivesMixin`. Costs: :mod:`course_lib.costs`.

Two homes, one per algorithm. The algorithm each collective runs by default (binomial
bcast, ring allgather, ring / recursive-doubling / Rabenseifner allreduce, ...) belongs to
the runtime (:mod:`course_lib.runtime.base_collectives`), which registers it itself, so the
communicator works with no lesson imported. This lesson's modules import those from there,
to teach them beside the variants they are compared with, and register only the variants
(token-ring barrier, flat trees, scatter-allgather bcast, recursive-doubling allgather,
Bruck all-to-all, reduce + bcast allreduce, recursive-halving reduce-scatter, linear scan)
when this package is imported. ``ALGORITHMS`` lists both.

Modules: barrier, broadcast (bcast/scatter/gather), allgather, alltoall, reduction
(reduce, reduce_scatter, scan, exscan), allreduce, scatter_gather (the source notes' ScatterGather),
shmem (shared-memory allreduce), sharp (in-network aggregation: an allreduce summed by a
switch process, Graham et al. 2016), sync_batchnorm (SyncBatchNorm: batch statistics merged
by an allreduce), message_rounds (who sends what to whom, round by round, and its drawings),
sim (in-process simulator for quick tests). Groups (Split, Group, sub-communicators) are the
runtime's (:mod:`course_lib.runtime.groups`), re-exported here.
"""
from ..runtime import registry
from ..runtime.base_collectives import DEFAULTS
from ..runtime.collective_api import CollectivesMixin, register_extension
from ..runtime.groups import UNDEFINED, Group, SubComm
from . import allgather, allreduce, alltoall, barrier, broadcast, reduction, sharp, shmem
from ._p2p import CollectiveMismatch, chunk_bounds, chunk_sizes, fold_roles
from .scatter_gather import classify as classify_scatter_gather
from .scatter_gather import scatter_gather
from .scatter_gather import (
    scatter_gather as ScatterGather,  # the source notes' name: ScatterGather(comm, data, src, dst, unit, total)
)

# Every variant of this lesson is a row (function, time formula, rounds, exact traffic) that the
# runtime's communicators and the cost model (course_lib.costs) read alike, as they read the
# runtime's own rows.
ROWS = [*barrier.ROWS, *broadcast.ROWS, *allgather.ROWS, *alltoall.ROWS, *reduction.ROWS, *allreduce.ROWS]
for _row in ROWS:
    registry.register(_row)
# Every algorithm a communicator can run, the runtime's and this lesson's, as
# {collective: {algorithm: function}}: ALGORITHMS["allreduce"]["ring"](t, x, SUM).
ALGORITHMS = {c: {name: row.run for name, row in sorted(registry.algorithms(c).items())} for c in registry.COLLECTIVES}
register_extension("scatter_gather", scatter_gather)
register_extension("allreduce_shm", shmem.allreduce_shm)

__all__ = ["CollectivesMixin", "CollectiveMismatch", "ALGORITHMS", "DEFAULTS", "Group", "SubComm", "UNDEFINED",
           "chunk_bounds", "chunk_sizes", "fold_roles", "classify_scatter_gather", "ScatterGather",
           "token_ring_barrier", "dissemination_barrier", "sharp"]


def token_ring_barrier(comm):
    """The source notes' token-ring barrier on a communicator (2p - 1 messages in a row)."""
    comm.barrier_with("token_ring")


def dissemination_barrier(comm):
    """Dissemination barrier (Hensgen, Finkel & Manber 1988): ceil(lg p) rounds."""
    comm.barrier_with("dissemination")
