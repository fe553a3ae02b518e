"""What a failed question's message says (issue 29): an array is named with its type, a worker's
error by the worker's own exception, in-process (LocalCode: the same plain-data round trip and the
same messages as the sandbox)."""
from __future__ import annotations

import re

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


# -- formula questions: the message names what is off, never the expected value (issue 32) ----------

#: Questions whose answer is a formula: a printed target value lets a student work the formula back.
FORMULA_QUESTIONS = ("ex01_4", "ex01_5", "ex02_4", "ex03_2", "ex03_4", "ex04_2", "ex04_4", "ex05_5", "ex06_4",
                     "ex07_1", "ex07_2", "ex07_3", "ex08_4")


def test_off_by_names_a_factor_only_when_it_is_a_whole_number():
    from course_lib.questions import off_by

    assert off_by(0.025, 0.05) == "too small by a factor of about 2"
    assert off_by(1.4e11, 1.75e10) == "too large by a factor of about 8"
    assert off_by(1e10, 1.75e10) == "too small"            # 7/4 would hand the value back
    assert off_by(0.00840032, 0.00240032) == "too large"
    assert off_by(1e11, 0.1) == "too large by orders of magnitude"
    assert off_by(1.0, 0.0) == "not zero where it should be zero"
    assert off_by(-1.0, 2.0) == "negative where it should be positive"


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def _telling(expected: str) -> bool:
    """An expected value that tells the formula when shown: a number, not a small whole one (a 2 or a
    16 also counts bytes, ranks and factors in a message's own words)."""
    try:
        x = float(expected)
    except ValueError:
        return False
    return not (x.is_integer() and abs(x) < 100)


def _formula_fixtures():
    import pytest

    from common import FIXTURES

    return [pytest.param(p, id=p.stem) for p in sorted((FIXTURES / "wrong_answers").glob("ex*__*.py"))
            if p.name.split("__")[0] in FORMULA_QUESTIONS]


def _fixture_param():
    import pytest

    return pytest.mark.parametrize("path", _formula_fixtures())


@_fixture_param()
def test_a_formula_question_fails_without_its_expected_value(path):
    """Each check of the question run on the wrong answer: a failure that carries the expected value for
    the instructor (its ``detail``, '[expected X]') does not show X to the student; a visible check's
    failure is one of those (or an argument changed in place, a library helper called)."""
    from test_checks import lesson

    from course_lib.grading.registry import HiddenFailure
    from course_lib.grading.student import LocalCode, StudentError

    qid = path.name.split("__")[0]
    les = lesson(qid[2:4])
    q = les.questions[qid]
    code = LocalCode(les.with_body(qid, path.read_text()))
    failures = 0
    for check in list(q.visible) + list(q.hidden):
        try:
            check(code)
        except StudentError:
            continue
        except AssertionError as exc:
            failures += 1
            shown_text = str(exc)
            detail = getattr(exc, "detail", "") or ""
            m = re.search(r"\[expected (.+)\]$", detail)
            if check in q.visible and not isinstance(exc, HiddenFailure):
                assert m or "in place" in shown_text or "should do this question's work itself" in shown_text \
                    or "should be an int" in shown_text or "placed" in shown_text, (
                        f"{path.name}: a visible check failed without naming what is off: {shown_text!r}")
            if m and _telling(m.group(1)):
                # numbers of the message, but those of the call's own inputs (before its first " = ")
                inputs = set(NUMBER.findall(shown_text.split(" = ")[0])) if " = " in shown_text else set()
                assert m.group(1) not in set(NUMBER.findall(shown_text)) - inputs, (
                    f"{path.name}: the expected value {m.group(1)} is shown: {shown_text!r}")
    assert failures, f"{path.name}: no check failed"
