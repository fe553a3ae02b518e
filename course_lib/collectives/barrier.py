"""Barrier algorithms: nobody leaves until everybody has arrived.

Tokens are empty arrays, so a barrier moves messages but zero payload bytes.

* ``token_ring`` (the version of the course's source notes, listed in the README): rank 0
  passes a token around the ring; when it comes back every rank has arrived; a second lap
  releases them.
  2p - 1 messages in sequence: time (2p - 1) alpha.
* ``dissemination`` (Hensgen, Finkel & Manber 1988): in round k every rank signals
  rank + 2^k and waits for rank - 2^k; after ceil(lg p) rounds each rank has heard,
  directly or not, from all others. ceil(lg p) alpha, for any p. It is the runtime's
  barrier of messages (``comm.barrier_with()``), so its code and cost row live in
  :mod:`course_lib.runtime.base_collectives`; it is imported here to sit beside the token ring.
"""
from __future__ import annotations

import numpy as np

from ..runtime.base_collectives import barrier_dissemination as dissemination  # noqa: F401  (see above)
from ..runtime.registry import Algorithm
from ._p2p import TrafficCount


def _token():
    return np.empty(0, dtype=np.uint8)


def token_ring(t) -> None:
    p, r = t.size, t.rank
    if p == 1:
        return
    right, left = (r + 1) % p, (r - 1) % p
    if r == 0:
        t.send(_token(), right)   # lap 1: "rank 0 has arrived"
        t.recv(left)              # token back: everybody has arrived
        t.send(_token(), right)   # lap 2: release
    else:
        t.recv(left)
        t.send(_token(), right)
        t.recv(left)
        if r != p - 1:
            t.send(_token(), right)


# -- cost row (tokens are empty: messages, no bytes) ------------------------------------------------
def _token_ring_traffic(p, n, itemsize, root, ndim):
    count = TrafficCount(p, itemsize)
    for r in range(p):
        count.add(r, 0, 1 if r == p - 1 else 2)   # the last rank does not pass the release on
    return count.result()


# this lesson's variants only: the runtime registers dissemination itself
ROWS = [
    Algorithm("barrier", "token_ring", token_ring, "(2p-1) alpha",
              seconds=lambda p, n, a, b, c: (2 * p - 1) * a if p > 1 else 0.0,
              rounds=lambda p: 2 * p - 1, traffic=_token_ring_traffic),
]
