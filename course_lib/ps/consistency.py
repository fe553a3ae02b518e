"""Consistency models as a gate on reads: sequential, eventual, bounded delay.

Every worker ``w`` has a clock ``c_w``: the number of iterations it has finished (pushed).
A worker at clock ``t`` that wants to read (pull) for its next iteration may do so only if

    min_w c_w  >=  t - tau                                      (bounded delay, SSP)

so the value it reads contains every update of every worker up to ``tau`` iterations behind
it. ``tau = 0`` is the sequential (bulk synchronous) model; ``tau = inf`` is eventual
consistency: never wait. The server checks the gate with the clocks it has heard of and
defers a read until it holds (Li et al., OSDI 2014, section 3.5, flexible consistency).

Ho et al. (NIPS 2013) named the bounded-delay model *stale synchronous parallel* (SSP): a worker
may run at most ``tau`` iterations ahead of the slowest. The *SSP invariant*, checked by
:func:`ssp_violations` on every recorded read: the reader's clock minus the smallest clock when
the read was served is at most ``tau``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from course_lib.reference.ex05 import may_read  # question ex05_2

INF = math.inf


def may_answer_pull(pull_clock: float, worker_clocks: Sequence[float], staleness: float) -> bool:
    """The stale synchronous parallel (SSP) read gate: may a server answer now a pull made at ``pull_clock``?

    Worker ``w``'s clock ``c_w`` counts the iterations it has finished and pushed; a worker at clock
    ``t`` pulls the parameters for its iteration ``t``. With staleness bound ``s`` the pull is answered
    once the slowest worker is within ``s`` iterations of the reader::

        min_w c_w  >=  t - s

    Then the values read contain every update of every worker from iterations ``0 .. t - s - 1`` (and
    perhaps later ones), and no worker runs more than ``s`` clocks ahead of the slowest: the bounded
    staleness condition of Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server", NIPS 2013. ``s = 0`` is the sequential (bulk synchronous) model, ``s = inf``
    eventual consistency (never wait). A finished or dead worker's clock is ``inf``: it holds no one
    back; with no worker clock at all nothing does.

    The comparison is question ex05_2's :func:`may_read`, so the server gates its reads with the
    student's own answer in the student release."""
    clocks = list(worker_clocks)
    return not clocks or bool(may_read(pull_clock, clocks, staleness))


class Read(NamedTuple):
    """A pull a server answered: who, at which clock, the slowest worker's clock then, how long it waited."""
    worker: int
    clock: int
    slowest_clock: float
    seconds_deferred: float


def ssp_violations(reads, tau) -> list:
    """Reads ``(t, min_clock_at_serve)`` that broke ``min_clock >= t - tau``."""
    return [(t, m) for t, m in reads if tau != INF and m < t - tau]


def model_name(tau) -> str:
    """The consistency model a bound ``tau`` gives: 0 sequential, INF eventual, else bounded delay."""
    return "sequential" if tau == 0 else "eventual" if tau == INF else f"bounded delay {tau}"


__all__ = ["INF", "may_read", "may_answer_pull", "Read", "ssp_violations", "model_name"]
