"""No lost worker output, and nothing left behind by a failing run or an unclosed Cluster.

Every line a worker prints during a run has been written in the parent by the time run()
returns: each worker sends its lines down its own log channel as it prints them, then a
marker, then its result, and the parent reads the channel up to the marker before it takes
the result. Threads and descriptors are counted in the parent before and after.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

import pytest

from course_lib import Cluster, WorkerError

from runtime_checks import assert_clean

METHODS = ["fork", "spawn", "forkserver"]
LINES = 8000


class Collector:
    """A sys.stdout that keeps what the parent writes (the worker lines go there as they arrive)."""

    def __init__(self):
        self.parts: list[str] = []

    def write(self, text):
        self.parts.append(text)
        return len(text)

    def flush(self):
        pass

    def lines(self) -> list[str]:
        return "".join(self.parts).splitlines()


def print_lines(comm, n):
    for i in range(n):
        print(f"line {i} of rank {comm.rank}")
    return comm.rank


def print_until_rank_0_fails(comm):
    if comm.rank == 0:
        print("rank 0 is about to raise")
        time.sleep(0.2)
        raise ValueError("rank 0 fails on purpose")
    for i in range(10 ** 6):
        print(f"rank {comm.rank} keeps printing, line {i}")


def rank_only(comm):
    return comm.rank


def closes_its_stdout(comm):
    with open(os.devnull, "w") as sys.stdout:  # leaves sys.stdout closed when the block ends
        print("this goes to /dev/null")
    return comm.rank * 10


def prints_after(comm):
    print(f"rank {comm.rank} prints again")
    return comm.rank


def threads_and_descriptors() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


def settled_counts(expected: tuple[int, int], within: float = 3.0) -> tuple[int, int]:
    """The counts, once they are back to ``expected`` (or after ``within`` s)."""
    deadline = time.perf_counter() + within
    counts = threads_and_descriptors()
    while counts != expected and time.perf_counter() < deadline:
        time.sleep(0.05)
        counts = threads_and_descriptors()
    return counts


@pytest.mark.parametrize("start_method", METHODS)
def test_every_printed_line_has_arrived_in_order_when_run_returns(start_method, monkeypatch):
    out = Collector()
    monkeypatch.setattr(sys, "stdout", out)
    with Cluster(2, start_method=start_method, timeout=120) as c:
        assert list(c.run(print_lines, LINES)) == [0, 1]
        lines = out.lines()  # at return: not a moment later
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] line {i} of rank {rank}" for i in range(LINES)], (
            f"rank {rank}: {len(mine)} of {LINES} lines had arrived when run() returned")
    assert_clean()


@pytest.mark.parametrize("start_method", METHODS)
def test_failing_runs_while_others_print_leave_no_thread_or_descriptor(start_method, monkeypatch):
    out = Collector()
    monkeypatch.setattr(sys, "stdout", out)
    with Cluster(3, start_method=start_method, timeout=60) as c:
        c.run(rank_only)
        before = threads_and_descriptors()
        for _ in range(3):
            with pytest.raises(WorkerError) as info:
                c.run(print_until_rank_0_fails)
            assert info.value.rank == 0 and "fails on purpose" in str(info.value)
            assert "[rank 0] rank 0 is about to raise" in out.lines()  # the failing rank's lines came first
        assert list(c.run(rank_only)) == [0, 1, 2]
        after = settled_counts(before)
        assert after == before, f"(threads, descriptors): {before} before three failing runs, {after} after"
    assert_clean()


@pytest.mark.parametrize("start_method", METHODS)
def test_a_cluster_dropped_without_close_leaves_no_thread_or_descriptor(start_method):
    with Cluster(1, start_method=start_method) as warm:  # starts the fork server and resource tracker
        warm.run(rank_only)
    before = threads_and_descriptors()
    c = Cluster(2, start_method=start_method)
    assert list(c.run(rank_only)) == [0, 1]
    del c
    gc.collect()
    after = settled_counts(before)
    assert after == before, f"(threads, descriptors): {before} before a Cluster dropped unclosed, {after} after"
    assert_clean()


@pytest.mark.parametrize("start_method", METHODS)
def test_a_worker_that_leaves_sys_stdout_closed_still_returns_its_result(start_method, monkeypatch):
    out = Collector()
    monkeypatch.setattr(sys, "stdout", out)
    with Cluster(2, start_method=start_method, timeout=60) as c:
        assert list(c.run(closes_its_stdout)) == [0, 10]
        assert list(c.run(prints_after)) == [0, 1]  # the same workers, their output routed again
        assert {"[rank 0] rank 0 prints again", "[rank 1] rank 1 prints again"} <= set(out.lines())
    assert_clean()
