"""The student release teaches before its exercises are solved, and runs the student's code after.

Every lesson notebook runs in a student release (``executed_notebook``, tests/conftest.py) as a
student who has solved every exercise runs it: the release's library, whose stand-ins
(``course_lib/reference`` in the release) run the solutions' answers. That run is checked here
(no error, nothing replayed, each exercise the lesson runs on "written", and the answers it ran,
logged by the stand-ins, exactly the manifest's ``uses``), and it is the lesson's recording, as in
``make release`` (course_lib.release.record_lesson runs the same way). Then the release lesson is
executed again, with the blank exercises the release ships: no cell ends in an error; every cell
that needed a missing answer shows its recorded result under a first line that says so and names
the exercise (or, for a knock-on, the replayed cell it builds on); the status cell lists the
lesson's exercises as not written; and the cells the kernel replayed are exactly the announced ones.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest

from course_lib import lessons, nbrun
from course_lib.release import RecordedLesson, build, student_env, write_recordings
from course_lib.replay import BANNER, RECORD_ENV
from course_lib.standin import LOG_ENV

from common import NOTEBOOKS, SOLUTIONS

# A release test executes its lesson first (when no earlier test of its process has): a per-test
# time limit must not count that, only the test's own run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]

LESSONS = list(lessons.LESSONS)
_REPORT_CELL = """
import json as _json, course_lib as _cl, course_lib.replay as _replay
print("REPLAY-REPORT " + _json.dumps({"course_lib": _cl.__file__, "replayed": _replay.replayed_cells()}))
"""


@pytest.fixture(scope="session")
def release_of(executed_notebook, student_release):
    """``release_of(lesson)``: the student release this test process ran ``lesson`` in, with that
    run written into it as the lesson's recording (what ``make release`` ships), and the folder of
    the solutions as a student's exercises. The lesson's release tests share its xdist group, so the
    lesson runs once for all of them."""
    root, solved = student_release
    written = set()

    def get(lesson):
        ran = executed_notebook(NOTEBOOKS / lesson.notebook)
        assert not ran.errors, f"{lesson.notebook} fails in the release with the solutions: {ran.errors}"
        if lesson.number not in written:
            write_recordings(root, {lesson.number: RecordedLesson(ran.notebook, ran.recording)})
            written.add(lesson.number)
        return root, solved
    return get


def _per_lesson(lessons_=None):
    """Parameters over lessons, each in the xdist group of its notebook (conftest.py)."""
    return [pytest.param(x, id=x.number, marks=pytest.mark.xdist_group(Path(x.notebook).stem))
            for x in (lessons_ or LESSONS)]


def run_release_lesson(root: Path, lesson, exercises: Path, log: Path):
    """Execute a release lesson as a student does (its own folder, the release's library, the
    exercise notebooks in ``exercises``), not recording; returns (the executed notebook, the kernel's report)."""
    path = root / "notebooks" / lesson.notebook
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nb.cells.append(nbformat.v4.new_code_cell(_REPORT_CELL))
    env = student_env(root, exercises, {**os.environ, "MPLBACKEND": "Agg", LOG_ENV: str(log)})
    env.pop(RECORD_ENV, None)
    nbrun.execute(nb, path.parent, timeout=240, allow_errors=True, env=env)
    report = next(json.loads(line.split(" ", 1)[1]) for o in nb.cells[-1].outputs
                  for line in o.get("text", "").splitlines() if line.startswith("REPLAY-REPORT "))
    assert report["course_lib"].startswith(str(root)), report
    return nb, report


def _errors(nb) -> list:
    return [(k, o.ename, o.evalue[:200]) for k, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.outputs if o.output_type == "error"]


def _banners(nb) -> list:
    """(cell index, first output's text) of every cell whose first output is a replay banner."""
    out = []
    for k, c in enumerate(nb.cells):
        if c.cell_type == "code" and c.outputs:
            first = c.outputs[0]
            text = first.get("text") or first.get("data", {}).get("text/plain", "")
            text = "".join(text) if isinstance(text, list) else text
            if text.startswith(BANNER):
                out.append((k, text))
    return out


def _status_lines(nb, lesson) -> dict:
    """{question id: state} as the status cell printed it."""
    status = next(c for c in nb.cells if c.cell_type == "code" and "lesson_status(" in c.source)
    text = "".join(o.get("text", "") for o in status.outputs)
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+(ex\d\d_\d+)\s+\S+\s+(written|not written)", text, re.M)}


@pytest.mark.parametrize("lesson", _per_lesson())
def test_release_lesson_teaches_with_blank_exercises(release_of, lesson, tmp_path):
    root, _ = release_of(lesson)
    t0 = time.perf_counter()
    nb, report = run_release_lesson(root, lesson, root / "exercises", tmp_path / "used.log")
    print(f"{lesson.notebook}, blank exercises: {time.perf_counter() - t0:.1f} s, "
          f"{len(report['replayed'])} cells replayed")
    assert not _errors(nb), f"{lesson.notebook} with blank exercises: {_errors(nb)}"
    banners = _banners(nb)
    assert len(banners) == len(report["replayed"]), (banners, report["replayed"])
    named = {q for _, q in report["replayed"] if q}
    assert named <= set(lesson.uses), f"replayed for {named - set(lesson.uses)}, not in the manifest's uses"
    for (_, text), (_, qid) in zip(banners, report["replayed"]):
        assert (qid in text) if qid else ("builds on it" in text), text
    if lesson.uses:
        assert report["replayed"], f"{lesson.notebook} runs on {lesson.uses} yet nothing was replayed"
        assert report["replayed"][0][1], "the first replayed cell must name its exercise"
    assert _status_lines(nb, lesson) == {q: "not written" for q in lesson.uses}


@pytest.mark.parametrize("lesson", _per_lesson())
def test_release_lesson_runs_the_students_answers(executed_notebook, lesson):
    ran = executed_notebook(NOTEBOOKS / lesson.notebook)
    assert ran.student is not None, "the lesson did not run in a student release"
    assert not ran.errors, f"{lesson.notebook} with the solutions as exercises: {ran.errors}"
    assert not ran.student.replayed, ran.student.replayed
    assert ran.student.answers_used == set(lesson.uses), (
        f"the lesson ran the answers to {sorted(ran.student.answers_used)}; the manifest says {lesson.uses}")
    assert ran.student.status == {q: "written" for q in lesson.uses}, ran.student.status


@pytest.mark.parametrize("lesson", _per_lesson())
def test_release_ships_each_lesson_executed_with_its_recording(release_of, lesson):
    root, _ = release_of(lesson)
    x = lesson
    nb = nbformat.read(root / "notebooks" / x.notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"{x.notebook} ships unexecuted cells"
    assert any(o.get("data", {}).get("image/png") for c in code for o in c.outputs), f"{x.notebook}: no figure"
    assert (root / "course_lib" / "recorded" / f"{x.number}.pkl").stat().st_size > 0


@pytest.mark.parametrize("lesson", _per_lesson())
def test_recorded_values_pass_no_question(release_of, lesson, tmp_path):
    """A recording is data from runs with the reference answers: no value in it (or in its dicts,
    lists and tuples), returned as it is or looked up by the first argument, may pass a question's
    visible checks. Each is tried first against what the solution returned on the checks' own calls;
    the few that match are run through the checks in a forked child (tests/test_release.py). Each
    lesson's recording is tried on the questions it could answer: its own, and those it runs."""
    import subprocess
    import sys

    from test_release import solution_functions

    root, _ = release_of(lesson)
    questions = {qid: q for qid, q in solution_functions().items()
                 if q["lesson"] == lesson.number or qid in lesson.uses}
    spec = {"release": str(root), "questions": questions,
            "solutions": {p.name[:2]: str(p) for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb")},
            "lessons_of": {qid: [lesson.number] for qid in questions}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(root), MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env.pop("COURSE_EXERCISES", None)
    script = Path(__file__).resolve().parent / "test_release.py"
    proc = subprocess.run([sys.executable, str(script), "recorded", str(tmp_path / "spec.json"),
                           str(tmp_path / "out.json")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())["questions"]
    for qid, r in out.items():
        print(f"  {qid}: {r['values']} recorded values, {r['calls']} solution calls, "
              f"{r['survivors']} matched them; control {r['control']}")
    assert sum(r["values"] for r in out.values()) > 10, f"the recording of lesson {lesson.number} holds almost nothing"
    passed = {qid: r["passed"] for qid, r in out.items() if r["passed"]}
    assert not passed, f"recorded values pass questions: {passed}"


def test_instructions_in_the_release_work_as_written(tmp_path):
    """What the release tells students to run exists there: no pytest (the release has neither it nor
    tests/), every ``make X`` is a target of its Makefile, and every question has its check cell."""
    from course_lib.reference import QUESTIONS

    out = build(tmp_path / "course", archive=False)
    makefile = (out / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*(?: [a-z][\w-]*)*):", makefile, re.M))
    targets = {t for line in targets for t in line.split()}
    texts = {"README.md": (out / "README.md").read_text()}
    for path in [out / "START_HERE.ipynb", *sorted((out / "notebooks").glob("*.ipynb")),
                 *sorted((out / "exercises").glob("*.ipynb"))]:
        texts[str(path.relative_to(out))] = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    for name, text in texts.items():
        assert "pytest" not in text, f"{name} tells students to run pytest"
        for target in re.findall(r"`make ([a-z][\w-]*)", text):
            assert target in targets, f"{name} mentions make {target}, which the release's Makefile lacks"
    exercises = "\n".join(texts[k] for k in texts if k.startswith("exercises/"))
    for qid in QUESTIONS:
        assert f'check("{qid}")' in exercises, f"no check cell for {qid}"


@pytest.mark.browser
@pytest.mark.timeout(420, func_only=True)
@pytest.mark.xdist_group("04_gossip")      # the process that executes lesson 04 (conftest.py)
def test_a_release_lesson_runs_all_in_jupyterlab_before_its_exercise_is_solved(release_of):
    """Run All in a real JupyterLab (headless Chromium) goes through a release lesson with blank
    exercises: a replayed cell succeeds, so the queue does not stop at it, and it shows its banner."""
    try:
        from .browser import lab
    except ImportError:
        from browser import lab

    reason = lab.browser_missing_reason()
    if reason:
        if os.environ.get("COURSE_REQUIRE_BROWSER"):
            pytest.fail(f"COURSE_REQUIRE_BROWSER is set but {reason}")
        pytest.skip(reason)
    lesson = lessons.lesson("04")
    root, _ = release_of(lesson)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(root)          # the server's kernels import the release's library
    try:
        with lab.chromium() as browser, lab.LabServer(root / "notebooks", repo=root) as server:
            page = lab.NotebookPage(browser, server, f"notebooks/{lesson.notebook}")
            try:
                page.open(timeout=90)
                page.run_all()
                state = page.wait_finished(timeout=240)
                errors = lab.cell_errors(state)
                assert not errors, "\n\n".join(errors)
                code = [c["index"] for c in state["cells"] if c["type"] == "code"]
                shown = [i for i in code if page.cell_output_text(i).lstrip().startswith(BANNER)]
                assert shown, "no cell shows a recorded result"
                print(f"{lesson.notebook} in JupyterLab, blank exercises: {len(code)} code cells ran, "
                      f"{len(shown)} show a recorded result")
            finally:
                page.screenshot(Path(__file__).resolve().parents[1] / "artifacts" / "browser" /
                                f"release_{lesson.number}_blank.png")
                page.close()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def test_make_grade_in_the_release_grades_a_students_notebook(tmp_path):
    """The release's `make grade` recipe, run as written (with this environment's Python for its
    virtual environment's): the blank exercise of lesson 00 gets its row, 0 points, visible checks."""
    import csv
    import subprocess
    import sys

    out = build(tmp_path / "course", archive=False)
    makefile = (out / "Makefile").read_text()
    grade = re.search(r"^GRADE := (.*)$", makefile, re.M).group(1).replace("$(BIN)/python", sys.executable)
    cmd = grade.split() + ["exercises/00_cluster_in_your_laptop.ipynb", "--out", str(tmp_path / "grades")]
    env = dict(os.environ, PYTHONPATH=str(out))
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "grades" / "scores.csv", encoding="utf-8")))
    assert len(rows) == 1 and float(rows[0]["total"]) == 0, rows
