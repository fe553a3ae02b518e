"""Lesson 02: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property, named_kinds
from course_lib.questions.ex02 import (
    DEADLOCK_TIMEOUT,
    assert_float32_merge,
    assert_merge,
    assert_rd_allgather,
    assert_ring_allreduce,
    assert_switch,
    assert_time,
    merged,
    summary,
)
from course_lib.reference.ex02 import ring_allreduce_time


def named(result, **more):
    """``within=`` of a visible assert: this lesson's phrase for each kind of assertion."""
    return named_kinds({"collective": "calls the course's own collectives (build it from send, recv and sendrecv)",
                        "inputs": "changes its input in place (compute into new arrays)",
                        "dtype": "returns an array of another dtype than its input's", **more}, otherwise=result)


@hidden_check("ex02_1", case="n not a multiple of p, n < p, integer and float32 dtypes, one worker")
def ragged_and_dtypes(ns):
    fn = ns["ring_allreduce"]
    more = {"inputs": "changes x in place (the chunks of np.array_split are views of x: copy them)",
            "traffic": "sends other than one chunk per step, as an array, in the reduce-scatter and the allgather"}
    assert_ring_allreduce(fn, 5, 3, seed=11, within=named("wrong when n < p (some chunks are empty)", **more))
    assert_ring_allreduce(fn, 3, 7, dtype=np.int64, seed=11, within=named("wrong for an integer array", **more))
    assert_ring_allreduce(fn, 3, 7, dtype=np.float32, seed=12, within=named("wrong for a float32 array", **more))
    assert_ring_allreduce(fn, 1, 4, seed=13,                        # one worker: nothing to send
                          within=named("wrong for one worker (there is nothing to send)", **more))


@hidden_check("ex02_1", case="long vectors on three workers")
def long_vectors(ns):
    # chunks of 320 kB: a send() waits for the matching recv(), so send-then-recv deadlocks on any ring
    assert_ring_allreduce(ns["ring_allreduce"], 3, 120_000, seed=22, timeout=DEADLOCK_TIMEOUT,
                          within=named("wrong for long vectors (a step must send and receive at once: sendrecv)"))


@hidden_check("ex02_2", case="other worker counts, shapes and dtypes")
def other_sizes(ns):
    traffic = ("sends other than one message per round, or other than every block it holds so far (concatenated "
               "into one array)")
    assert_rd_allgather(ns["rd_allgather"], 2, (2, 2), dtype=np.float32, seed=14,
                        within=named("wrong for blocks of more than one dimension, or of another dtype",
                                     traffic=traffic))
    assert_rd_allgather(ns["rd_allgather"], 8, (5,), dtype=np.int32, seed=15,
                        within=named("wrong for more workers (more rounds), or integer blocks", traffic=traffic))


@hidden_check("ex02_3", case="shards of unequal sizes and an empty shard")
def uneven_and_empty_shards(ns):
    fn = ns["merge_stats"]
    inputs = "changes a or b in place (return new arrays)"
    rng = np.random.default_rng(16)
    x = rng.standard_normal((12, 3)) + 5
    assert_merge(fn, [x[:5], x[5:6], x[6:]], what="shards of 5, 1 and 6 rows: ",
                 within=named("wrong when the shards have unequal sizes (weight by the counts)", inputs=inputs))
    empty = (0, np.zeros(3), np.zeros(3))
    within = named("wrong when a shard is empty (merging it must give the other summary back)", inputs=inputs)
    n, mean, m2 = merged(fn, empty, summary(x), "an empty shard merged with 12 rows: ", within)
    _, want_mean, want_m2 = summary(x)
    with within("result"):
        assert n == 12 and np.allclose(mean, want_mean) and np.allclose(m2, want_m2), (
            "merging an empty shard (count 0) with another must give the other summary back unchanged.")


@hidden_check("ex02_3", case="float32 data far from zero, shards of unequal sizes")
def float32_far_from_zero(ns):
    rng = np.random.default_rng(23)
    big = (5e3 + 0.5 * rng.standard_normal((3000, 1))).astype(np.float32)
    within = named("loses the variance of float32 data far from zero (merge with the delta term, not with sums of "
                   "squares)", inputs="changes a or b in place (return new arrays)")
    assert_float32_merge(ns["merge_stats"], big, [big[:700], big[700:2400], big[2400:]], within=within)


def terms(p, n, a, b, c):
    """The (latency, bandwidth, reduction) terms of the reference's ring allreduce time."""
    return tuple(ring_allreduce_time(p, n, *(x if k == j else 0.0 for k, x in enumerate((a, b, c)))) for j in range(3))


@hidden_check("ex02_4", case="one worker, many workers, an odd number of workers")
def one_worker_and_large_p(ns):
    fn = ns["ring_allreduce_time"]
    with hidden_property("wrong for one worker (it communicates nothing)"):
        assert_time(fn, 1, 1e6, 1e-5, 1e-9, 1e-10, (0.0, 0.0, 0.0))
    for args, kind in (((64, 1e8, 2e-6, 1e-10, 5e-11), "many"), ((3, 12345.0, 7e-6, 3e-9, 1e-9), "an odd number of")):
        with hidden_property(f"wrong for {kind} workers (count per rank the steps, the bytes of each step and the "
                             "bytes it adds)"):
            assert_time(fn, *args, terms(*args))


@hidden_check("ex02_5", case="other host counts, windows and dtypes, a partial last chunk, the switch at other ranks")
def other_hosts_windows_and_dtypes(ns):
    fn = ns["switch_loop"]
    more = {"finish": "the run does not finish: send each chunk's sum down as soon as every host's copy of it is in",
            "traffic": "does not send each host every chunk's sum exactly once, in the chunks' own dtype"}
    within = named("wrong with other host counts, windows or dtypes, or a last chunk that is not full", **more)
    assert_switch(fn, 5, 33, np.float32, 16, 1, seed=17, within=within)    # stop-and-wait: 9 chunks, the last of 1
    assert_switch(fn, 4, 64, np.int64, 32, 3, seed=18, within=within)      # 16 chunks, three in flight
    assert_switch(fn, 1, 5, np.float64, 64, 2, seed=19, within=within)     # one host: the sum is its own vector
    placement = "wrong when the switch is not the last rank (the hosts are the ranks in `hosts`)"
    within = named(placement, finish=placement, traffic=placement)   # a switch that talks to wrong ranks hangs
    assert_switch(fn, 3, 20, np.float64, 64, 2, seed=20, switch=0, within=within)  # the switch first, hosts 1, 2, 3
    assert_switch(fn, 4, 24, np.int32, 32, 2, seed=21, switch=2, within=within)    # the switch among the hosts
