"""Lesson 07, beyond one machine: visible checks.

ex07_1  bus_bandwidth(nbytes, seconds, p)                        algorithm and bus bandwidth of an allreduce
ex07_2  place_ranks(hosts, n)                                    (host, local rank) of each rank under mpiexec
ex07_3  ring_allreduce_seconds(nbytes, p, latency_s, line_rate_gbit)  ring allreduce time on a real link
"""
import numpy as np

from course_lib.grading import question
from course_lib.questions import as_int, as_number, as_sequence, call_keeping_inputs, num, shown


# ------------------------------------------------------------------------------ ex07_1
def assert_bus_bandwidth(fn, nbytes, seconds, p, algbw, busbw):
    """``fn(nbytes, seconds, p)`` must return (algbw, busbw) in bytes per second."""
    out = fn(nbytes, seconds, p)
    got_alg, got_bus = as_sequence(out, 2, "bus_bandwidth's result (algbw, busbw)", kinds=(tuple, list))
    got_alg = as_number(got_alg, "the algorithm bandwidth (bytes per second)")
    got_bus = as_number(got_bus, "the bus bandwidth (bytes per second)")
    assert np.isclose(got_alg, algbw, rtol=1e-9, atol=0), (
        f"an allreduce of {num(nbytes)} bytes in {num(seconds)} s has an algorithm bandwidth of "
        f"{num(algbw)} B/s (bytes / seconds), got {num(got_alg)}.")
    hint = ""
    if algbw and np.isclose(got_bus, algbw, rtol=1e-9) and not np.isclose(busbw, algbw):
        hint = " That is the algorithm bandwidth: multiply it by 2(p-1)/p."
    elif algbw and np.isclose(got_bus, algbw * 2 * (p - 1), rtol=1e-9) and p > 1:
        hint = " The factor is 2(p-1)/p, the share of the vector each rank sends in a ring allreduce."
    assert np.isclose(got_bus, busbw, rtol=1e-9, atol=0), (
        f"with p={p} ranks the bus bandwidth should be {num(busbw)} B/s, got {num(got_bus)}.{hint}")


@question("ex07_1", points=2, title="Bus bandwidth of an allreduce", names=("bus_bandwidth",))
def ex07_1(ns):
    """Write ``bus_bandwidth(nbytes, seconds, p)``: the algorithm bandwidth ``nbytes / seconds``
    and the bus bandwidth ``algbw * 2(p-1)/p`` (NCCL-tests' convention for allreduce), both in
    bytes per second, as a tuple."""
    fn = ns["bus_bandwidth"]
    # 1 GB in 0.1 s on 8 ranks: 10 GB/s of algorithm bandwidth, 17.5 GB/s on the bus
    assert_bus_bandwidth(fn, 1e9, 0.1, 8, 1e10, 1.75e10)
    # on 2 ranks the factor 2(p-1)/p is 1
    assert_bus_bandwidth(fn, 4 * 2 ** 20, 2e-3, 2, 2097152000.0, 2097152000.0)


# ------------------------------------------------------------------------------ ex07_2
def assert_placement(fn, hosts, n, want):
    """``fn(hosts, n)`` must give ``want``: one (host, local_rank) per rank."""
    out = call_keeping_inputs(fn, (hosts, n), ("hosts", "n"))
    if not isinstance(out, (list, tuple)) or len(out) != n:
        raise AssertionError(f"place_ranks should return a list of {n} (host, local_rank) pairs, got {shown(out)}.")
    for rank, (got, (host, local)) in enumerate(zip(out, want)):
        got_host, got_local = as_sequence(got, 2, f"the entry of rank {rank} (host, local_rank)", kinds=(tuple, list))
        got_local = as_int(got_local, f"rank {rank}'s local rank")
        assert got_host == host and got_local == local, (
            f"with hosts {shown(hosts)} and n={n}, rank {rank} should run on {host!r} with local rank {local}, "
            f"got ({shown(got_host)}, {got_local}). Ranks fill each host's slots in order, wrap around to the "
            "first host when every slot is taken, and a local rank counts the ranks on the same host.")


@question("ex07_2", points=2, title="Where mpiexec puts each rank", names=("place_ranks",))
def ex07_2(ns):
    """Write ``place_ranks(hosts, n)``: ``hosts`` lists (name, slots) as a host file does; return,
    for ranks 0..n-1, the pair (host, local_rank) that MPICH's mpiexec gives them by default."""
    fn = ns["place_ranks"]
    # the host file of the lesson: node01:4, node02:4, 8 ranks
    assert_placement(fn, [("node01", 4), ("node02", 4)], 8,
                     [("node01", 0), ("node01", 1), ("node01", 2), ("node01", 3),
                      ("node02", 0), ("node02", 1), ("node02", 2), ("node02", 3)])
    # more ranks than slots: wrap around, local ranks keep counting
    assert_placement(fn, [("a", 2), ("b", 1)], 5, [("a", 0), ("a", 1), ("b", 0), ("a", 2), ("a", 3)])


# ------------------------------------------------------------------------------ ex07_3
def assert_ring_seconds(fn, nbytes, p, latency_s, rate_gbit, want):
    got = as_number(call_keeping_inputs(fn, (nbytes, p, latency_s, rate_gbit),
                                        ("nbytes", "p", "latency_s", "line_rate_gbit")),
                    "ring_allreduce_seconds' result (seconds)")
    beta = 8 / (rate_gbit * 1e9)
    hint = ""
    if np.isclose(got, 2 * (p - 1) * latency_s + 2 * (p - 1) / p * nbytes * beta / 8, rtol=1e-6):
        hint = " A line rate in Gb/s is bits: divide by 8 for bytes."
    elif np.isclose(got, 2 * (p - 1) / p * nbytes * beta, rtol=1e-6):
        hint = " The 2(p-1) messages on the critical path each pay the latency."
    assert np.isclose(got, want, rtol=1e-9, atol=0), (
        f"a ring allreduce of {num(nbytes)} bytes on {p} ranks over a {num(rate_gbit)} Gb/s link with "
        f"{num(latency_s)} s latency should take {num(want)} s, got {num(got)}.{hint}")


@question("ex07_3", points=2, title="Predict an allreduce on a real link", names=("ring_allreduce_seconds",))
def ex07_3(ns):
    """Write ``ring_allreduce_seconds(nbytes, p, latency_s, line_rate_gbit)``: the ring allreduce time
    2(p-1) alpha + 2 (p-1)/p n beta, with alpha the latency and beta one over the link's bandwidth
    in bytes per second (its line rate is given in Gb/s, per direction, as on a data sheet)."""
    fn = ns["ring_allreduce_seconds"]
    # 100 MB on 8 ranks over 100 Gb/s Ethernet with 25 us latency: 0.35 ms of latency + 14 ms of bytes
    assert_ring_seconds(fn, 100e6, 8, 25e-6, 100, 0.01435)
    # 2 ranks: two messages, each rank sends n bytes in all
    assert_ring_seconds(fn, 1e6, 2, 1e-6, 8, 0.001002)
