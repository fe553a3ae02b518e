"""The emulated network on real processes: the sender's uplink and the receiver's downlink.

The model (course_lib/runtime/netem.py): a message of n bytes over a link of bandwidth B
keeps the sender busy n / B and is delivered at max(ready_at, free + n / B) by the
receiver's downlink. So p senders to one receiver take about p * n / B (incast), one
sender's stream is unchanged, and the counts of messages and bytes do not depend on it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from course_lib import Cluster, Network
from course_lib.runtime.netem import Downlink

from runtime_checks import assert_clean

N_BYTES = 200_000
BANDWIDTH = 20e6             # 200 kB in 10 ms per link
TRANSMIT = N_BYTES / BANDWIDTH


@pytest.fixture(scope="module")
def cluster4():
    with Cluster(4, start_method="fork", timeout=30) as c:
        yield c
    assert_clean()


def gather_at_zero(comm, senders, repeats=3):
    """Ranks 1..senders send n bytes to rank 0 as soon as it says go; rank 0's best time from its
    go (no sender starts before it, so p n / B is a true lower bound) to the last message."""
    best = math.inf
    for _ in range(repeats):
        comm.barrier()
        if comm.rank == 0:
            start = comm.now()
            for dest in range(1, senders + 1):
                comm.send(None, dest)                 # a few bytes: microseconds at 20 MB/s
            for source in range(1, senders + 1):
                comm.recv(source=source)
            best = min(best, comm.now() - start)
        elif comm.rank <= senders:
            comm.recv(source=0)
            comm.send(np.zeros(N_BYTES, dtype=np.uint8), 0)
    return best


def stream_to_zero(comm, count):
    """Rank 1 sends ``count`` messages of n bytes to rank 0, back to back after its go; rank 0's time."""
    comm.barrier()
    if comm.rank == 0:
        start = comm.now()
        comm.send(None, 1)
        for _ in range(count):
            comm.recv(source=1)
        return comm.now() - start
    if comm.rank == 1:
        comm.recv(source=0)
        for _ in range(count):
            comm.send(np.zeros(N_BYTES, dtype=np.uint8), 0)


def test_the_downlink_formula():
    """delivered = max(ready_at, free + n / B); free = delivered."""
    link = Downlink()
    assert link.deliver(1.0, 0.5) == 1.0              # a lone message: its ready_at
    assert link.deliver(1.0, 0.5) == 1.5              # a second one ready at the same time waits 0.5
    assert link.deliver(1.2, 0.5) == 2.0
    assert link.deliver(5.0, 0.5) == 5.0              # the downlink was free long before
    assert Network().downlink and Network().is_instant and Network(downlink=False).is_instant


@pytest.mark.timing
def test_incast_p_senders_take_p_transmissions(cluster4):
    """Three workers send 200 kB at once to one server over 20 MB/s links: about 3 x 10 ms,
    against 10 ms for one sender and for three senders when only the sender is charged."""
    net = Network(bandwidth=BANDWIDTH)
    runs = {"one": [], "three": [], "sender_only": []}
    for _ in range(3):    # in turns, fastest kept: another program only adds time (one sender: 13 ms once)
        runs["one"].append(cluster4.run(gather_at_zero, 1, network=net)[0])
        runs["three"].append(cluster4.run(gather_at_zero, 3, network=net)[0])
        runs["sender_only"].append(
            cluster4.run(gather_at_zero, 3, network=Network(bandwidth=BANDWIDTH, downlink=False))[0])
    one, three, sender_only = (min(runs[k]) for k in ("one", "three", "sender_only"))
    assert 0.9 * TRANSMIT <= one < 2.0 * TRANSMIT, one
    assert 0.9 * 3 * TRANSMIT <= three < 3 * TRANSMIT + 0.02, three
    assert 2.4 < three / one < 3.6, (three, one)
    assert sender_only < 2.0 * TRANSMIT, sender_only        # the old model: no incast


def stream_deliveries(comm, count):
    """``stream_to_zero``, with rank 0's downlink recording (ready_at, delivered) of each message."""
    if comm.rank == 0:
        downlink, seen = comm._downlink, []
        deliver = downlink.deliver

        def recording(ready_at, transmit):
            delivered = deliver(ready_at, transmit)
            seen.append((ready_at, delivered))
            return delivered

        downlink.deliver = recording
        elapsed = stream_to_zero(comm, count)
        return elapsed, seen
    stream_to_zero(comm, count)


def test_one_senders_stream_is_unchanged_by_the_downlink(cluster4):
    """The uplink already spaces one sender's messages n / B apart, so the downlink delivers
    each of them at its own ready_at: it adds nothing, whatever the machine's load. Wall time
    only bounds the run from below (another program can add time, never remove it)."""
    elapsed, seen = cluster4.run(stream_deliveries, 4, network=Network(bandwidth=BANDWIDTH))[0]
    assert len(seen) == 4
    assert all(delivered == ready_at for ready_at, delivered in seen), seen
    gaps = np.diff([ready_at for ready_at, _ in seen])
    assert (gaps >= TRANSMIT).all(), gaps                   # the uplink's spacing, n / B
    assert elapsed >= 0.9 * 4 * TRANSMIT, elapsed


def test_incast_shows_as_network_wait_and_keeps_the_counts(cluster4):
    """The receiver's extra time is traced as "wait" labelled "network"; the messages and bytes
    counted are those of an instant network."""
    res = cluster4.run(gather_at_zero, 3, 1, network=Network(bandwidth=BANDWIDTH))
    instant = cluster4.run(gather_at_zero, 3, 1)
    waits = res.timeline.of(rank=0, kind="wait")
    network_wait = sum(e.duration for e in waits if e.label == "network")
    assert network_wait >= 0.9 * 2 * TRANSMIT, network_wait   # the 2nd and 3rd message wait behind the 1st
    assert np.array_equal(res.stats.bytes, instant.stats.bytes)
    assert np.array_equal(res.stats.messages, instant.stats.messages)
    assert res.stats.bytes_received(0) == 3 * N_BYTES


@pytest.mark.timing
def test_per_link_bandwidth_is_the_downlinks_too(cluster4):
    """A slow link (1 -> 0) occupies the downlink for its own n / B: 3 senders, one of them 4x slower."""
    net = Network(bandwidth=BANDWIDTH, links={(1, 0): (0.0, BANDWIDTH / 4)})
    t = cluster4.run(gather_at_zero, 3, network=net)[0]
    # rank 1's message is ready after 4 n / B and read first; ranks 2 and 3 then take n / B each
    assert 0.9 * 6 * TRANSMIT <= t < 6 * TRANSMIT + 0.03, t


def ring_shifts_timing_cpu(comm, rounds):
    """Shift a small array around the ring ``rounds`` times; (CPU s, wall s, spins its waits?)."""
    import time

    a = np.zeros(16)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        a = comm.sendrecv(a, dest=(comm.rank + 1) % comm.size, source=(comm.rank - 1) % comm.size)
    return time.process_time() - cpu, time.perf_counter() - wall, comm._spin_waits


def test_more_ranks_than_cores_wait_for_the_network_without_spinning():
    """With more ranks than cores a rank that spins out its emulated wait holds a core another rank
    needs (16 gossip nodes on 2 cores beside other work: lesson 04 took 270 s instead of 26 s), so
    such ranks sleep instead, and the emulated latency still holds: 40 shifts at 1 ms take >= 40 ms."""
    from course_lib.runtime.shm_sync import usable_cpus

    p = max(8, usable_cpus() + 1)
    rounds, latency = 40, 1e-3
    with Cluster(p, start_method="fork", timeout=30) as c:
        res = c.run(ring_shifts_timing_cpu, rounds, network=Network(latency=latency))
    assert not any(spin for _, _, spin in res)
    assert min(wall for _, wall, _ in res) >= rounds * latency
    assert_clean()


def test_a_rank_per_core_spins_out_its_waits_for_precision(cluster4):
    from course_lib.runtime.shm_sync import usable_cpus

    res = cluster4.run(ring_shifts_timing_cpu, 2, network=Network(latency=1e-3))
    assert all(spin == (4 <= usable_cpus()) for _, _, spin in res)
