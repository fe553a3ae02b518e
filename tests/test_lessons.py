"""The lesson manifest (course_lib/lessons.py) and the files agree, both ways.

Every lesson notebook, exercise, solution, hidden-check file, question module and reference
module is listed by the manifest, and everything the manifest lists exists; the README's
lesson table is the manifest's; each lesson notebook opens with its number and title.
"""
from __future__ import annotations

import importlib
import pathlib
import re

import nbformat
import pytest

from course_lib import lessons
from course_lib.grading import all_questions

ROOT = pathlib.Path(__file__).resolve().parents[1]
LESSON_FILE = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


def _files(folder: str, pattern: str) -> set[str]:
    return {p.name for p in (ROOT / folder).glob(pattern)}


def test_every_notebook_is_a_listed_lesson_and_every_lesson_has_its_notebook():
    listed = {x.notebook for x in lessons.LESSONS}
    assert _files("notebooks", "*.ipynb") == listed
    graded = {x.notebook for x in lessons.graded()}
    assert _files("exercises", "*.ipynb") == graded
    assert _files("solutions", "*.ipynb") == graded


def test_every_question_file_belongs_to_a_graded_lesson():
    numbers = {f"ex{x.number}.py" for x in lessons.graded()}
    assert _files("tests/hidden", "ex*.py") == numbers
    assert _files("course_lib/questions", "ex*.py") == numbers
    assert _files("course_lib/reference", "ex*.py") == numbers


def test_the_manifest_lists_exactly_the_registered_questions():
    registered: dict[str, list[str]] = {}
    for q in all_questions():
        registered.setdefault(q.lesson, []).append(q.qid)
    listed = {x.number: list(x.questions) for x in lessons.graded()}
    assert listed == registered


def test_numbers_are_unique_and_ordered_and_names_are_file_names():
    numbers = [x.number for x in lessons.LESSONS]
    assert numbers == sorted(set(numbers))
    for x in lessons.LESSONS:
        assert LESSON_FILE.match(x.notebook), x.notebook


@pytest.mark.parametrize("lesson", lessons.LESSONS, ids=lambda x: x.number)
def test_each_lesson_names_existing_tests_and_package(lesson):
    assert lesson.tests, f"lesson {lesson.number} lists no tests"
    for name in lesson.tests:
        assert (ROOT / "tests" / name).is_file(), f"lesson {lesson.number}: tests/{name} does not exist"
    if lesson.package is not None:
        importlib.import_module(f"course_lib.{lesson.package}")


@pytest.mark.parametrize("lesson", lessons.LESSONS, ids=lambda x: x.number)
def test_each_lesson_notebook_opens_with_its_number_and_title(lesson):
    nb = nbformat.read(ROOT / "notebooks" / lesson.notebook, as_version=4)
    assert nb.cells[0].source.splitlines()[0] == f"# {lesson.number} · {lesson.title}"


def test_the_readme_table_is_the_manifest():
    readme = (ROOT / "README.md").read_text()
    assert lessons.with_readme_table(readme) == readme, (
        "README.md's lesson table differs from course_lib/lessons.py: "
        "run python -m course_lib.lessons --readme README.md")


def test_a_file_the_manifest_does_not_list_is_caught(tmp_path, monkeypatch):
    """The file check above can fail: an extra notebook makes the sets differ."""
    extra = lessons.Lesson("99", "extra", "Extra", "1 min", None, (), ("test_lessons.py",), "")
    monkeypatch.setattr(lessons, "LESSONS", lessons.LESSONS + (extra,))
    with pytest.raises(AssertionError):
        test_every_notebook_is_a_listed_lesson_and_every_lesson_has_its_notebook()


def test_uses_names_known_questions_in_order():
    """``uses`` lists exercise answers a lesson's cells run: known question ids, each once, of this
    lesson or an earlier one (a lesson cannot need an answer the course has not asked for yet).
    Which ones exactly is checked on real runs by tests/test_release_lessons.py."""
    known = {q.qid for q in all_questions()}
    for x in lessons.LESSONS:
        assert len(set(x.uses)) == len(x.uses) and set(x.uses) <= known, (x.number, x.uses)
        assert all(q[2:4] <= x.number for q in x.uses), (x.number, x.uses)
