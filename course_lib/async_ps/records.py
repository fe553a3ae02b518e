"""What the asynchronous server records of each gradient, and its default step size.

Apart from :mod:`course_lib.async_ps.parameter_server` so the server's apply step (question ex03_1,
:mod:`course_lib.reference.ex03`) can use them without importing the server it serves.
"""
from __future__ import annotations

from typing import NamedTuple


class Record(NamedTuple):
    """One gradient that reached the server."""

    worker: int      # rank that computed it
    version: int     # server version it was computed on
    staleness: int   # server version when it arrived - version
    time: float      # arrival time (seconds since the run started)
    applied: bool    # False if the policy dropped it
    lr: float        # step size used (0.0 if dropped)


def constant_lr(lr: float, staleness: int) -> float:
    """Step size of plain async SGD: ``lr`` whatever the staleness."""
    return lr
