"""What a failed question's message says (issue 29): an array is named with its type, a worker's
error by the worker's own exception, in-process (LocalCode: the same plain-data round trip and the
same messages as the sandbox)."""
from __future__ import annotations

import numpy as np

from course_lib.grading import run_question
from course_lib.grading.registry import Question
from course_lib.questions import as_number, shown


def test_an_array_is_named_with_its_dtype_and_shape():
    """Before: 'got [2e-05, 2e+09]', which reads as a list."""
    assert shown(np.array([2e-05, 2e+09])) == "ndarray float64 shape (2,): [2e-05, 2e+09]"
    assert shown(np.arange(100, dtype=np.int32)) == "ndarray int32 shape (100,): [0, 1, 2, 3, ...]"
    assert shown(np.array(["a", "b"])) == "ndarray <U1 shape (2,)"
    assert shown([np.array([1.0]), 2]) == "[[1], 2]"      # inside a list, the list is what is named
    try:
        as_number(np.array([2e-05, 2e+09]), "the latency")
    except AssertionError as e:
        assert str(e) == "the latency should be a number, got ndarray float64 shape (2,): [2e-05, 2e+09].", e


def _in_a_worker(values):
    from course_lib import Cluster

    def work(comm, values):
        if comm.rank == 1:
            return values[0] / 0
        return 0.0

    with Cluster(2) as cluster:
        return list(cluster.run(work, values))


def _question(hidden: bool) -> Question:
    def check(ns):
        ns["f"]([1.0])
    return Question("ex99_1", 1, "t", names=("f",), timeout=20,
                    visible=[] if hidden else [check], hidden=[check] if hidden else [])


def test_a_worker_error_names_the_workers_exception():
    """Before: '`f` raised WorkerError: rank 1 raised ZeroDivisionError: float division by zero.' with
    the runtime's frames in the traceback; on the grader's own inputs only 'raised WorkerError'."""
    r = run_question(_question(hidden=False), {"f": _in_a_worker}, timeout=20)
    assert r.status == "error"
    assert r.message == "`f` raised ZeroDivisionError: float division by zero (in worker rank 1).", r.message
    assert "ZeroDivisionError" in r.traceback and "/course_lib/" not in r.traceback, r.traceback
    assert "in work" in r.traceback, r.traceback     # the worker function's own frame is kept
    r = run_question(_question(hidden=True), {"f": _in_a_worker}, hidden=True, timeout=20)
    # Its message is not shown on the grader's inputs: student text could carry them out.
    assert r.message.startswith("`f` raised ZeroDivisionError in a worker on one of the grader's own inputs"), r.message
    assert r.traceback == ""
