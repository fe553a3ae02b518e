"""Lesson 02: instructor-only checks (not shipped with the exercises)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
from course_lib.questions.ex02 import (
    assert_merge,
    assert_rd_allgather,
    assert_ring_allreduce,
    assert_switch,
    assert_time,
    merged,
    summary,
)
from course_lib.reference.ex02 import ring_allreduce_time


@hidden_check("ex02_1", case="n not a multiple of p, n < p, integer and float32 dtypes, one worker")
def ragged_and_dtypes(ns):
    fn = ns["ring_allreduce"]
    assert_ring_allreduce(fn, 5, 3, dtype=np.int64, seed=11)       # n < p: two chunks are empty
    assert_ring_allreduce(fn, 3, 7, dtype=np.float32, seed=12)
    assert_ring_allreduce(fn, 1, 4, seed=13)                        # one worker: nothing to send


@hidden_check("ex02_2", case="other worker counts, shapes and dtypes")
def other_sizes(ns):
    assert_rd_allgather(ns["rd_allgather"], 2, (2, 2), dtype=np.float32, seed=14)
    assert_rd_allgather(ns["rd_allgather"], 8, (5,), dtype=np.int32, seed=15)


@hidden_check("ex02_3", case="shards of unequal sizes and an empty shard")
def uneven_and_empty_shards(ns):
    fn = ns["merge_stats"]
    rng = np.random.default_rng(16)
    x = rng.standard_normal((12, 3)) + 5
    assert_merge(fn, [x[:5], x[5:6], x[6:]], what="shards of 5, 1 and 6 rows: ")
    empty = (0, np.zeros(3), np.zeros(3))
    n, mean, m2 = merged(fn, empty, summary(x), "an empty shard merged with 12 rows: ")
    _, want_mean, want_m2 = summary(x)
    assert n == 12 and np.allclose(mean, want_mean) and np.allclose(m2, want_m2), (
        "merging an empty shard (count 0) with another must give the other summary back unchanged.")


@hidden_check("ex02_4", case="one worker, many workers")
def one_worker_and_large_p(ns):
    fn = ns["ring_allreduce_time"]
    assert_time(fn, 1, 1e6, 1e-5, 1e-9, 1e-10, 0.0)                  # one worker communicates nothing
    for args in ((64, 1e8, 2e-6, 1e-10, 5e-11), (3, 12345.0, 7e-6, 3e-9, 1e-9)):
        assert_time(fn, *args, ring_allreduce_time(*args))


@hidden_check("ex02_5", case="other host counts, windows and dtypes, a partial last chunk, the switch at other ranks")
def other_hosts_windows_and_dtypes(ns):
    fn = ns["switch_loop"]
    with hidden_property("wrong with other host counts, windows or dtypes, or a last chunk that is not full"):
        assert_switch(fn, 5, 33, np.float32, 16, 1, seed=17)     # stop-and-wait: 9 chunks, the last of 1 value
        assert_switch(fn, 4, 64, np.int64, 32, 3, seed=18)       # 16 chunks, three in flight
        assert_switch(fn, 1, 5, np.float64, 64, 2, seed=19)      # one host: the sum is its own vector
    with hidden_property("wrong when the switch is not the last rank (the hosts are the ranks in `hosts`)"):
        assert_switch(fn, 3, 20, np.float64, 64, 2, seed=20, switch=0)    # the switch first, hosts 1, 2, 3
        assert_switch(fn, 4, 24, np.int32, 32, 2, seed=21, switch=2)      # the switch among the hosts
