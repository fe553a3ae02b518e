"""isend/issend never block the caller: sends are queued per peer and written by a sender thread.

Two ranks that each isend more than a Pipe holds to the other *before* receiving complete (in
mpi4py too); order per (source, destination, tag) is kept; a send that fails in the background
names the rank; no sender thread outlives the run. Under fork, spawn and forkserver.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from course_lib import Cluster, WorkerError

from runtime_checks import assert_clean

METHODS = ["fork", "spawn", "forkserver"]
RUN_TIMEOUT = 30  # today's code deadlocks in these exchanges until this timeout


@pytest.fixture(scope="module", params=METHODS)
def cluster(request):
    with Cluster(2, start_method=request.param, timeout=RUN_TIMEOUT) as c:
        yield c
    assert_clean()


# ---------------------------------------------------------------- worker functions
def isend_all_then_receive(comm, count, nbytes):
    """Each rank isends ``count`` arrays of ``nbytes`` to the other before receiving any."""
    other = 1 - comm.rank
    n = nbytes // 8
    start = time.perf_counter()
    requests = [comm.isend(np.full(n, 1000 * comm.rank + i, dtype=np.float64), dest=other, tag=7)
                for i in range(count)]
    posting = time.perf_counter() - start
    got = [comm.recv(source=other, tag=7) for _ in range(count)]
    for r in requests:
        r.wait()
    return posting, [float(a[0]) for a in got], [float(a[-1]) for a in got]


def issend_all_then_receive(comm, count, nbytes):
    other = 1 - comm.rank
    requests = [comm.issend(np.full(nbytes // 8, i, dtype=np.float64), dest=other) for i in range(count)]
    got = [float(comm.recv(source=other)[0]) for _ in range(count)]
    for r in requests:
        r.wait()
    return got


def mixed_tags_and_blocking_send(comm):
    """Rank 0 isends with two tags, then sends blocking: per (source, dest, tag) order holds, and
    the blocking send does not overtake the queued isends (rank 1 receives tag 1 first)."""
    if comm.rank == 0:
        big = np.zeros(400_000)
        requests = [comm.isend((i, big), dest=1, tag=i % 2) for i in range(6)]
        comm.send(("last", None), dest=1, tag=1)
        for r in requests:
            r.wait()
        return None
    odds = [comm.recv(source=0, tag=1)[0] for _ in range(4)]
    evens = [comm.recv(source=0, tag=0)[0] for _ in range(3)]
    return evens, odds


def sender_threads(comm):
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(f"rank{comm.rank}-send"))


def isend_to_a_dead_peer(comm):
    if comm.rank == 1:
        import os
        os._exit(3)
    time.sleep(0.5)  # rank 1 is gone by now
    req = comm.isend(np.zeros(1_000_000), dest=1)
    req.wait()


def isend_unpicklable_never_waited(comm):
    if comm.rank == 0:
        comm.isend(threading.Lock(), dest=1)  # fails in the background; nobody waits for it
    return "returned"


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("count, nbytes", [(2, 1_600_000), (500, 4096)])
def test_isend_before_receiving_never_blocks(cluster, count, nbytes):
    start = time.perf_counter()
    res = cluster.run(isend_all_then_receive, count, nbytes)
    elapsed = time.perf_counter() - start
    assert elapsed < RUN_TIMEOUT / 2
    for rank, (posting, firsts, lasts) in enumerate(res):
        other = 1 - rank
        assert firsts == lasts == [1000.0 * other + i for i in range(count)]  # order kept
        assert posting < elapsed  # the isends returned before the exchange could complete


def test_issend_before_receiving_completes(cluster):
    assert cluster.run(issend_all_then_receive, 3, 1_600_000) == [[0.0, 1.0, 2.0]] * 2


def test_order_per_tag_kept_and_blocking_send_does_not_overtake(cluster):
    evens, odds = cluster.run(mixed_tags_and_blocking_send)[1]
    assert evens == [0, 2, 4]
    assert odds == [1, 3, 5, "last"]


def test_no_sender_thread_survives_the_run(cluster):
    cluster.run(isend_all_then_receive, 2, 1_600_000)
    assert cluster.run(sender_threads) == [[], []]


@pytest.mark.parametrize("start_method", METHODS)
def test_a_failed_background_send_names_the_rank(start_method):
    with Cluster(2, start_method=start_method, timeout=RUN_TIMEOUT) as c:
        with pytest.raises(WorkerError) as info:
            c.run(isend_to_a_dead_peer)
    assert "rank 1" in str(info.value)
    assert_clean()


def test_a_failed_isend_nobody_waited_for_is_reported(cluster):
    with pytest.raises(WorkerError) as info:
        cluster.run(isend_unpicklable_never_waited)
    text = str(info.value)
    assert "rank 0" in text and "isend to rank 1" in text and "lock" in text

