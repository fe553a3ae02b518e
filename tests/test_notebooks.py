"""Every notebook executes headless, top to bottom, within its time budget.

Lesson notebooks run under the platform's default start method and under spawn (what
macOS and Windows use); solution notebooks run once (the grading tests also grade them).
Set COURSE_NOTEBOOK_METHODS=fork,spawn,forkserver to widen the matrix.
"""
from __future__ import annotations

import os
import pathlib
import time

import nbformat
import pytest
from nbclient import NotebookClient

from course_lib import lessons

ROOT = pathlib.Path(__file__).resolve().parents[1]
LESSONS = [ROOT / "notebooks" / lesson.notebook for lesson in lessons.LESSONS]
SOLUTIONS = [ROOT / "solutions" / lesson.notebook for lesson in lessons.graded()]
METHODS = os.environ.get("COURSE_NOTEBOOK_METHODS", "default,spawn").split(",")
BUDGET_S = 60  # the course's promise on a 2-core machine
TIMEOUT_S = 240  # a hard stop well beyond the budget, for loaded CI machines


def execute(path: pathlib.Path, start_method: str) -> float:
    nb = nbformat.read(path, as_version=4)
    env_backup = os.environ.get("COURSE_START_METHOD")
    if start_method != "default":
        os.environ["COURSE_START_METHOD"] = start_method  # inherited by the kernel
    try:
        client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        t = time.perf_counter()
        client.execute()
        return time.perf_counter() - t
    finally:
        if env_backup is None:
            os.environ.pop("COURSE_START_METHOD", None)
        else:
            os.environ["COURSE_START_METHOD"] = env_backup


@pytest.mark.slow
@pytest.mark.parametrize("start_method", METHODS)
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_notebook_executes(path, start_method):
    seconds = execute(path, start_method)
    print(f"{path.name} under {start_method}: {seconds:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_notebook_executes(path):
    execute(path, "default")


@pytest.mark.parametrize("path", LESSONS + SOLUTIONS + sorted((ROOT / "exercises").glob("*.ipynb")),
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
