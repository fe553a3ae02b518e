"""Two or more threads receiving on one communicator (a threaded parameter server) work.

Before, two threads could read the same Pipe at once and corrupt its stream
(``UnpicklingError: invalid load key '\\x00'``, then a hang). Now each link is read by one
thread at a time and a message read by one thread for another waits for it in the queue of
unexpected messages. Under fork, spawn and forkserver.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from course_lib import ANY_SOURCE, Cluster

from runtime_checks import assert_clean

METHODS = ["fork", "spawn", "forkserver"]
RUN_TIMEOUT = 60


@pytest.fixture(scope="module", params=METHODS)
def cluster(request):
    with Cluster(3, start_method=request.param, timeout=RUN_TIMEOUT) as c:
        yield c
    assert_clean()


def _in_threads(targets) -> list:
    """Run each target in its own thread; return their errors (none expected)."""
    errors = []

    def guarded(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _sizes(i: int) -> int:
    return (8, 5_000, 300_000)[i % 3]  # small, a few Pipe reads, more than a Pipe holds


# ---------------------------------------------------------------- worker functions
def any_source_handlers(comm, rounds):
    """Two server threads each take gradients from whichever worker sends (ANY_SOURCE)."""
    if comm.rank == 0:
        got = []

        def handler():
            for _ in range(rounds):
                g = comm.recv(source=ANY_SOURCE, tag=1)
                got.append((int(g[0]), int(g[-1]), g.size))

        errors = _in_threads([handler, handler])
        return errors, sorted(got)
    for i in range(rounds):
        comm.send(np.full(_sizes(i), 1000 * comm.rank + i), dest=0, tag=1)
    return None


def one_thread_per_worker(comm, rounds):
    """One server thread per worker, each answering its worker; the workers also wait for each
    other every round, so a thread that blocks the other's link would deadlock the server."""
    if comm.rank == 0:
        sums = {}

        def serve(w):
            total = 0
            for i in range(rounds):
                g = comm.recv(source=w, tag=1)
                total += int(g[0])
                comm.send(np.full(_sizes(i), i), dest=w, tag=2)
            sums[w] = total

        errors = _in_threads([lambda: serve(1), lambda: serve(2)])
        return errors, sums
    other = 3 - comm.rank
    for i in range(rounds):
        if comm.rank == 2:  # worker 2 speaks first, worker 1 only after hearing from it
            comm.send(np.full(_sizes(i), i), dest=0, tag=1)
            comm.send(i, dest=other, tag=3)
        else:
            assert comm.recv(source=other, tag=3) == i
            comm.send(np.full(_sizes(i), i), dest=0, tag=1)
        assert int(comm.recv(source=0, tag=2)[0]) == i
    return None


def same_source_two_tags(comm, rounds):
    """Two threads receive from rank 1 with different tags; rank 1 sends tag 2 first and waits
    for the answer before it sends tag 1, so the tag-1 thread reads the tag-2 message for the other."""
    if comm.rank == 0:
        seen = {1: [], 2: []}

        def take(tag):
            for _ in range(rounds):
                seen[tag].append(int(comm.recv(source=1, tag=tag)[0]))
                if tag == 2:
                    comm.send("ok", dest=1, tag=9)

        errors = _in_threads([lambda: take(1), lambda: take(2)])
        return errors, seen
    if comm.rank == 1:
        for i in range(rounds):
            comm.send(np.full(_sizes(i), i), dest=0, tag=2)
            assert comm.recv(source=0, tag=9) == "ok"
            comm.send(np.full(_sizes(i + 1), i), dest=0, tag=1)
    return None


def irecv_in_one_thread_recv_in_another(comm, rounds):
    if comm.rank == 0:
        seen = {"irecv": [], "recv": []}

        def by_irecv():
            for _ in range(rounds):
                seen["irecv"].append(int(comm.irecv(source=1, tag=1).wait()[0]))

        def by_recv():
            for _ in range(rounds):
                seen["recv"].append(int(comm.recv(source=2, tag=1)[0]))

        errors = _in_threads([by_irecv, by_recv])
        return errors, seen
    for i in range(rounds):
        comm.send(np.full(_sizes(i), i), dest=0, tag=1)
    return None


# ---------------------------------------------------------------- tests
def test_two_threads_receiving_from_any_source(cluster):
    rounds = 60
    errors, got = cluster.run(any_source_handlers, rounds)[0]
    assert errors == []
    expected = sorted((1000 * w + i, 1000 * w + i, _sizes(i)) for w in (1, 2) for i in range(rounds))
    assert got == expected


def test_one_thread_per_worker_with_workers_waiting_on_each_other(cluster):
    rounds = 40
    errors, sums = cluster.run(one_thread_per_worker, rounds)[0]
    assert errors == []
    assert sums == {1: sum(range(rounds)), 2: sum(range(rounds))}


def test_two_threads_receiving_one_source_by_tag(cluster):
    rounds = 40
    errors, seen = cluster.run(same_source_two_tags, rounds)[0]
    assert errors == []
    assert seen == {1: list(range(rounds)), 2: list(range(rounds))}


def test_irecv_in_one_thread_and_recv_in_another(cluster):
    rounds = 40
    errors, seen = cluster.run(irecv_in_one_thread_recv_in_another, rounds)[0]
    assert errors == []
    assert seen == {"irecv": list(range(rounds)), "recv": list(range(rounds))}
