"""Lesson 07: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib import hardware
from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions.ex07 import (
    assert_bus_bandwidth,
    assert_gang_run,
    assert_next_groups,
    assert_placement,
    assert_ring_seconds,
    every_state,
)
from course_lib.reference.ex07 import next_group, place_ranks, ring_allreduce_seconds


@hidden_check("ex07_1", case="other rank counts, one rank, numpy scalars")
def other_rank_counts(ns):
    fn = ns["bus_bandwidth"]
    assert_bus_bandwidth(fn, 1000, 1e-3, 1, 1e6, 0.0)              # one rank sends nothing
    assert_bus_bandwidth(fn, 3 * 2 ** 20, 0.25, 3, 12582912.0, 12582912.0 * 4 / 3)
    assert_bus_bandwidth(fn, 512, 7e-6, 64, 512 / 7e-6, 512 / 7e-6 * 126 / 64)
    assert_bus_bandwidth(fn, np.int64(2 ** 30), np.float64(0.5), np.int64(16), 2 ** 31, 2 ** 31 * 30 / 16)


@hidden_check("ex07_2", case="hosts of unequal sizes, more ranks than slots, no ranks, hosts not sorted by name")
def uneven_hosts_and_wrapping(ns):
    fn = ns["place_ranks"]
    for hosts, n in [([("n1", 3), ("n2", 1), ("n3", 2)], 13), ([("solo", 1)], 4), ([("x", 2), ("y", 2)], 3),
                     ([["gpu0", 8], ["gpu1", 8]], 16), ([("a", 1), ("b", 1)], 0)]:
        with hidden_property("wrong for hosts of unequal sizes, more ranks than slots, or no ranks"):
            assert_placement(fn, hosts, n, place_ranks(hosts, n))
    # the host file's order, not the names' order: mpiexec fills the hosts as listed
    for hosts, n in [([("zeta", 2), ("alpha", 1), ("mid", 3)], 9), ([("node10", 1), ("node9", 2)], 4)]:
        with hidden_property("fails when the host list is not sorted by name (fill hosts in the order given)"):
            assert_placement(fn, hosts, n, place_ranks(hosts, n))


@hidden_check("ex07_3", case="every link of the hardware table, one rank")
def every_link_of_the_table(ns):
    fn = ns["ring_allreduce_seconds"]
    for link in hardware.links():
        rate_gbit = link.bandwidth_Bps * 8 / 1e9
        for nbytes, p in [(4096, 2), (25e6, 16), (1e9, 3)]:
            assert_ring_seconds(fn, nbytes, p, link.latency_s, rate_gbit,
                                ring_allreduce_seconds(nbytes, p, link.latency_s, rate_gbit))
    assert_ring_seconds(fn, 1e6, 1, 1e-6, 10, 0.0)                  # one rank: nothing to do


@hidden_check("ex07_4", case="every state of a few groups, real jobs finishing at different times")
def every_state_and_three_real_jobs(ns):
    fn = ns["next_group"]
    for n_groups in range(1, 6):
        cases = [(current, finished, next_group(current, finished, n_groups))
                 for current, finished in every_state(n_groups)]
        assert_next_groups(fn, n_groups, cases)
    # three real jobs finishing at different times: each one's slices go to those still running
    assert_gang_run(fn, (3, 12, 30), 0.008)
