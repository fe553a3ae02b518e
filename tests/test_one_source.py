"""One source per answer: every answer is written in ``course_lib/reference/exNN.py`` only.

``make exercises`` writes each solution notebook's answer functions from the reference functions
(the ``def`` and docstring as the exercise shows them, the body as the solution region), then the
exercises from the solutions. These tests fail on any difference between the committed notebooks
and what it writes, and check that the generator refuses what it cannot write faithfully.
(``tests/test_grading.py::test_exercises_in_sync_with_solutions`` checks the second step alone.)
"""
from __future__ import annotations

import ast
import inspect
import itertools
import os
import shutil

import nbformat
import pytest

from course_lib.grading.make_exercises import (
    expected_exercises,
    expected_solutions,
    imported_objects,
    main,
    names_needed,
    reference_sources,
    without_imports_made,
    write_answers,
)
from course_lib.grading.regions import RegionError, function_with_region, write_region_functions
from course_lib.lessons import graded
from course_lib.reference import ex03, ex04

from common import EXERCISES, SOLUTIONS

_ONLY = [s.strip() for s in os.environ.get("COURSE_TEST_LESSONS", "").split(",") if s.strip()]
LESSONS = [lesson for lesson in graded() if not _ONLY or lesson.number in _ONLY]


@pytest.fixture(scope="module")
def generated():
    """{path: text} of what `make exercises` writes: the solutions, then the exercises from them."""
    solutions = expected_solutions(SOLUTIONS)
    return {**solutions, **expected_exercises(SOLUTIONS, EXERCISES, solutions)}


def _cell_with(nb, text):
    return next(cell for cell in nb.cells if cell.cell_type == "code" and text in cell.source)


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.number for lesson in LESSONS])
def test_committed_solution_is_written_from_the_references(lesson, generated):
    path = SOLUTIONS / lesson.notebook
    assert path.read_text(encoding="utf-8") == generated[path], (
        f"{path.name} differs from its answers in course_lib/reference/ex{lesson.number}.py: edit the "
        "reference, not the notebook, and run `make exercises`")


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.number for lesson in LESSONS])
def test_committed_exercise_is_written_from_the_regenerated_solution(lesson, generated):
    path = EXERCISES / lesson.notebook
    assert path.read_text(encoding="utf-8") == generated[path], (
        f"{path.name} is not what `make exercises` writes from the references: run it")


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.number for lesson in LESSONS])
def test_each_region_holds_the_body_of_its_reference_function(lesson):
    """Read back from the notebook, not from the generator: the region's lines are the reference's body,
    in order, less only imports (and their comments) that the notebook has already made."""
    nb = nbformat.read(SOLUTIONS / lesson.notebook, as_version=4)
    for qid, (name, source) in reference_sources(lesson.number).items():
        cell = _cell_with(nb, f"# BEGIN SOLUTION {qid}\n")
        assert f"def {name}(" in cell.source
        region = cell.source.split(f"# BEGIN SOLUTION {qid}\n")[1].split("# END SOLUTION")[0].splitlines()
        docstring = ast.parse(source).body[0].body[0]
        body = iter(source.splitlines()[docstring.end_lineno:])
        for line in region:
            skipped = list(itertools.takewhile(lambda ref, line=line: ref != line, body))
            assert all(not s.strip() or s.lstrip().startswith(("#", "from ", "import ")) for s in skipped), (
                qid, skipped)
        assert any(line.strip() for line in region), qid


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.number for lesson in LESSONS])
def test_questions_come_in_their_numbers_order(lesson):
    """In the solution and the exercise, each question's heading, region and check() cell come in the
    order of the lesson's manifest (ex03_3 before ex03_4), and that order is the order of the numbers."""
    import re

    assert list(lesson.questions) == sorted(lesson.questions, key=lambda q: int(q.split("_")[1]))
    for path in (SOLUTIONS / lesson.notebook, EXERCISES / lesson.notebook):
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
        for pattern in (r"^## (?:Question )?(ex\d\d_\d+)",
                        r"# BEGIN SOLUTION (ex\d\d_\d+)|NotImplementedError\(\"(ex\d\d_\d+)",
                        r"check\(\"(ex\d\d_\d+)\"\)"):
            seen = [next(g for g in m.groups() if g) for m in re.finditer(pattern, text, re.M)]
            seen = [q for k, q in enumerate(seen) if q not in seen[:k]]
            assert seen == list(lesson.questions), (path.name, pattern, seen)


def test_an_import_is_left_out_only_when_the_notebook_made_it():
    source = inspect.getsource(ex03.apply_update)
    assert "from course_lib.async_ps.records import Record, constant_lr" in source
    made = imported_objects("from course_lib.async_ps import Record, constant_lr\n")
    assert "import" not in without_imports_made(source, made).split('"""')[-1]
    other = imported_objects("from collections import namedtuple as Record\n"
                             "from course_lib.async_ps import constant_lr\n")
    assert without_imports_made(source, other) == source.rstrip("\n")


def test_a_drifted_region_is_found_and_rewritten(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    shutil.copytree(EXERCISES, ex)
    for lesson in graded():
        shutil.copy(SOLUTIONS / lesson.notebook, sol)
    path = sol / "04_gossip.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = _cell_with(nb, "# BEGIN SOLUTION ex04_4")
    cell.source = cell.source.replace("while t > 0 and", "while t > 1 and")
    nbformat.write(nb, path)
    assert main(["--solutions", str(sol), "--exercises", str(ex), "--check"]) == 1
    assert main(["--solutions", str(sol), "--exercises", str(ex)]) == 0
    assert path.read_text(encoding="utf-8") == (SOLUTIONS / path.name).read_text(encoding="utf-8")
    assert main(["--solutions", str(sol), "--exercises", str(ex), "--check"]) == 0


def test_the_region_is_the_body_after_the_docstring():
    text = function_with_region(inspect.getsource(ex04.iterations_to_reach), "ex04_4")
    lines = text.splitlines()
    assert lines[0] == "def iterations_to_reach(r, eps):"
    assert lines[1].strip().startswith('"""') and lines[2] == "    # BEGIN SOLUTION ex04_4"
    assert lines[-1] == "    # END SOLUTION" and lines[-2] == "    return t"
    with pytest.raises(RegionError, match="docstring"):
        function_with_region("def f(x):\n    return x\n", "ex00_1")


def test_a_region_outside_its_function_is_an_error():
    cell = "def helper(x):\n    # BEGIN SOLUTION ex04_4\n    return x\n    # END SOLUTION\n"
    with pytest.raises(RegionError, match="def iterations_to_reach"):
        write_region_functions(cell, {"ex04_4": ("iterations_to_reach", "def iterations_to_reach(r, eps): ...")})


def test_what_precedes_and_follows_the_function_is_kept():
    cell = ("import math\n\n\ndef iterations_to_reach(r, eps):\n    \"\"\"Old.\"\"\"\n"
            "    # BEGIN SOLUTION ex04_4\n    return 0\n    # END SOLUTION\n\n\nprint(1)\n")
    out, qids = write_region_functions(cell, {"ex04_4": ("iterations_to_reach", "def iterations_to_reach(r, eps):\n"
                                                         "    \"\"\"New.\"\"\"\n    return 1")})
    assert qids == ["ex04_4"]
    assert out == ("import math\n\n\ndef iterations_to_reach(r, eps):\n    \"\"\"New.\"\"\"\n    return 1\n"
                   "\n\nprint(1)\n")


def test_a_name_the_notebook_does_not_define_is_an_error():
    nb = nbformat.read(SOLUTIONS / "04_gossip.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = cell.source.replace("import math\n", "")
    with pytest.raises(RegionError, match="ex04_4 reads math"):
        write_answers(nb, "04", "04_gossip.ipynb")


def test_names_needed_sees_defaults_nested_functions_and_not_locals():
    text = ("def f(a, b=DEFAULT):\n    import os\n    c = np.zeros(3)\n"
            "    def g(x):\n        return x + c + os.sep + W + len(a)\n    return g\n")
    assert names_needed(text) == {"DEFAULT", "np", "W"}
