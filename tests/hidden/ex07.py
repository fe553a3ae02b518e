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
    with hidden_property("wrong for a single rank, which sends nothing"):
        assert_bus_bandwidth(fn, 1000, 1e-3, 1, 1e6, 0.0)
    with hidden_property("wrong for other numbers of ranks"):
        assert_bus_bandwidth(fn, 3 * 2 ** 20, 0.25, 3, 12582912.0, 12582912.0 * 4 / 3)
        assert_bus_bandwidth(fn, 512, 7e-6, 64, 512 / 7e-6, 512 / 7e-6 * 126 / 64)
    with hidden_property("wrong when the arguments are numpy scalars"):
        assert_bus_bandwidth(fn, np.int64(2 ** 30), np.float64(0.5), np.int64(16), 2 ** 31, 2 ** 31 * 30 / 16)


@hidden_check("ex07_2", case="hosts of unequal sizes, more ranks than slots, no ranks, a host listed twice, "
                              "hosts not sorted by name")
def uneven_hosts_and_wrapping(ns):
    fn = ns["place_ranks"]
    for hosts, n, kind in [([("n1", 3), ("n2", 1), ("n3", 2)], 13,
                            "wrong for hosts of unequal sizes and more ranks than slots"),
                           ([("solo", 1)], 4, "wrong for a single host and more ranks than slots"),
                           ([("x", 2), ("y", 2)], 3, "wrong with fewer ranks than slots"),
                           ([["gpu0", 8], ["gpu1", 8]], 16, "wrong when each host is a list rather than a tuple"),
                           ([("a", 1), ("b", 1)], 0, "wrong when there are no ranks to place"),
                           ([("a", 1), ("b", 2), ("a", 2)], 7,
                            "wrong when a host is listed twice (its local ranks count all its ranks)")]:
        with hidden_property(kind):
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
        with hidden_property("wrong for the links of the hardware table (their latencies and line rates)"):
            for nbytes, p in [(4096, 2), (25e6, 16), (1e9, 3)]:
                assert_ring_seconds(fn, nbytes, p, link.latency_s, rate_gbit,
                                    ring_allreduce_seconds(nbytes, p, link.latency_s, rate_gbit))
    with hidden_property("wrong for a single rank, which has nothing to send"):
        assert_ring_seconds(fn, 1e6, 1, 1e-6, 10, 0.0)


#: The kinds of scheduler state, in the order the check tries them (the simplest first).
NO_NEXT = "does not return None when every job is finished"
AT_START = "wrong at the start, when no group has run yet"
AFTER = "does not give the next slice to the first unfinished group after the running one"
WRAP = "wrong when the next unfinished group comes by wrapping around past the last group"
ALONE = "wrong when the running group's job is the only one left"
OWN_DONE = "wrong when the running group's own job is finished"
KINDS = (NO_NEXT, AT_START, AFTER, WRAP, ALONE, OWN_DONE)


def state_kind(current, finished, want):
    """The kind of a scheduler state, as a failure names it."""
    if want is None:
        return NO_NEXT
    if current is None:
        return AT_START
    if current in finished:
        return OWN_DONE
    if want == current:
        return ALONE
    return AFTER if want > current else WRAP


@hidden_check("ex07_4", case="every state of a few groups, real jobs finishing at different times")
def every_state_and_three_real_jobs(ns):
    fn = ns["next_group"]
    kinds = {kind: {} for kind in KINDS}
    for n_groups in range(1, 6):
        for current, finished in every_state(n_groups):
            want = next_group(current, finished, n_groups)
            kinds[state_kind(current, finished, want)].setdefault(n_groups, []).append((current, finished, want))
    for kind, per_count in kinds.items():
        with hidden_property(kind):
            for n_groups, cases in per_count.items():
                assert_next_groups(fn, n_groups, cases)
    # three real jobs finishing at different times: each one's slices go to those still running
    with hidden_property("wrong in a real run of jobs that finish at different times",
                 (("was over, yet your rule gave it slices", "a finished job still gets time slices"),
                  ("ran at the same time", "two jobs run at the same time"),
                  ("never resumed", "some job is never resumed"),
                  ("stopped before the last job was over", "the scheduler stops before the last job is over"))):
        assert_gang_run(fn, (3, 12, 30), 0.008)
