"""Each question is graded on its own answer (issue 29): a student who answered only question q
(and the earlier questions q says it builds on) gets q's full points, and no other question's.

For every question, the solution notebook with every other answer replaced by its exercise stub
is graded by the real grader, in its sandbox, with the hidden checks. A question whose checks ran
another question's student function (through a library stand-in, in the release library the
sandbox imports) would lose its points here: that answer is missing.
"""
from __future__ import annotations

import nbformat
import pytest

from course_lib.grading import load_lesson
from course_lib.grading.regions import replace_region_in_notebook, stub
from course_lib.grading.registry import DEFAULT_HIDDEN_DIR
from course_lib.lessons import graded

from common import SOLUTIONS, TEST_LESSONS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("graded_alone")]   # 43 tests, about 45 s


def only(lesson: str, keep: set):
    """The lesson's solution notebook with every answer but those in ``keep`` stubbed out."""
    nb = nbformat.read(SOLUTIONS / graded_lesson(lesson).notebook, as_version=4)
    for q in load_lesson(lesson):
        if q.qid not in keep:
            nb = replace_region_in_notebook(nb, q.qid, stub(q.qid, q.title, ""))
    return nb


def graded_lesson(number: str):
    return next(x for x in graded() if x.number == number)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from course_lib.grade import grade_paths

    subs = tmp_path_factory.mktemp("alone")
    for x in graded():
        if TEST_LESSONS and x.number not in TEST_LESSONS:
            continue
        for q in load_lesson(x.number):
            nbformat.write(only(x.number, {q.qid, *q.builds_on}), subs / f"{x.number}_only__{q.qid}.ipynb")
    out = tmp_path_factory.mktemp("grades")
    got = grade_paths([subs], out, hidden_dir=DEFAULT_HIDDEN_DIR, jobs=2, quiet=True)
    return {r["submission"]: r for r in got}


@pytest.mark.parametrize("qid", [q.qid for x in graded() for q in load_lesson(x.number)])
def test_a_question_answered_alone_gets_its_points(rows, qid):
    row = rows[f"{qid[2:4]}_only__{qid}"]
    result = next(q for q in row["questions"] if q["qid"] == qid)
    assert result["points"] == result["max_points"], (qid, result["status"], result["message"])


def test_a_question_whose_earlier_answer_is_missing_names_it(tmp_path):
    """ex05_6 builds on ex05_1 and ex05_2 (its statement says so): answered without them, it fails
    with a message naming the missing exercise, not "not implemented"."""
    from course_lib.grade import grade_paths

    nbformat.write(only("05", {"ex05_6"}), tmp_path / "05_only_the_loop.ipynb")
    (row,) = grade_paths([tmp_path / "05_only_the_loop.ipynb"], tmp_path / "out", hidden_dir=DEFAULT_HIDDEN_DIR,
                         quiet=True)
    result = next(q for q in row["questions"] if q["qid"] == "ex05_6")
    assert result["points"] == 0 and result["status"] == "failed", result
    assert "solve ex05_1 first" in result["message"] or "solve ex05_2 first" in result["message"], result
