"""Instructor checks of lesson 06 (more worker counts, uneven shards, offsets)."""
from course_lib.grading import hidden_check
from course_lib.questions.ex06 import (check_column_forward, check_measured, check_measured_real,
                                       check_predicted, check_row_backward, check_row_forward)


@hidden_check("ex06_1")
def ex06_1_more(ns):
    f = ns["column_parallel_forward"]
    check_column_forward(f, 1, gather=True)
    check_column_forward(f, 4, gather=True, d_hidden=10)   # uneven shards 3,3,2,2
    check_column_forward(f, 4, gather=False, d_hidden=10)


@hidden_check("ex06_2")
def ex06_2_more(ns):
    f = ns["row_parallel_forward"]
    check_row_forward(f, 1)
    check_row_forward(f, 2)
    check_row_forward(f, 4, d_hidden=10)


@hidden_check("ex06_3")
def ex06_3_more(ns):
    f = ns["row_parallel_backward"]
    check_row_backward(f, 2)
    check_row_backward(f, 4, d_hidden=10)


@hidden_check("ex06_4")
def ex06_4_more(ns):
    check_predicted(ns["predicted_bubble"], [(p, m) for p in (1, 2, 5, 8) for m in (1, 3, 16, 64)])


@hidden_check("ex06_5")
def ex06_5_more(ns):
    f = ns["measured_bubble"]
    check_measured(f, 4, 8, offset=2.5)
    check_measured(f, 2, 1, offset=0.7)
    check_measured_real(f, 4, 6)
