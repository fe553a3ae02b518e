"""Every lesson notebook executes headless, top to bottom, within its time budget.

Each lesson notebook runs once under the platform's default start method; the run is shared
with the tests that check its text against its numbers (``executed_notebook`` in conftest.py).
CI grades the solution notebooks in the grader's sandbox (tests/test_grading.py). ``make
test-all`` (COURSE_NOTEBOOK_METHODS=default,spawn,forkserver) also runs every lesson under spawn
(what macOS and Windows use) and forkserver, and executes the solutions headless here; in CI the
runtime's own tests cover spawn and forkserver.
"""
from __future__ import annotations

import os

import nbformat
import pytest

from course_lib import lessons

from common import EXERCISES, NOTEBOOKS, SOLUTIONS, loaded_budget

LESSONS = [NOTEBOOKS / lesson.notebook for lesson in lessons.LESSONS]
SOLUTION_NBS = [SOLUTIONS / lesson.notebook for lesson in lessons.graded()]
EXTRA_METHODS = [m for m in os.environ.get("COURSE_NOTEBOOK_METHODS", "").split(",") if m and m != "default"]


def _runs():
    for path in LESSONS:
        yield pytest.param(path, "default", id=path.stem, marks=pytest.mark.xdist_group(path.stem))
        for method in EXTRA_METHODS:  # `make test-all`: spawn and forkserver too
            yield pytest.param(path, method, id=f"{path.stem}-{method}",
                               marks=(pytest.mark.xdist_group(path.stem), pytest.mark.sweep))


@pytest.mark.slow
@pytest.mark.parametrize("path, start_method", list(_runs()))
def test_lesson_notebook_executes(path, start_method, executed_notebook):
    ran = executed_notebook(path, start_method)
    print(f"{path.name} under {start_method}: {ran.seconds:.1f} s at load average {ran.load:.1f}")
    assert not ran.errors, f"{path.name} under {start_method}: {ran.errors}"
    budget = loaded_budget(ran.load)
    assert ran.seconds < budget, (f"{path.name}: {ran.seconds:.0f} s (budget {budget:.0f} s at the load average "
                                  f"{ran.load:.1f} measured during the run); {ran.slowest_cells()}")


@pytest.mark.slow
@pytest.mark.sweep  # CI grades every solution in the sandbox instead (tests/test_grading.py)
@pytest.mark.parametrize("path", SOLUTION_NBS, ids=lambda p: p.stem)
def test_solution_notebook_executes(path, executed_notebook):
    ran = executed_notebook(path)
    assert not ran.errors, f"solutions/{path.name}: {ran.errors}"


@pytest.mark.parametrize("path", LESSONS + SOLUTION_NBS + sorted(EXERCISES.glob("*.ipynb")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_scaffold(path):
    """Objectives, prerequisites, time, key points, papers, a plot and a widget."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    for needle in ("Objectives", "Prerequisites", "Time", "Key points"):
        assert needle in text, f"{path.name} lacks a '{needle}' section"
    assert "savefig" in text or "plt." in text, f"{path.name} draws no plot"
    assert "widgets." in text, f"{path.name} has no widget"
