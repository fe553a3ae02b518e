"""What every collective algorithm needs from the messaging layer, and small helpers.

An algorithm is a plain function ``alg(t, ...)`` of a *transport* ``t`` with
``t.rank``, ``t.size`` and ``t.send(obj, dest)``, ``t.recv(source)``,
``t.sendrecv(obj, dest, source)``. The same algorithm runs on real processes (the
communicator's collective methods) and in the in-process thread simulator
(:mod:`course_lib.collectives.sim`) used by the fast unit tests.

The helpers live in the runtime (:mod:`course_lib.runtime.algorithm_helpers`), whose own
algorithms are built from them too; this lesson's modules take them from here.
"""
from __future__ import annotations

from ..runtime.algorithm_helpers import (  # noqa: F401  (re-exported for this lesson's modules)
    TrafficCount,
    binomial_children,
    ceil_log2,
    chunk_bounds,
    chunk_sizes,
    fold_roles,
    folded_rounds,
    folded_seconds,
    halving_ranges,
    is_array,
    lowbit,
    need_array,
    need_commute,
    non_roots_send_once,
    pack_blocks,
    sent_fraction,
    unpack_blocks,
)
from ..runtime.collective_api import CollectiveMismatch  # noqa: F401  (the runtime's, re-used)
