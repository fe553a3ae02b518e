"""The Gradescope autograder zip (``make gradescope``): its layout, and its ``run_autograder`` run
as Gradescope runs it, in a temporary ``AUTOGRADER_ROOT``, on a solution (full marks) and on a blank
exercise (0), in the sandbox where bubblewrap runs here."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from course_lib.grading.gradescope import build
from course_lib.grading.registry import DEFAULT_HIDDEN_DIR, load_lesson
from course_lib.grading.report import gradescope_results
from course_lib.grading.sandbox import sandbox_status

from common import EXERCISES, SOLUTIONS

NB = "00_cluster_in_your_laptop.ipynb"
FULL = sum(q.points for q in load_lesson("00"))


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """The zip of lesson 00 (in the sandbox if bubblewrap runs here, else built with --no-sandbox)."""
    folder = tmp_path_factory.mktemp("gradescope")
    args = [] if sandbox_status()[0] else ["--no-sandbox"]
    return build(folder / "autograder.zip", DEFAULT_HIDDEN_DIR, "00", args)


def test_the_zip_holds_what_gradescope_needs(autograder):
    with zipfile.ZipFile(autograder) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        run = z.read("run_autograder").decode()
    assert {"setup.sh", "run_autograder", "requirements.txt", "hidden/ex00.py",
            "course_lib/grade.py", "course_lib/grading/gradescope.py"} <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    assert not [n for n in names if n.startswith(("solutions/", "tests/", "course_lib/recorded/"))
                or "__pycache__" in n or (n.startswith("hidden/") and n != "hidden/ex00.py")]
    assert "--lesson 00" in run and "$ROOT/results" not in run  # results.json is written by the grader


def _run(autograder: Path, root: Path, notebook: Path, name: str) -> dict:
    """Gradescope's layout: the zip in root/source, run_autograder in root, the upload in root/submission."""
    with zipfile.ZipFile(autograder) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    nbformat.write(nbformat.read(notebook, as_version=4), root / "submission" / name)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), COURSE_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    env.pop("COURSE_GRADING_NO_SANDBOX", None)
    cp = subprocess.run(["bash", str(root / "run_autograder")], capture_output=True, text=True, timeout=400,
                        env=env, cwd=root)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def _check_format(res: dict) -> None:
    assert set(res) >= {"score", "tests", "output"}
    for t in res["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "output", "visibility"}
        assert t["status"] in ("passed", "failed") and t["visibility"] in ("visible", "after_published")
        if t["visibility"] == "after_published":
            assert t["max_score"] == 0 and t["score"] == 0
    assert res["score"] == sum(t["score"] for t in res["tests"])


@pytest.mark.slow
def test_run_autograder_on_a_solution_and_a_blank_exercise(autograder, tmp_path):
    res = _run(autograder, tmp_path / "solution", SOLUTIONS / NB, "my_work.ipynb")
    _check_format(res)
    assert res["score"] == FULL, res
    visible = [t for t in res["tests"] if t["visibility"] == "visible"]
    hidden = [t for t in res["tests"] if t["visibility"] == "after_published"]
    assert len(visible) == len(load_lesson("00")) and all(t["status"] == "passed" for t in visible)
    assert hidden and all(t["status"] == "passed" for t in hidden)   # the hidden checks ran and passed
    sandboxed = sandbox_status()[0]
    assert ("sandbox: bubblewrap" in res["output"]) == sandboxed, res["output"]

    res = _run(autograder, tmp_path / "blank", EXERCISES / NB, NB)
    _check_format(res)
    assert res["score"] == 0 and all(t["status"] == "failed" for t in res["tests"] if t["visibility"] == "visible")


def test_no_notebook_and_hidden_failures_are_reported_as_gradescope_expects(autograder, tmp_path):
    root = tmp_path / "root"
    with zipfile.ZipFile(autograder) as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "submission" / "answers.txt").write_text("see attached")
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), COURSE_PYTHON=sys.executable)
    subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, timeout=120, env=env)
    res = json.loads((root / "results" / "results.json").read_text())
    assert res["score"] == 0 and res["tests"] == [] and "No notebook" in res["output"]

    row = {"submission": "s", "status": "ok", "checks": "visible+hidden", "sandbox": "bubblewrap", "score": 2,
           "max_score": 4, "notes": [], "questions": [
               {"qid": "ex00_1", "title": "A", "points": 0, "max_points": 2, "status": "failed",
                "message": "On the grader's own inputs: expected 3 blocks, got 2", "traceback": ""},
               {"qid": "ex00_2", "title": "B", "points": 2, "max_points": 2, "status": "passed",
                "message": "All 4 checks passed.", "traceback": "", "hidden_checks": 2},
               {"qid": "ex00_3", "title": "C", "points": 0, "max_points": 0, "status": "failed",
                "message": "expected 1, got 2", "traceback": "",
                "hidden": {"status": "failed", "message": "wrong on a ring of 5"}}]}
    tests = {t["name"]: t for t in gradescope_results(row)["tests"]}
    visible_1 = tests["ex00_1: A"]
    assert visible_1["visibility"] == "visible" and "3 blocks" not in visible_1["output"]
    assert tests["ex00_1: A (hidden checks)"]["visibility"] == "after_published"
    assert "3 blocks" in tests["ex00_1: A (hidden checks)"]["output"]
    assert tests["ex00_2: B (hidden checks)"]["status"] == "passed"
    assert tests["ex00_3: C (hidden checks)"]["output"] == "wrong on a ring of 5"   # the checker's own field
