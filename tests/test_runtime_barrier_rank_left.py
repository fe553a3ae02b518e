"""A barrier waits for every rank. A rank whose function returns can never reach it, so the
others must fail within 2 s with an error naming the rank that left, whichever came first:

* the rank returned before the others reached the barrier (before the fix: the barrier
  completed without it, a silent wrong answer);
* the rank returned while the others waited in it (before the fix: a hang until the run's
  timeout).

An honest barrier still waits for the last rank. Sub-communicator barriers (messages between the
members, not the launching process) behave the same way. Each time is judged against a baseline
measured in the same test (a run that does nothing), so the promise holds on a loaded machine.
Under fork, spawn and forkserver.
"""
from __future__ import annotations

import time

import pytest

from course_lib.runtime.comm import PeerReturned

from runtime_checks import failure_and_baseline

LATE_S = 0.5      # how long one side waits so that the other surely went first



def rank0_returns_before_the_barrier(comm):
    if comm.rank == 0:
        return "left"
    time.sleep(LATE_S)  # rank 0's RunDone reaches the parent first
    comm.barrier()


def rank0_returns_while_the_others_wait(comm):
    if comm.rank == 0:
        time.sleep(LATE_S)  # ranks 1 and 2 are in the barrier by now
        return "left"
    comm.barrier()


def rank0_leaves_between_barriers(comm):
    comm.barrier()  # an honest one, every rank takes part
    if comm.rank == 0:
        return "left"
    comm.barrier()


def rank0_returns_others_catch(comm):
    """The error is PeerReturned, which a rank can catch like any other."""
    if comm.rank == 0:
        return "left"
    if comm.rank == 2:
        time.sleep(LATE_S)  # rank 1 arrives before rank 0 returns, rank 2 after
    try:
        comm.barrier()
    except PeerReturned as exc:
        return exc.ranks, str(exc)
    return "released"


@pytest.mark.parametrize("fn", [rank0_returns_before_the_barrier, rank0_returns_while_the_others_wait,
                                rank0_leaves_between_barriers])
def test_a_barrier_with_a_rank_that_returned_fails_naming_it(cluster3, fn):
    text, elapsed, baseline = failure_and_baseline(cluster3, fn)
    assert "waits in a barrier for rank 0, which returned from its function" in text, text
    assert "PeerReturned" in text, text
    # the sleep of the slower side is part of the run, not of the failure
    assert elapsed < baseline + LATE_S + 2.0, (elapsed, baseline)


def test_the_error_is_peer_returned_naming_the_rank(cluster3):
    results = cluster3.run(rank0_returns_others_catch)
    assert results[0] == "left"
    ranks, text = results[1]
    assert ranks == [0], results
    assert text.startswith("rank 1 waits in a barrier for rank 0, which returned from its function"), text
    # rank 1 caught the error and returned before rank 2 arrived: rank 2 is told of both
    ranks, text = results[2]
    assert ranks == [0, 1], results
    assert text.startswith("rank 2 waits in a barrier for rank 0, rank 1, which returned from their function"), text


def honest_barriers(comm, rounds):
    """Each round one rank arrives late; nobody may leave the barrier before it arrived."""
    out = []
    for r in range(rounds):
        late = r % comm.size
        if comm.rank == late:
            time.sleep(0.1)
            arrived = time.time()
            comm.barrier()
            out.append(("arrived", arrived))
        else:
            comm.barrier()
            out.append(("left", time.time()))
    return out


def test_an_honest_barrier_waits_for_the_last_rank(cluster3):
    rounds = 6
    results = cluster3.run(honest_barriers, rounds)
    for r in range(rounds):
        late = r % 3
        kind, arrived = results[late][r]
        assert kind == "arrived"
        for rank in range(3):
            if rank != late:
                kind, left = results[rank][r]
                assert kind == "left" and left >= arrived, (r, rank, left, arrived)


def sub_barrier_rank0_returns(comm, before: bool):
    sub = comm.Split(color=0 if comm.rank < 2 else 1, key=comm.rank)
    if comm.rank == 0:
        if not before:
            time.sleep(LATE_S)
        return "left"
    if comm.rank == 1:
        if before:
            time.sleep(LATE_S)
        sub.barrier()
    return "not in it"


@pytest.mark.parametrize("before", [True, False], ids=["returned-before", "returned-while-waiting"])
def test_a_sub_communicator_barrier_with_a_rank_that_returned_fails_naming_it(cluster3, before):
    text, elapsed, baseline = failure_and_baseline(cluster3, lambda comm: sub_barrier_rank0_returns(comm, before))
    assert "rank 1 waits" in text and "rank 0, which returned" in text, text
    assert elapsed < baseline + LATE_S + 2.0, (elapsed, baseline)
