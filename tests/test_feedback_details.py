"""What a failed question's message says (issue 29): an array is named with its type, a worker's
error by the worker's own exception, in-process (LocalCode: the same plain-data round trip and the
same messages as the sandbox)."""
from __future__ import annotations

import numpy as np

from course_lib.grading import run_question
from course_lib.grading.registry import Question
from course_lib.questions import as_number, num, shown


def test_an_array_is_named_with_its_dtype_and_shape():
    """Before: 'got [2e-05, 2e+09]', which reads as a list."""
    assert shown(np.array([2e-05, 2e+09])) == "ndarray float64 shape (2,): [2e-05, 2e+09]"
    assert shown(np.arange(100, dtype=np.int32)) == "ndarray int32 shape (100,): [0, 1, 2, 3, ...]"
    assert shown(np.array(["a", "b"])) == "ndarray <U1 shape (2,)"
    assert shown([np.array([1.0]), 2]) == "[[1], 2]"      # inside a list, the list is what is named
    # before: "should be 3/7 (= 0.428571), got 0.428571" for a float32, which reads as equal
    assert num(np.float32(3 / 7)) == "0.428571 (a numpy float32: about 6 significant digits)", num(np.float32(3 / 7))
    assert num(np.float64(3 / 7)) == num(3 / 7) == "0.428571"
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
    # The instructor keeps what the student does not see: the worker's message and traceback.
    assert "float division by zero" in r.detail and "in work" in r.detail, r.detail


def test_a_hidden_failure_keeps_its_detail_for_the_instructor_only(tmp_path):
    """The hidden check's own message (its inputs, expected and got) goes to ``detail``: into the
    instructor's JSON, not into the student's Markdown nor Gradescope's results."""
    import json

    from course_lib.grading.registry import _hide_inputs, hidden_property
    from course_lib.grading.report import gradescope_results, student_markdown, write_feedback

    def secret_case(ns):
        with hidden_property("wrong for a long vector"):
            got = ns["f"](list(range(9137)))
            assert got == 41733216, f"f(range(9137)) should be 41733216, got {got}"

    # what @hidden_check wraps a check in, without registering it as a check of a real question
    q = Question("ex99_1", 2, "t", names=("f",), timeout=20, visible=[],
                 hidden=[_hide_inputs(secret_case, "a long vector", "ex99_1")])
    r = run_question(q, {"f": sum}, hidden=True, timeout=20)
    assert r.status == "failed"
    assert r.message == "On the grader's own inputs: hidden check (a long vector): wrong for a long vector", r.message
    assert "41733216" in r.detail and "9137" in r.detail, r.detail
    row = {"submission": "s", "score": 0, "max_score": 2, "status": "ok", "notes": [],
           "questions": [dict(r.to_dict(), hidden_checks=1)]}
    path = write_feedback(row, tmp_path)
    assert json.loads(path.read_text())["questions"][0]["detail"] == r.detail
    for shown_to_student in (student_markdown(row), json.dumps(gradescope_results(row))):
        assert "41733216" not in shown_to_student and "9137" not in shown_to_student, shown_to_student
