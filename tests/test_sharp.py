"""In-network aggregation (course_lib.collectives.sharp) on real processes: the switch is a worker
that is not a host. Each host link must carry exactly the formula's bytes and messages each way,
the result must equal the single-process sum, and floats must be rounded in the switch's order."""
from __future__ import annotations

import math

import numpy as np
import pytest

import course_lib as cl
from course_lib import Network, costs
from course_lib.collectives import sharp

SWITCH = 9                                     # hosts are ranks 0..p-1 of a 10-worker cluster


@pytest.fixture(scope="module")
def cluster10():
    with cl.Cluster(10) as cluster:
        yield cluster


def vector(rank, n, dtype):
    """Integer-valued: every order of addition gives the exact sum."""
    return np.random.default_rng(rank).integers(-500, 500, n).astype(dtype)


def allreduce_by_switch(comm, p, n, dtype, chunk_bytes, slots):
    x = vector(comm.rank, n, dtype)
    return sharp.sharp_allreduce(comm, x, sharp.Fabric.first(p, SWITCH), chunk_bytes=chunk_bytes, slots=slots)


@pytest.mark.parametrize("p", range(1, 10))
def test_each_host_link_carries_n_up_and_n_down_in_the_formulas_messages(cluster10, p):
    n, dtype, chunk_bytes = 37 + 3 * p, np.float64, 64          # 8 float64 per chunk, a shorter last one
    res = cluster10.run(allreduce_by_switch, p, n, dtype, chunk_bytes, 3)
    fabric = sharp.Fabric.first(p, SWITCH)
    chunks = math.ceil(n / 8)
    assert sharp.link_traffic(res.stats, fabric) == {
        "up_bytes": [8 * n] * p, "down_bytes": [8 * n] * p, "up_messages": [chunks] * p, "down_messages": [chunks] * p}
    want_bytes, want_msgs = sharp.sharp_traffic(p, n, 8, chunk_bytes=chunk_bytes)
    ranks = [*range(p), SWITCH]
    assert [res.stats.bytes_sent(r) for r in ranks] == list(want_bytes)
    assert [res.stats.messages_sent(r) for r in ranks] == list(want_msgs)
    assert res.stats.total_bytes == 2 * p * 8 * n                   # nothing else moved: idle ranks sent nothing
    baseline = np.sum([vector(h, n, dtype) for h in range(p)], axis=0)
    for h in range(p):
        assert np.array_equal(res[h], baseline)
    report = res[SWITCH]
    assert report.chunks == chunks and 1 <= report.peak_slots_in_use <= 3
    assert all(sorted(order) == list(range(p)) for order in report.arrival_order)
    assert all(r is None for r in res[p:SWITCH])


def test_cost_row_traffic_with_the_default_chunk_matches_a_run(cluster10):
    p, n = 5, 20_000                                                # 80 kB of float32: 2 chunks of 64 kB
    res = cluster10.run(allreduce_by_switch, p, n, np.float32, sharp.CHUNK_BYTES, sharp.SLOTS)
    want_bytes, want_msgs = costs.traffic("allreduce", "sharp", p, n, 4)
    ranks = [*range(p), SWITCH]
    assert [res.stats.bytes_sent(r) for r in ranks] == list(want_bytes) == [4 * n] * p + [p * 4 * n]
    assert [res.stats.messages_sent(r) for r in ranks] == list(want_msgs) == [2] * p + [2 * p]


def float32_run(comm, p, n, chunk_bytes):
    x = np.random.default_rng(50 + comm.rank).standard_normal(n).astype(np.float32)
    return sharp.sharp_allreduce(comm, x, sharp.Fabric.first(p, SWITCH), chunk_bytes=chunk_bytes)


def test_float32_is_rounded_in_the_switchs_order_and_every_host_gets_the_same_bits(cluster10):
    p, n = 6, 3001
    net = Network(links={(h, SWITCH): (1e-3 * (p - h), math.inf) for h in range(p)}, downlink=False)
    res = cluster10.run(float32_run, p, n, 1024, network=net)
    xs = [np.random.default_rng(50 + h).standard_normal(n).astype(np.float32) for h in range(p)]
    report = res[SWITCH]
    for h in range(p):
        assert np.array_equal(res[h], res[0])
    assert np.array_equal(sharp.replay(xs, report), res[0])
    exact = np.sum(np.array(xs, dtype=np.float64), axis=0)
    bound = (p - 1) * np.finfo(np.float32).eps / 2 * np.abs(np.array(xs, dtype=np.float64)).sum(axis=0)
    assert np.all(np.abs(res[0] - exact) <= bound)                 # a sequential sum, in some order


def test_a_one_slot_switch_is_stop_and_wait_and_still_exact(cluster10):
    res = cluster10.run(allreduce_by_switch, 4, 1000, np.float32, 256, 1)
    assert res[SWITCH].peak_slots_in_use == 1 and res[SWITCH].peak_memory_bytes == 256
    assert np.array_equal(res[0], np.sum([vector(h, 1000, np.float32) for h in range(4)], axis=0))


def test_large_chunks_and_a_wide_window_do_not_deadlock(cluster10):
    """Chunks larger than a Pipe's buffer, every chunk in flight: the host and the switch must keep
    reading while they send (a blocking send on either side could wait for the other forever)."""
    res = cluster10.run(allreduce_by_switch, 2, 1 << 19, np.float64, 1 << 19, 16, timeout=20)
    assert np.array_equal(res[1], np.sum([vector(h, 1 << 19, np.float64) for h in range(2)], axis=0))


def test_time_formula_and_rounds():
    m = costs.CostModel(alpha=1e-3, beta=1e-8, gamma=1e-10)
    n = 3 * sharp.CHUNK_BYTES + 1000                                # last chunk: 1000 bytes
    want = 2 * m.alpha + n * m.beta + 1000 * m.beta + 3 * 1000 * m.gamma
    assert costs.predict("allreduce", "sharp", 4, n, m) == pytest.approx(want, rel=1e-12)
    assert costs.rounds("allreduce", "sharp", 8) == 2 == costs.rounds("allreduce", "sharp", 1)
    assert sharp.window_slots(1e-3, 1e-8, 10_000) == math.ceil((2e-3 + 2e-4) / 1e-4) + 1


@pytest.mark.timing
def test_latency_steps_are_two_whatever_p(cluster10):
    """time / latency on a latency-only network, one number per host: 2 steps (up, down) at p = 2 and 8."""
    def once(comm, p):
        x = np.ones(1)
        comm.barrier()
        t0 = comm.now()
        sharp.sharp_allreduce(comm, x, sharp.Fabric.first(p, SWITCH))
        return comm.now() - t0

    net = Network(latency=30e-3, downlink=False)
    for p in (2, 8):
        steps = max(cluster10.run(once, p, network=net)[:p]) / net.latency
        assert 2.0 <= steps < 3.0, (p, steps)         # Python's time only adds; a tree would take 2 lg p = 6
