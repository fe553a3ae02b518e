"""Lesson 00, the cluster in your laptop: visible checks.

ex00_1  sum_shard(comm, sa)                 each worker sums its block of a shared array
ex00_2  fit_latency_bandwidth(sizes, times) least squares fit of  t = latency + size / bandwidth
ex00_3  ring_pass(comm, token)              pass a token once around a ring with send/recv
"""
import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_number,
    as_sequence,
    assert_unchanged,
    call_keeping_inputs,
    num,
    readable,
    same,
    shown,
)

CHECK_TIMEOUT = 6.0  # seconds a check's cluster run may take (these runs take well under one)


# ------------------------------------------------------------------------------ ex00_1
@harness
def run_sum_shard(fn, values, n_workers):
    """Run ``fn(comm, sa)`` on a cluster sharing ``values``; return (per-rank results, the array after)."""
    from course_lib import Cluster

    with Cluster(n_workers, timeout=CHECK_TIMEOUT) as cluster:
        sa = cluster.share(np.asarray(values, dtype=np.float64))
        res = cluster.run(fn, sa)
        return [readable(r) for r in res], np.array(sa.array)


def assert_shard_sums(fn, values, n_workers, want):
    """Rank r must return ``want[r]``, the sum of its block, and leave the shared array as it was."""
    values = np.asarray(values, dtype=np.float64)
    res, after = run_sum_shard(fn, values, n_workers)
    n = len(values)
    if len(res) != n_workers:
        raise AssertionError(f"expected one result per rank ({n_workers}), got {len(res)}.")
    assert_unchanged("sum_shard", ["sa.array"], [values], [after])
    split = (f"the first n % size = {n % n_workers} block(s) one value longer" if n % n_workers
             else "here all of the same length")
    # the course's split is numpy's own: block r of np.array_split, the first n % size blocks one value longer
    starts = np.cumsum([0] + [len(block) for block in np.array_split(values, n_workers)])
    got = [as_number(v, f"rank {r}'s result (the sum of its block, a float)") for r, v in enumerate(res)]
    wrong = [r for r in range(n_workers) if not np.isclose(got[r], want[r], rtol=1e-12, atol=1e-12)]
    if not wrong:
        return
    # The other usual split, r*n//size, puts the longer blocks last: name it, so the fix is the convention.
    floor = [(r * n // n_workers, (r + 1) * n // n_workers) for r in range(n_workers)]
    if all(np.isclose(got[r], float(values[lo:hi].sum()), rtol=1e-12, atol=1e-12) for r, (lo, hi) in enumerate(floor)):
        r = wrong[0]
        raise AssertionError(
            f"with n={n} values on {n_workers} workers, your blocks are those of the r*n//size convention "
            f"(rank {r} summed sa.array[{floor[r][0]}:{floor[r][1]}]), which puts the longer blocks last. The "
            f"course splits as np.array_split does ({split}), so rank {r}'s block is "
            f"sa.array[{starts[r]}:{starts[r + 1]}].")
    r = wrong[0]
    raise AssertionError(
        f"with n={n} values on {n_workers} workers, rank {r} should return the sum of its block "
        f"sa.array[{starts[r]}:{starts[r + 1]}] (np.array_split's blocks, {split}), got {num(got[r])}.")


@question("ex00_1", points=2, title="Sum your shard", names=("sum_shard",))
def ex00_1(ns):
    """Write ``sum_shard(comm, sa)``: rank r of `size` workers sums its contiguous block of the
    shared array, block r of ``np.array_split(sa.array, size)`` (the first n % size blocks one
    value longer), and returns it as a float."""
    # 12 values 1..12 on 3 workers: blocks [1..4], [5..8], [9..12]
    assert_shard_sums(ns["sum_shard"], np.arange(1.0, 13.0), 3, [10.0, 26.0, 42.0])
    # 7 values on 2 workers: blocks of 4 and 3 (7 % 2 = 1: the first block is the longer one)
    assert_shard_sums(ns["sum_shard"], np.array([0.5, 1.5, -2.0, 4.0, 8.0, 16.0, 32.0]), 2, [4.0, 56.0])


# ------------------------------------------------------------------------------ ex00_2
def assert_fit(fn, sizes, times, latency, bandwidth, rtol=1e-6):
    """``fn(sizes, times)`` must give the least squares (latency, bandwidth) and keep its inputs."""
    out = call_keeping_inputs(fn, (sizes, times), ("sizes", "times"))
    lat, bw = as_sequence(out, 2, "fit_latency_bandwidth's result (latency_seconds, bandwidth_bytes_per_second)",
                          kinds=(tuple, list))
    lat = as_number(lat, "the latency (seconds)")
    bw = as_number(bw, "the bandwidth (bytes per second)")
    assert np.isclose(bw, bandwidth, rtol=rtol, atol=0), (
        f"expected a bandwidth of {num(bandwidth)} B/s (1 / the slope of the least squares line), got "
        f"{num(bw)} B/s" + (": that is the slope itself, seconds per byte." if np.isclose(bw, 1 / bandwidth, rtol=1e-3)
                            else "; fit one straight line through all the rows by least squares."))
    assert np.isclose(lat, latency, rtol=rtol, atol=0), (
        f"expected a latency of {num(latency)} s (the intercept of the least squares line), got {num(lat)} s"
        + ("; the smallest time is not the intercept." if np.isclose(lat, min(times), rtol=1e-9) else "."))


@question("ex00_2", points=2, title="Fit latency and bandwidth", names=("fit_latency_bandwidth",))
def ex00_2(ns):
    """Write ``fit_latency_bandwidth(sizes, times)``: fit ``time = latency + size / bandwidth`` by
    least squares on a ping-pong table and return ``(latency_seconds, bandwidth_bytes_per_second)``."""
    fn = ns["fit_latency_bandwidth"]
    # exact times of a 20 us, 2 GB/s link
    sizes = np.array([0, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22], dtype=float)
    assert_fit(fn, sizes, 20e-6 + sizes / 2e9, 20e-6, 2e9)
    # measured times (noisy): the least squares line has latency 49.96 us and bandwidth 492.9 MB/s
    sizes = np.array([1000, 4000, 16000, 64000, 256000, 1024000], dtype=float)
    times = np.array([5.254e-05, 5.943e-05, 8.281e-05, 1.710e-04, 5.773e-04, 2.126e-03])
    assert_fit(fn, sizes, times, 4.9961179253252146e-05, 492902043.6562145)


# ------------------------------------------------------------------------------ ex00_3
@harness
def run_ring(fn, n_workers, token):
    """Run ``fn(comm, token)`` on a ring; return (per-rank results, messages[src, dst])."""
    import networkx as nx

    from course_lib import Cluster

    with Cluster(n_workers, graph=nx.cycle_graph(n_workers), timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(fn, token)
        return [readable(r) for r in res], np.asarray(res.stats.messages)


def assert_ring(fn, n_workers, token, want):
    """Rank 0 must return ``want``, the others None, after one message per link of the ring."""
    res, m = run_ring(fn, n_workers, token)
    assert same(res[0], want), (
        f"on a ring of {n_workers}, rank 0 should get back {shown(want)}, got {shown(res[0])}. "
        "Rank r receives from (r-1) % size and sends to (r+1) % size.")
    others = [r for r in range(1, n_workers) if res[r] is not None]
    assert not others, (f"ranks other than 0 should return None; rank {others[0]} returned {shown(res[others[0]])}.")
    for r in range(n_workers):
        nxt = (r + 1) % n_workers
        assert m[r, nxt] == 1, f"rank {r} should send exactly one message to rank {nxt}, it sent {int(m[r, nxt])}."
    assert int(m.sum()) == n_workers, f"a ring pass takes {n_workers} messages, yours took {int(m.sum())}."


@question("ex00_3", points=1, title="Pass the token around the ring", names=("ring_pass",))
def ex00_3(ns):
    """Write ``ring_pass(comm, token)``: rank 0 sends ``[token]`` to rank 1; every other rank receives
    the list from its left neighbour, appends its rank and sends it to its right neighbour; rank 0
    receives the list back and returns it. Other ranks return None."""
    assert_ring(ns["ring_pass"], 4, "hello", ["hello", 1, 2, 3])
