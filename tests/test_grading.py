"""The exercise framework and the grader: can it pass the good, fail the wrong, survive the bad?

Every solution notebook, its exercise twin, each wrong answer (tests/fixtures/wrong_answers) and
each misbehaving submission (tests/fixtures/misbehaving) is graded once, in one batch, by the
real sandboxed grader (a subprocess per submission); the tests below read that batch.

``pytest -m ex00_1`` runs the test of one question (on solutions/, or ``--notebooks exercises``).
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.grading import all_questions, check, get_question, load_lesson, question, run_question
from course_lib.grading.checking import QuestionTimeout, time_limit
from course_lib.grading.make_exercises import build_exercise, render, stale
from course_lib.grading.regions import RegionError, lesson_of_path, replace_region_in_notebook, replace_regions
from course_lib.grading.registry import DEFAULT_HIDDEN_DIR
from course_lib.grading.sandbox import Limits

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS, EXERCISES = REPO / "solutions", REPO / "exercises"
FIXTURES = REPO / "tests" / "fixtures"
LIMITS = Limits(cell_timeout=120, timeout=None, memory_mb=2048, total_timeout=300)      # questions' own timeouts
# For the misbehaving ones: short limits, longer where every Cluster start re-imports Python (spawn, forkserver).
_FORK = __import__("course_lib").default_start_method() == "fork"
TIGHT = Limits(cell_timeout=6 if _FORK else 20, timeout=10 if _FORK else 30, memory_mb=2048, total_timeout=240)
BUDGET = 90 if _FORK else 200  # seconds a misbehaving submission may take to grade under TIGHT (attempts included)

# COURSE_TEST_LESSONS=00,01 limits this file to some lessons (default: every solution notebook).
_ONLY = [s.strip() for s in os.environ.get("COURSE_TEST_LESSONS", "").split(",") if s.strip()]
SOLUTION_NBS = [p for p in sorted(SOLUTIONS.glob("[0-9][0-9]_*.ipynb")) if not _ONLY or p.name[:2] in _ONLY]
WRONG = [p for p in sorted((FIXTURES / "wrong_answers").glob("ex[0-9][0-9]_*__*.py")) if not _ONLY or p.name[2:4] in _ONLY]
MISBEHAVING = sorted((FIXTURES / "misbehaving").glob("*.py"))
LESSONS = [lesson_of_path(p) for p in SOLUTION_NBS]


def solution_of(lesson: str) -> Path:
    return next(p for p in SOLUTION_NBS if lesson_of_path(p) == lesson)


def header(path: Path) -> dict:
    """The ``# key: value`` lines at the top of a fixture (action, expect, expect-note, expect-message)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#\s*(action|expect|expect-note|expect-message):\s*(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2).strip())
    return out


def apply_misbehaviour(nb, fixture: Path):
    """The lesson 00 solution with the edit a misbehaving fixture describes."""
    text = fixture.read_text()
    body = "\n".join(l for l in text.splitlines() if not re.match(r"^#\s*(action|expect[-a-z]*):", l)).strip()
    action, _, arg = header(fixture)["action"][0].partition(":")
    arg = arg.strip()
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    idx = [k for k, c in enumerate(nb.cells) if c.cell_type == "code" and arg and arg in c.source]
    if action == "replace-region":
        return replace_region_in_notebook(nb, arg, body)
    if action == "insert-cell-after-matching":
        nb.cells.insert(idx[0] + 1, nbformat.v4.new_code_cell(body))
    elif action == "prepend-to-cell-matching":
        nb.cells[idx[0]].source = body + "\n" + nb.cells[idx[0]].source
    elif action == "delete-cells-matching":
        nb.cells = [c for k, c in enumerate(nb.cells) if k not in idx]
    elif action != "corrupt-file":
        raise ValueError(f"{fixture.name}: unknown action {action!r}")
    assert action == "corrupt-file" or idx, f"{fixture.name}: no cell matches {arg!r}"
    return nb


def expected_points(fixture: Path) -> dict:
    return {k: float(v) for k, v in (kv.split("=") for kv in " ".join(header(fixture)["expect"]).split())}


@pytest.fixture(scope="session")
def batch(tmp_path_factory):
    """Grade every submission of this file once: {submission id: feedback row}, plus timings."""
    subs = tmp_path_factory.mktemp("submissions")
    mis = tmp_path_factory.mktemp("misbehaving")
    out = tmp_path_factory.mktemp("grades")
    mis_out = tmp_path_factory.mktemp("grades_misbehaving")
    for sol in SOLUTION_NBS:
        lesson = lesson_of_path(sol)
        nbformat.write(nbformat.read(sol, as_version=4), subs / f"{lesson}_solution.ipynb")
        ex = EXERCISES / sol.name
        if ex.exists():
            nbformat.write(nbformat.read(ex, as_version=4), subs / f"{lesson}_exercise.ipynb")
    for fx in WRONG:
        qid = fx.name.split("__")[0]
        lesson = qid[2:4]
        nb = replace_region_in_notebook(nbformat.read(solution_of(lesson), as_version=4), qid, fx.read_text())
        nbformat.write(nb, subs / f"{lesson}_wrong__{fx.stem}.ipynb")
    if "00" in LESSONS:
        sol = nbformat.read(solution_of("00"), as_version=4)
        for fx in MISBEHAVING:
            path = mis / f"00_misbehaving__{fx.stem}.ipynb"
            if header(fx)["action"][0] == "corrupt-file":
                path.write_text('{"cells": [ this is not json')
            else:
                nbformat.write(apply_misbehaviour(sol, fx), path)
    pidfile = tmp_path_factory.mktemp("pids") / "pids.txt"
    old = os.environ.get("COURSE_TEST_PIDFILE")
    os.environ["COURSE_TEST_PIDFILE"] = str(pidfile)
    try:
        from course_lib.grade import grade_paths

        t0 = time.monotonic()
        rows = grade_paths([subs], out, LIMITS, hidden_dir=DEFAULT_HIDDEN_DIR, jobs=2, quiet=True)
        mis_rows = grade_paths([mis], mis_out, TIGHT, hidden_dir=DEFAULT_HIDDEN_DIR, jobs=2, quiet=True) \
            if any(mis.iterdir()) else []
        wall = time.monotonic() - t0
    finally:
        if old is None:
            os.environ.pop("COURSE_TEST_PIDFILE", None)
        else:
            os.environ["COURSE_TEST_PIDFILE"] = old
    _BATCH.update({"rows": {r["submission"]: r for r in rows + mis_rows}, "main": [r["submission"] for r in rows],
                   "out": out, "mis_out": mis_out, "subs": subs, "pidfile": pidfile, "wall": wall})
    return _BATCH


_BATCH: dict = {}  # the batch, once graded: the per-question tests reuse it


def points(row) -> dict:
    return {q["qid"]: q["points"] for q in row["questions"]}


def full_marks(lesson) -> dict:
    return {q.qid: q.points for q in load_lesson(lesson)}


# -- one source of truth --------------------------------------------------------------------

def test_exercises_in_sync_with_solutions():
    bad = [p for p in stale(SOLUTIONS, EXERCISES) if not _ONLY or p.name[:2] in _ONLY]
    assert not bad, f"exercises out of date with solutions: {[p.name for p in bad]}; run `make exercises`"


def test_stale_exercise_is_detected(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir(), ex.mkdir()
    src = SOLUTION_NBS[0]
    nb = nbformat.read(src, as_version=4)
    nbformat.write(nb, sol / src.name)
    (ex / src.name).write_text(render(build_exercise(nb, lesson_of_path(src), src.name)[0]))
    assert stale(sol, ex) == []
    nb.cells[-1].source += "\nA new sentence in the solution."
    nbformat.write(nb, sol / src.name)
    assert stale(sol, ex) == [ex / src.name]


@pytest.mark.parametrize("sol", SOLUTION_NBS, ids=lambda p: p.stem)
def test_exercise_stubs_name_their_questions(sol):
    ex = nbformat.read(EXERCISES / sol.name, as_version=4)
    text = "\n".join(c.source for c in ex.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    for q in load_lesson(lesson_of_path(sol)):
        assert f'raise NotImplementedError("{q.qid}: {q.title}")' in text
    assert ex.metadata["course"]["lesson"] == lesson_of_path(sol)
    for nb in (ex, nbformat.read(sol, as_version=4)):
        assert all(not c.get("outputs") and c.get("execution_count") is None
                   for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"


def test_regions_become_indented_stubs():
    src = "def f(x):\n    y = 1\n    # BEGIN SOLUTION ex00_1\n    return x + y\n    # END SOLUTION\n\nprint(f)\n"
    new, qids = replace_regions(src, lambda q, ind: f'{ind}raise NotImplementedError("{q}: T")')
    assert qids == ["ex00_1"]
    assert new == 'def f(x):\n    y = 1\n    raise NotImplementedError("ex00_1: T")\n\nprint(f)\n'
    with pytest.raises(RegionError, match="no END SOLUTION"):
        replace_regions("# BEGIN SOLUTION ex00_1\nx = 1\n", lambda q, i: "")
    with pytest.raises(RegionError, match="needs a question id"):
        replace_regions("# BEGIN SOLUTION\n# END SOLUTION\n", lambda q, i: "")
    with pytest.raises(RegionError, match="without a BEGIN"):
        replace_regions("# END SOLUTION\n", lambda q, i: "")


def test_unknown_question_in_a_region_is_an_error():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# BEGIN SOLUTION ex00_99\nx = 1\n# END SOLUTION")])
    with pytest.raises(RegionError, match="unknown question ex00_99"):
        build_exercise(nb, "00", "00_x.ipynb")


def test_registry_rejects_bad_ids_and_names_unknown_questions():
    with pytest.raises(ValueError, match="not a question id"):
        question("lesson0-q1")
    with pytest.raises(LookupError, match="lesson 00 has: ex00_1"):
        get_question("ex00_99")


# -- grading results ------------------------------------------------------------------------

@pytest.mark.parametrize("lesson", LESSONS)
def test_solutions_score_full_marks(batch, lesson):
    row = batch["rows"][f"{lesson}_solution"]
    bad = {q["qid"]: q["message"] for q in row["questions"] if q["status"] != "passed"}
    assert not bad, bad
    assert points(row) == full_marks(lesson) and row["score"] == row["max_score"] > 0


@pytest.mark.parametrize("lesson", LESSONS)
def test_exercises_score_zero(batch, lesson):
    row = batch["rows"].get(f"{lesson}_exercise")
    assert row is not None, f"exercises/ has no notebook for lesson {lesson}: run `make exercises`"
    assert row["score"] == 0 and row["max_score"] == sum(full_marks(lesson).values())
    assert {q["status"] for q in row["questions"]} == {"not_implemented"}, row["questions"]


@pytest.mark.parametrize("fixture", WRONG, ids=lambda p: p.stem)
def test_wrong_answer_loses_exactly_its_points(batch, fixture):
    qid = fixture.name.split("__")[0]
    row = batch["rows"][f"{qid[2:4]}_wrong__{fixture.stem}"]
    want = dict(full_marks(qid[2:4]), **{qid: 0})
    assert points(row) == want, {q["qid"]: q["message"] for q in row["questions"]}
    assert next(q for q in row["questions"] if q["qid"] == qid)["message"]


@pytest.mark.parametrize("fixture", MISBEHAVING, ids=lambda p: p.stem)
def test_misbehaving_submission_is_graded_with_a_message(batch, fixture):
    row = batch["rows"][f"00_misbehaving__{fixture.stem}"]
    assert points(row) == expected_points(fixture), {q["qid"]: q["message"] for q in row["questions"]}
    assert all(q["message"] for q in row["questions"])
    assert row["elapsed"] < BUDGET
    h = header(fixture)
    for needle in h.get("expect-note", []):
        assert any(needle in n for n in row["notes"]), row["notes"]
    for spec in h.get("expect-message", []):
        qid, _, needle = (s.strip() for s in spec.partition("~"))
        msg = next(q["message"] for q in row["questions"] if q["qid"] == qid)
        assert needle.lower() in msg.lower(), msg


def test_huge_output_is_capped(batch):
    row = batch["rows"].get("00_misbehaving__huge_output")
    if row is None:
        pytest.skip("no huge_output fixture")
    assert "bytes of output skipped" in row["output_tail"] or len(row["output_tail"]) <= 4000
    fb = json.loads((batch["mis_out"] / "feedback" / "00_misbehaving__huge_output.json").read_text())
    assert len(json.dumps(fb)) < 100_000


def test_leftover_processes_are_killed(batch):
    pids = [int(x) for x in batch["pidfile"].read_text().split()] if batch["pidfile"].exists() else []
    assert len(pids) >= 2, "the leftover_workers fixture did not record its processes"
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    assert not alive, f"processes left behind by a submission: {alive}"


def test_reports(batch):
    out, rows = batch["out"], {k: batch["rows"][k] for k in batch["main"]}
    with open(out / "scores.csv", newline="") as f:
        table = list(csv.reader(f))
    head = table[0]
    qids = [q.qid for q in all_questions() if q.lesson in LESSONS]
    assert head[0] == "submission" and head[-2:] == ["total", "max"] and sorted(head[1:-2]) == sorted(qids)
    assert sorted(r[0] for r in table[1:]) == sorted(rows)
    for r in table[1:]:
        row = rows[r[0]]
        assert float(r[-2]) == row["score"] and float(r[-1]) == row["max_score"]
        assert sum(float(x) for x in r[1:-2] if x) == row["score"]
    for sid, row in rows.items():
        fb = json.loads((out / "feedback" / f"{sid}.json").read_text())
        assert {"submission", "score", "max_score", "questions", "notes"} <= set(fb)
        for q in fb["questions"]:
            assert {"qid", "points", "max_points", "status", "message", "traceback"} <= set(q)
        gs = json.loads((out / "results" / sid / "results.json").read_text())
        assert gs["score"] == sum(t["score"] for t in gs["tests"]) == row["score"]
        assert all({"name", "score", "max_score", "output", "status"} <= set(t) for t in gs["tests"])


def test_command_line_is_deterministic(batch, tmp_path):
    """`python -m course_lib.grade` on a solution and an exercise gives the batch's scores again."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("00_solution", "00_exercise"):
        src = batch["subs"] / f"{name}.ipynb"
        (subs / src.name).write_bytes(src.read_bytes())
    out = tmp_path / "grades"
    cp = subprocess.run([sys.executable, "-m", "course_lib.grade", str(subs), "--out", str(out), "--jobs", "2"],
                        capture_output=True, text=True, timeout=240, cwd=REPO)
    assert cp.returncode == 0, cp.stderr[-2000:]
    with open(out / "scores.csv", newline="") as f:
        got = {r["submission"]: r for r in csv.DictReader(f)}
    for name in ("00_solution", "00_exercise"):
        assert float(got[name]["total"]) == batch["rows"][name]["score"]
        assert {k: float(v) for k, v in got[name].items() if k.startswith("ex")} == points(batch["rows"][name])


def test_grading_without_the_zygote(monkeypatch, tmp_path):
    """The plain-subprocess path (Windows, or COURSE_GRADING_NO_ZYGOTE=1): a cell calling os._exit is skipped."""
    from course_lib.grade import grade_paths

    monkeypatch.setenv("COURSE_GRADING_NO_ZYGOTE", "1")
    ex = nbformat.read(EXERCISES / solution_of("00").name, as_version=4)
    nb = apply_misbehaviour(ex, FIXTURES / "misbehaving" / "os_exit_cell.py")
    nbformat.write(nb, tmp_path / "00_student.ipynb")
    (row,) = grade_paths([tmp_path / "00_student.ipynb"], tmp_path / "out", TIGHT, quiet=True)
    assert row["score"] == 0 and {q["status"] for q in row["questions"]} == {"not_implemented"}
    assert any("exit code 7" in n for n in row["notes"]), row["notes"]


# -- check() in the notebook ------------------------------------------------------------------

def notebook_namespace(nb) -> dict:
    """Run the import cells and the cells that define answers (no demos), as a notebook would (``__main__``)."""
    ns = {"__name__": "__main__"}
    for cell in nb.cells:
        src = cell.source.lstrip()
        if cell.cell_type == "code" and src.startswith(("import", "from", "def")) and "Cluster(" not in src:
            exec(compile(cell.source, "<notebook cell>", "exec"), ns)
    return ns


def printed(fn, *args) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args)
    return buf.getvalue()


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_check_passes_solutions_in_worker_processes(start_method, monkeypatch):
    """Functions defined in notebook cells reach the workers under every start method."""
    monkeypatch.setenv("COURSE_START_METHOD", start_method)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    ns = notebook_namespace(nbformat.read(solution_of("00"), as_version=4))
    for q in load_lesson("00"):
        out = printed(check, q.qid, ns)
        assert "\u2705" in out and "passed" in out, out


def test_check_on_stubs_says_not_implemented(monkeypatch):
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    ns = notebook_namespace(nbformat.read(EXERCISES / solution_of("00").name, as_version=4))
    for q in load_lesson("00"):
        out = printed(check, q.qid, ns)
        assert "Not implemented yet" in out and q.qid in out, out


def test_hidden_checks_are_a_superset_of_visible_ones():
    """The 'drops the remainder' answer passes the visible check and fails grading."""
    nb = replace_region_in_notebook(nbformat.read(solution_of("00"), as_version=4), "ex00_1",
                                    (FIXTURES / "wrong_answers" / "ex00_1__drops_remainder.py").read_text())
    ns = notebook_namespace(nb)
    load_lesson("00", hidden_dir=DEFAULT_HIDDEN_DIR, with_hidden=True)
    assert run_question("ex00_1", ns, hidden=False).passed
    r = run_question("ex00_1", ns, hidden=True)
    assert r.status == "failed" and "rank" in r.message and r.points == 0


def test_check_reports_missing_names_and_timeouts():
    assert run_question("ex00_2", {}).status == "missing"

    def forever(sizes, times):
        while True:
            pass

    t0 = time.monotonic()
    r = run_question("ex00_2", {"fit_latency_bandwidth": forever}, timeout=1.0)
    assert r.status == "timeout" and "1 s" in r.message and time.monotonic() - t0 < 5
    with pytest.raises(QuestionTimeout):
        with time_limit(0.2):
            time.sleep(2)


@pytest.mark.slow
def test_check_in_a_jupyter_kernel():
    """The solution notebook, executed in a real kernel: every check() prints a pass."""
    from nbclient import NotebookClient

    nb = nbformat.read(solution_of("00"), as_version=4)
    env_before = os.environ.pop("COURSE_GRADING", None)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(SOLUTIONS)}}).execute()
    finally:
        if env_before is not None:
            os.environ["COURSE_GRADING"] = env_before
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for q in load_lesson("00"):
        assert f"\u2705 {q.qid}" in text, text[-3000:]


# -- one test per question: `pytest -m ex00_1` ----------------------------------------------

def _qparams():
    return [pytest.param(q.qid, marks=getattr(pytest.mark, q.qid), id=q.qid) for q in all_questions()
            if not _ONLY or q.lesson in _ONLY]


@pytest.fixture(scope="session")
def lesson_grades(request, tmp_path_factory):
    """Grades of the notebooks the per-question tests look at, one grading per lesson."""
    opt = request.config.getoption("--notebooks")
    folder = Path(opt) if opt else (SOLUTIONS if SOLUTION_NBS else EXERCISES)
    if not folder.is_absolute():
        folder = Path(request.config.invocation_params.dir) / folder
    cache = {}

    def get(lesson):
        if lesson not in cache:
            nbs = sorted(folder.glob(f"{lesson}_*.ipynb"))
            if not nbs:
                pytest.skip(f"no notebook for lesson {lesson} in {folder}")
            if _BATCH and folder.resolve() == SOLUTIONS.resolve():  # graded already by this session
                cache[lesson] = _BATCH["rows"][f"{lesson}_solution"]
            else:
                from course_lib.grade import grade_one

                cache[lesson] = grade_one(nbs[0].stem, nbs[0], Limits(), hidden_dir=DEFAULT_HIDDEN_DIR)
        return cache[lesson]
    return get


@pytest.mark.parametrize("qid", _qparams())
def test_question(qid, lesson_grades):
    row = lesson_grades(qid[2:4])
    res = next((q for q in row["questions"] if q["qid"] == qid), None)
    assert res is not None, row["notes"]
    assert res["status"] == "passed", f"{qid} ({res['title']}): {res['message']}\n{res['traceback']}"
