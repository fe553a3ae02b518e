"""A rank whose function returns while others wait for it in a receive or a collective makes them
fail within 2 s with an error naming the rank that left (before: a hang until the run's timeout).

Each time is judged against a baseline measured in the same test (a run that does nothing), so
the promise holds on a loaded machine. Under fork, spawn and forkserver. (The barrier, served
by the launching process, is covered in tests/test_runtime_barrier_rank_left.py.)
"""
from __future__ import annotations

import numpy as np
import pytest

from course_lib import ANY_SOURCE

from runtime_checks import failure_and_baseline


def rank0_leaves_others_receive(comm):
    if comm.rank == 0:
        comm.send("before leaving", dest=1)
        return "left"
    if comm.rank == 1:
        assert comm.recv(source=0) == "before leaving"  # what was sent before leaving still arrives
    comm.recv(source=0)


def rank0_leaves_others_allreduce(comm):
    if comm.rank == 0:
        return "left"
    comm.allreduce(np.ones(1000))


def only_rank1_stays_receiving_any(comm):
    if comm.rank != 1:
        return "left"
    comm.recv(source=ANY_SOURCE)


@pytest.mark.parametrize("fn", [rank0_leaves_others_receive, rank0_leaves_others_allreduce])
def test_waiting_for_a_rank_that_returned_fails_naming_it(cluster3, fn):
    text, elapsed, baseline = failure_and_baseline(cluster3, fn)
    assert "rank 0" in text and "returned" in text, text
    assert elapsed < baseline + 2.0, (elapsed, baseline)


def test_any_source_with_every_neighbour_gone_fails_naming_them(cluster3):
    text, elapsed, baseline = failure_and_baseline(cluster3, only_rank1_stays_receiving_any)
    assert "rank 0" in text and "rank 2" in text and "returned" in text, text
    assert elapsed < baseline + 2.0, (elapsed, baseline)
