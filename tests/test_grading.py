"""The exercise framework and the grader: can it pass the good, fail the wrong, survive the bad?

Every solution notebook, its exercise twin, each misbehaving and hostile submission, and one
wrong and one correct answer fixture (tests/fixtures/) are graded once, in one batch, by the
real sandboxed grader (a subprocess per submission); the tests below read that batch. The
verdict on every answer fixture is checked by the same check code, run in-process, in
tests/test_checks.py; COURSE_ALL_FIXTURES=1 (``make test-all``) sends all 115 of them through
the sandbox too (each costs a sandboxed kernel running the whole notebook, about 5 s of CPU).

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
from course_lib.grading.report import safe_name
from course_lib.grading.sandbox import Limits

from common import EXERCISES, FIXTURES, REPO, SOLUTIONS, TEST_LESSONS, expected_points
from common import fixture_header as header

# The tests that read the graded batch carry xdist_group("grading") (conftest.py), so that one
# process grades it; the others spread over the test processes.

LIMITS = Limits()   # the defaults an instructor gets: cells 20 s, each question its own limit (<= 20 s)
# For the misbehaving ones: short limits, longer where every Cluster start re-imports Python (spawn, forkserver).
_FORK = __import__("course_lib").default_start_method() == "fork"
TIGHT = Limits(cell_timeout=6 if _FORK else 20, timeout=10 if _FORK else 20, memory_mb=2048, total_timeout=240)
BUDGET = 90 if _FORK else 200  # seconds a misbehaving submission may take to grade under TIGHT (attempts included)
MARKER = "course-grading-test-marker-7f3a"   # in the command line of processes a fixture leaves behind

_ONLY = TEST_LESSONS     # COURSE_TEST_LESSONS=00,01 limits this file to some lessons (default: all)
SOLUTION_NBS = [p for p in sorted(SOLUTIONS.glob("[0-9][0-9]_*.ipynb")) if not _ONLY or p.name[:2] in _ONLY]
WRONG = [p for p in sorted((FIXTURES / "wrong_answers").glob("ex[0-9][0-9]_*__*.py"))
         if not _ONLY or p.name[2:4] in _ONLY]
CORRECT = [p for p in sorted((FIXTURES / "correct_alternatives").glob("ex[0-9][0-9]_*__*.py"))
           if not _ONLY or p.name[2:4] in _ONLY]
if not os.environ.get("COURSE_ALL_FIXTURES"):
    WRONG, CORRECT = WRONG[:1], CORRECT[:1]
MISBEHAVING = sorted((FIXTURES / "misbehaving").glob("*.py"))
# A fixture saying "# graded alone:" has its own test (cpu_hog.py: tests/test_sandbox_limits.py), which
# needs its neighbour in the batch to be a known one.
HOSTILE = sorted(p for p in (FIXTURES / "hostile").glob("*.py") if "\n# graded alone:" not in p.read_text())


def _sandboxed() -> bool:
    from course_lib.grading.sandbox import sandbox_status

    return sandbox_status()[0]


# Hostile submissions are graded only inside the sandbox: without it they would really damage
# this checkout (that is the point of them). test_the_sandbox_is_used_where_it_can_be fails CI then.
HOSTILE_RUN = HOSTILE if _sandboxed() else []
# Where bubblewrap cannot run, the grader refuses unless told to grade without it: these tests say so
# (and test_the_sandbox_is_used_where_it_can_be fails CI then).
NO_SANDBOX = not _sandboxed()
LESSONS = [lesson_of_path(p) for p in SOLUTION_NBS]


def solution_of(lesson: str) -> Path:
    return next(p for p in SOLUTION_NBS if lesson_of_path(p) == lesson)


def fill(text: str, places: dict) -> str:
    """A fixture's text with its {REPO}, {OUT}, {SUBS} and {MARKER} placeholders filled in."""
    for key, value in dict(places, MARKER=MARKER, REPO=str(REPO)).items():
        text = text.replace("{" + key + "}", str(value))
    return text


def apply_misbehaviour(nb, fixture: Path, places: dict | None = None):
    """A notebook with the edit a misbehaving (or hostile) fixture describes."""
    text = fill(fixture.read_text(), places or {})
    header_line = re.compile(r"^#\s*(base|action|expect[-a-z]*):")
    body = "\n".join(line for line in text.splitlines() if not header_line.match(line)).strip()
    action, _, arg = header(fixture)["action"][0].partition(":")
    arg = arg.strip()
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    idx = [k for k, c in enumerate(nb.cells) if c.cell_type == "code" and arg and arg in c.source]
    if action == "replace-region":
        body = "\n".join(line for line in body.splitlines() if not line.startswith("# "))
        stub = re.compile(rf'^([ \t]*)raise NotImplementedError\("{arg}:[^\n]*$', re.M)
        for cell in nb.cells:
            m = stub.search(cell.source) if cell.cell_type == "code" else None
            if m:  # an exercise notebook: the stub line becomes the body
                indented = "\n".join(m.group(1) + line for line in body.splitlines())
                cell.source = cell.source[:m.start()] + indented + cell.source[m.end():]
                return nb
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


def base_notebook(fixture: Path):
    """The notebook a fixture edits: ``# base: exercise 04`` or ``solution 00`` (default: the 00 solution)."""
    kind, _, lesson = (header(fixture).get("base", ["solution 00"])[0]).partition(" ")
    src = solution_of(lesson) if kind == "solution" else EXERCISES / solution_of(lesson).name
    return lesson, nbformat.read(src, as_version=4)


@pytest.fixture(scope="session")
def batch(tmp_path_factory):
    """Grade every submission of this file once: {submission id: feedback row}, plus timings."""
    subs = tmp_path_factory.mktemp("submissions")
    mis = tmp_path_factory.mktemp("misbehaving")
    out = tmp_path_factory.mktemp("grades")
    mis_out = tmp_path_factory.mktemp("grades_misbehaving")
    places = {"OUT": mis_out, "SUBS": mis}
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
    for fx in CORRECT:
        qid = fx.name.split("__")[0]
        lesson = qid[2:4]
        nb = replace_region_in_notebook(nbformat.read(solution_of(lesson), as_version=4), qid, fx.read_text())
        nbformat.write(nb, subs / f"{lesson}_correct__{fx.stem}.ipynb")
    if not _ONLY:   # the misbehaving and hostile fixtures test the grader, not a lesson
        for fx in MISBEHAVING + HOSTILE_RUN:
            lesson, nb = base_notebook(fx)
            kind = "hostile" if fx in HOSTILE else "misbehaving"
            path = mis / f"{lesson}_{kind}__{fx.stem}.ipynb"
            if header(fx)["action"][0] == "corrupt-file":
                path.write_text('{"cells": [ this is not json')
            else:
                nbformat.write(apply_misbehaviour(nb, fx, places), path)
        nbformat.write(nbformat.read(solution_of("00"), as_version=4), mis / "00_victim.ipynb")
        (mis_out / "feedback").mkdir(parents=True, exist_ok=True)
    # What write_outside.py aims at (and nothing else, so that edits made meanwhile do not count).
    protected = {p: p.read_bytes() for p in (REPO / "tests" / "hidden" / "ex00.py", mis / "00_victim.ipynb",
                                              REPO / "course_lib" / "questions" / "ex00.py") if p.exists()}
    from course_lib.grade import grade_paths

    t0 = time.monotonic()
    rows = grade_paths([subs], out, LIMITS, hidden_dir=DEFAULT_HIDDEN_DIR, jobs=2, quiet=True, no_sandbox=NO_SANDBOX)
    wall = time.monotonic() - t0
    mis_rows = grade_paths([mis], mis_out, TIGHT, hidden_dir=DEFAULT_HIDDEN_DIR, jobs=2, quiet=True,
                           no_sandbox=NO_SANDBOX) \
        if any(mis.iterdir()) else []
    _BATCH.update({"rows": {r["submission"]: r for r in rows + mis_rows}, "main": [r["submission"] for r in rows],
                   "out": out, "mis_out": mis_out, "subs": subs, "mis": mis, "wall": wall, "protected": protected})
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
    assert not row["notes"], f"cells of solutions/{lesson} raised in the sandbox: {row['notes']}"


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
    got = points(row)
    # a question whose statement says it builds on this one may lose its points too, and then says why
    for later in load_lesson(qid[2:4]):
        if qid in later.builds_on and got.get(later.qid) == 0:
            want[later.qid] = 0
    assert got == want, {q["qid"]: q["message"] for q in row["questions"]}
    assert next(q for q in row["questions"] if q["qid"] == qid)["message"]


def row_of(batch, fixture):
    if fixture in HOSTILE and not HOSTILE_RUN:
        pytest.skip("hostile submissions are graded only where the sandbox runs")
    if _ONLY:
        pytest.skip("COURSE_TEST_LESSONS is set: the grader's own fixtures are left to the whole suite")
    lesson, nb = base_notebook(fixture)
    kind = "hostile" if fixture in HOSTILE else "misbehaving"
    return batch["rows"][f"{lesson}_{kind}__{fixture.stem}"]


@pytest.mark.parametrize("fixture", CORRECT, ids=lambda p: p.stem)
def test_correct_alternative_scores_full_marks(batch, fixture):
    """An answer written differently from the solution, graded by the real grader in its sandbox."""
    qid = fixture.name.split("__")[0]
    row = batch["rows"][f"{qid[2:4]}_correct__{fixture.stem}"]
    assert points(row) == full_marks(qid[2:4]), {q["qid"]: q["message"] for q in row["questions"]}


@pytest.mark.parametrize("fixture", MISBEHAVING + HOSTILE, ids=lambda p: p.stem)
def test_misbehaving_submission_is_graded_with_a_message(batch, fixture):
    row = row_of(batch, fixture)
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
    fb = json.loads((batch["mis_out"] / "feedback" / f"{safe_name('00_misbehaving__huge_output')}.json").read_text())
    assert len(json.dumps(fb)) < 100_000


def marked_processes() -> list:
    """Processes whose command line carries the fixtures' marker."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if MARKER in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def test_no_process_outlives_grading(batch):
    """Leftover workers, a process in its own session, a double-forked daemon: all gone."""
    if not HOSTILE_RUN:
        pytest.skip("hostile submissions are graded only where the sandbox runs")
    assert batch["rows"]["00_misbehaving__leftover_workers"] and batch["rows"]["00_hostile__daemon"]
    deadline = time.monotonic() + 5
    while marked_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(), "processes left behind by a submission"


# -- hostile submissions: each attack gains nothing and leaves nothing behind ----------------

def test_hostile_submissions_change_no_file(batch):
    """Hidden checks, visible checks and another submission are byte-for-byte as before; the
    grader's output holds only what the grader wrote."""
    if not HOSTILE_RUN:
        pytest.skip("hostile submissions are graded only where the sandbox runs")
    for path, before in batch["protected"].items():
        assert path.read_bytes() == before, f"{path} was changed during grading"
    out = batch["mis_out"]
    assert not (out / "feedback" / "victim.json").exists()
    text = (out / "scores.csv").read_text()
    assert "pwned" not in text and "150" not in text.replace("1500", "")
    assert text.startswith("submission,ex00_1")


def test_hostile_submissions_read_no_secret(batch):
    """Nothing of the hidden checks or the solutions reaches a hostile submission's feedback."""
    if not HOSTILE_RUN:
        pytest.skip("hostile submissions are graded only where the sandbox runs")
    secrets = [line.strip() for p in (REPO / "tests" / "hidden").glob("*.py") for line in p.read_text().splitlines()
               if len(line.strip()) > 30 and not line.strip().startswith(("#", "from", "import", '"""'))]
    assert secrets
    for fx in HOSTILE:
        if base_notebook(fx)[1] is None:
            continue
        name = safe_name(f"{base_notebook(fx)[0]}_hostile__{fx.stem}")
        fb = "".join((batch["mis_out"] / "feedback" / f"{name}{ext}").read_text() for ext in (".json", ".md"))
        leaked = [s for s in secrets if s in fb]
        assert not leaked, f"{fx.stem}: feedback carries hidden-check text {leaked[:2]}"
    row = batch["rows"]["00_hostile__read_secrets"]
    message = next(q["message"] for q in row["questions"] if q["qid"] == "ex00_2")
    assert "secrets found: 0" in message, message


def test_scores_are_capped(batch):
    for row in batch["rows"].values():
        assert 0 <= row["score"] <= row["max_score"]
        assert all(0 <= q["points"] <= q["max_points"] for q in row["questions"])


def test_a_hanging_answer_costs_at_most_one_question_limit(tmp_path):
    """With the default limits, a notebook whose ex00_2 never returns grades within 20 s (plus
    noise) of the same notebook answered honestly."""
    from course_lib.grade import grade_paths

    honest = nbformat.read(solution_of("00"), as_version=4)
    hang = apply_misbehaviour(honest, FIXTURES / "hostile" / "hang_in_answer.py")
    nbformat.write(honest, tmp_path / "00_honest.ipynb")
    nbformat.write(hang, tmp_path / "00_hang.ipynb")
    rows = {}
    for name in ("00_honest", "00_hang"):
        (rows[name],) = grade_paths([tmp_path / f"{name}.ipynb"], tmp_path / "out", Limits(), quiet=True,
                                     no_sandbox=NO_SANDBOX)
    assert rows["00_honest"]["score"] == 5 and rows["00_hang"]["score"] == 3
    extra = rows["00_hang"]["elapsed"] - rows["00_honest"]["elapsed"]
    print(f"honest {rows['00_honest']['elapsed']:.1f} s, with a hanging answer {rows['00_hang']['elapsed']:.1f} s")
    assert extra <= 20 + 8, extra


def test_reports(batch):
    out, rows = batch["out"], {k: batch["rows"][k] for k in batch["main"]}
    with open(out / "scores.csv", newline="") as f:
        table = list(csv.reader(f))
    head = table[0]
    qids = [q.qid for q in all_questions() if q.lesson in LESSONS]
    tail = ["status", "sandbox", "checks", "total", "max"]
    assert head[0] == "submission" and head[-5:] == tail and sorted(head[1:-5]) == sorted(qids)
    assert sorted(r[0] for r in table[1:]) == sorted(rows)
    for r in table[1:]:
        row = rows[r[0]]
        assert float(r[-2]) == row["score"] and float(r[-1]) == row["max_score"]
        assert sum(float(x) for x in r[1:-5] if x) == row["score"]
        assert r[-5:-2] == ["ok", "bubblewrap" if _sandboxed() else r[-4], "visible+hidden"], r
    for sid, row in rows.items():
        fb = json.loads((out / "feedback" / f"{safe_name(sid)}.json").read_text())
        assert {"submission", "score", "max_score", "questions", "notes", "status", "sandbox", "checks"} <= set(fb)
        for q in fb["questions"]:
            assert {"qid", "points", "max_points", "status", "message", "traceback"} <= set(q)
        md = (out / "feedback" / f"{safe_name(sid)}.md").read_text()
        assert f"**Score: {row['score']:g} / {row['max_score']:g}**" in md and str(REPO) not in md
        gs = json.loads((out / "results" / safe_name(sid) / "results.json").read_text())
        assert gs["score"] == sum(t["score"] for t in gs["tests"]) == row["score"]
        assert all({"name", "score", "max_score", "output", "status", "visibility"} <= set(t) for t in gs["tests"])
        assert all(t["max_score"] == 0 for t in gs["tests"] if t["visibility"] != "visible")


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


def test_grading_without_a_sandbox_says_so(tmp_path):
    """Told to (COURSE_GRADING_NO_SANDBOX=1, or --no-sandbox), grading without bubblewrap works, says so
    plainly, records it, and skips a cell calling os._exit. (Not told to, it refuses: test_grade_batch.py.)"""
    ex = nbformat.read(EXERCISES / solution_of("00").name, as_version=4)
    nb = apply_misbehaviour(ex, FIXTURES / "misbehaving" / "os_exit_cell.py")
    nbformat.write(nb, tmp_path / "00_student.ipynb")
    cp = subprocess.run([sys.executable, "-m", "course_lib.grade", str(tmp_path / "00_student.ipynb"), "--out",
                         str(tmp_path / "out")], capture_output=True, text=True, timeout=240, cwd=REPO,
                        env=dict(os.environ, COURSE_GRADING_NO_SANDBOX="1"))
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "grading without a sandbox" in cp.stderr
    fb = json.loads((tmp_path / "out" / "feedback" / f"{safe_name('00_student')}.json").read_text())
    assert fb["sandbox"] == "none: COURSE_GRADING_NO_SANDBOX=1 is set"
    assert fb["score"] == 0 and {q["status"] for q in fb["questions"]} == {"not_implemented"}
    assert any("exit code 7" in n for n in fb["notes"]), fb["notes"]


def test_the_sandbox_is_used_where_it_can_be():
    from course_lib.grading.sandbox import sandbox_status

    usable, why = sandbox_status()
    if not usable and os.environ.get("CI"):
        pytest.fail(f"bubblewrap does not run on this CI machine: {why}")
    if not usable:
        pytest.skip(f"no sandbox here: {why}")


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
        resources = {"metadata": {"path": str(SOLUTIONS)}}
        NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources).execute()
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
                from course_lib.grade import grade_paths

                out = tmp_path_factory.mktemp(f"grades_{lesson}")
                (cache[lesson],) = grade_paths([nbs[0]], out, Limits(), hidden_dir=DEFAULT_HIDDEN_DIR, quiet=True,
                                                no_sandbox=NO_SANDBOX)
        return cache[lesson]
    return get


@pytest.mark.parametrize("qid", _qparams())
def test_question(qid, lesson_grades):
    row = lesson_grades(qid[2:4])
    res = next((q for q in row["questions"] if q["qid"] == qid), None)
    assert res is not None, row["notes"]
    assert res["status"] == "passed", f"{qid} ({res['title']}): {res['message']}\n{res['traceback']}"
