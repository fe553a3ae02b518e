"""Consistency models as a gate on reads: sequential, eventual, bounded delay.

Every worker ``w`` has a clock ``c_w``: the number of iterations it has finished (pushed).
A worker at clock ``t`` that wants to read (pull) for its next iteration may do so only if

    min_w c_w  >=  t - tau                                      (bounded delay, SSP)

so the value it reads contains every update of every worker up to ``tau`` iterations behind
it. ``tau = 0`` is the sequential (bulk synchronous) model; ``tau = inf`` is eventual
consistency: never wait. The server checks the gate with the clocks it has heard of and
defers a read until it holds (Li et al., OSDI 2014, section 3.3; Ho et al., NIPS 2013).
"""
from __future__ import annotations

import math

from course_lib.reference.ex05 import may_read  # noqa: F401  (question ex05_2)

INF = math.inf


def ssp_violations(reads, tau) -> list:
    """Reads ``(t, min_clock_at_serve)`` that broke ``min_clock >= t - tau``."""
    return [(t, m) for t, m in reads if tau != INF and m < t - tau]


def model_name(tau) -> str:
    return "sequential" if tau == 0 else "eventual" if tau == INF else f"bounded delay {tau}"


__all__ = ["INF", "may_read", "ssp_violations", "model_name"]
