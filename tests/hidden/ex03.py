"""Instructor checks of lesson 03 (other start methods, more workers, cost of an update)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.questions.ex03 import (check_apply_in_process, check_apply_slow_worker,
                                       check_expected_wait, check_hogwild_processes,
                                       check_hogwild_support, check_lr_values, time_per_update)


@hidden_check("ex03_1")
def ex03_1_more(ns):
    check_apply_slow_worker(ns["apply_update"])


@hidden_check("ex03_2")
def ex03_2_more(ns):
    check_lr_values(ns["staleness_aware_lr"], [(0.5, 2), (2.0, 99), (0.01, 0)])


@hidden_check("ex03_3")
def ex03_3_more(ns):
    from course_lib.async_ps import hogwild_worker

    f = ns["hogwild_worker"]
    check_hogwild_support(f, seed=5, n=300, d=40, nnz=6, updates=80)
    check_hogwild_processes(f, n_workers=3)
    # an update costs O(nnz), not O(d): no copy of the whole vector per update
    theirs, ours = time_per_update(f), time_per_update(hogwild_worker)
    assert theirs < 20 * ours + 50e-6, (
        f"one update took {theirs * 1e6:.0f} us on a vector of 2,000,000 coordinates with 5 non-zeros "
        f"per sample ({ours * 1e6:.0f} us for the reference): an update must cost O(nnz), not O(d)")


@hidden_check("ex03_4")
def ex03_4_more(ns):
    check_expected_wait(ns["expected_wait"], [(10, 0, 1.0), (10, 5, 3.0), (2, 8, 0.1)])
    got = ns["expected_wait"](1, 1, 1.0)
    assert np.isclose(got, 0.5), "the first of two exponentials(mean 1) finishes after 1/2 on average"
