"""Allreduce: every rank gets op over all ranks' vectors.

n = bytes of the vector each rank contributes, gamma = seconds per byte of reduction
work. Costs from Thakur, Rabenseifner & Gropp (2005), p a power of two:

* ``reduce_bcast``: 2 lg p alpha + 2 lg p n beta + lg p n gamma;
* ``recursive_doubling``: lg p (alpha + n beta + n gamma) (best for tiny messages);
* ``ring`` = ring reduce-scatter + ring allgather (Patarasuk & Yuan 2009): 2(p-1) steps,
  bandwidth-optimal; its alpha-beta-gamma time is question ex02_4 (below);
* ``rabenseifner`` = recursive-halving reduce-scatter + recursive-doubling allgather
  (Rabenseifner 2004): the ring's bytes in 2 lg p steps.

When p is not a power of two, recursive doubling and Rabenseifner first fold p down to the
largest power of two p2 (the first 2(p - p2) ranks pair up) and unfold at the end.
``reduce_bcast``, ``recursive_doubling`` and ``rabenseifner`` combine contributions in rank
order, so an associative but non-commutative op is fine there; ``ring`` needs a commutative op.

Recursive doubling, the ring and Rabenseifner are what ``comm.allreduce`` chooses among by
default (:func:`course_lib.runtime.base_collectives.allreduce_default`): their code and cost
rows live in :mod:`course_lib.runtime.base_collectives` and are imported here. This lesson adds
``reduce_bcast``, the runtime's binomial reduce followed by its binomial bcast, and the ring's
time: it is question ex02_4, whose answer (:func:`course_lib.reference.ex02.ring_allreduce_time`,
in the student release the student's own) this module attaches to the runtime's ring row, so
:func:`course_lib.costs.predict` and every lesson that prices a ring run on that answer.
"""
from __future__ import annotations

from ..runtime import registry
from ..runtime.base_collectives import (  # noqa: F401  (the runtime's defaults, taught here too)
    allreduce_rabenseifner,
    allreduce_recursive_doubling,
    allreduce_ring,
    bcast_binomial,
    reduce_binomial,
)
from ..runtime.registry import Algorithm
from ._p2p import TrafficCount, binomial_children, ceil_log2


def allreduce_reduce_bcast(t, obj, op):
    return bcast_binomial(t, reduce_binomial(t, obj, op, 0), 0)


# -- cost rows (n: the vector of each rank) -------------------------------------------------
def _allreduce_reduce_bcast_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        k = (1 if r != 0 else 0) + len(binomial_children(r, p))
        count.add(r, n * k, k)
    return count.result()


def _ring_allreduce_seconds(p, n, a, b, c):
    from course_lib.reference.ex02 import ring_allreduce_time  # question ex02_4
    return float(ring_allreduce_time(p, n, a, b, c))


registry.attach_seconds("allreduce", "ring", _ring_allreduce_seconds)

# this lesson's variant only: the runtime registers recursive doubling, the ring and Rabenseifner itself
ROWS = [
    Algorithm("allreduce", "reduce_bcast", allreduce_reduce_bcast, "2 lg p alpha + 2 lg p n beta + lg p n gamma",
              seconds=lambda p, n, a, b, c: ceil_log2(p) * (2 * a + 2 * n * b + n * c),
              traffic=_allreduce_reduce_bcast_traffic),
]
