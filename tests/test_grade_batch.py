"""A class-sized batch: one bad submission never costs the others (issue 29).

Each test builds a small folder holding a bad file (a lone surrogate in its name or its messages,
fields of the wrong type, a name too long for the file system, a symbolic link, a named pipe, a
device, names that collide once made file names, a formula for a name) and checks that the batch
finishes with a row per submission and the right ``status``. Most replace the sandboxed run by a
stand-in (``fake_grading``) so that only the batch's own code is under test; the last ones grade
for real.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

import course_lib.grade as grade
from course_lib.grading.checking import QuestionResult
from course_lib.grading.registry import DEFAULT_HIDDEN_DIR, REPO_ROOT, load_lesson
from course_lib.grading.report import Scrubber, safe_name, student_markdown
from course_lib.grading.sandbox import NotebookGrade

from common import EXERCISES, SOLUTIONS

EX00 = EXERCISES / "00_cluster_in_your_laptop.ipynb"
SOL00 = SOLUTIONS / "00_cluster_in_your_laptop.ipynb"


def scores(out: Path) -> dict:
    raw = (out / "scores.csv").read_bytes()
    raw.decode("utf-8")  # valid UTF-8, whatever the names held
    with open(out / "scores.csv", newline="", encoding="utf-8") as f:
        return {r["submission"]: r for r in csv.DictReader(f)}


@pytest.fixture
def fake_grading(monkeypatch, tmp_path):
    """Grading without sandboxes: every question passes, unless ``behaviour[path name]`` says
    otherwise (an exception to raise, or a function returning a NotebookGrade)."""
    behaviour = {}
    seen = []

    def fake(nb, questions, library, limits, seed=0, start_method=None, hidden=True):
        name = nb.metadata.get("test_name", "")
        seen.append(name)
        what = behaviour.get(name)
        if isinstance(what, BaseException):
            raise what
        if callable(what):
            return what(questions)
        res = {q.qid: QuestionResult(q.qid, q.title, q.points, q.points, "passed", "All checks passed.")
               for q in questions}
        return NotebookGrade(res, [], "", 0.01, 1)

    monkeypatch.setattr(grade, "grade_notebook", fake)
    monkeypatch.setattr(grade, "grading_library", lambda dest: Path(dest))
    monkeypatch.setattr(grade, "sandbox_kind", lambda: ("bubblewrap", "stand-in"))
    behaviour["_seen"] = seen
    return behaviour


def good(folder: Path, name: str, test_name: str | None = None) -> Path:
    nb = nbformat.read(EX00, as_version=4)
    nb.metadata["test_name"] = test_name or name
    path = folder / name
    nbformat.write(nb, path)
    return path


def run(folder, out, **kw):
    kw.setdefault("hidden_dir", DEFAULT_HIDDEN_DIR)
    return grade.grade_paths([folder], out, jobs=2, quiet=True, **kw)


def test_a_lone_surrogate_in_a_name_or_a_message(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    odd = os.fsdecode(bytes(subs) + b"/00_caf\xe9.ipynb")        # not UTF-8: a lone surrogate in Python
    good(subs, Path(odd).name, "odd")
    good(subs, "00_fine.ipynb")

    def surrogate(questions):
        q = questions[0]
        return NotebookGrade({q.qid: QuestionResult(q.qid, q.title, 0, q.points, "error", "raised \udce9 \ud800",
                                                    "Traceback\n  \udcff")}, ["cell 1: \udc80"], "\udc81", 0.1, 1)

    fake_grading["odd"] = surrogate
    rows = run(subs, tmp_path / "out")
    got = scores(tmp_path / "out")
    assert len(rows) == len(got) == 2
    assert got["00_fine"]["status"] == "ok" and got["00_fine"]["total"] == "5"
    (odd_row,) = [r for r in rows if r["submission"] != "00_fine"]
    fb = tmp_path / "out" / "feedback" / f"{safe_name(odd_row['submission'])}"
    text = fb.with_suffix(".json").read_bytes().decode("utf-8")
    assert "\\udce9" in text and json.loads(text)["notes"] == ["cell 1: \\udc80"]
    fb.with_suffix(".md").read_bytes().decode("utf-8")
    (tmp_path / "out" / "results" / safe_name(odd_row["submission"]) / "results.json").read_bytes().decode("utf-8")


@pytest.mark.parametrize("broken, reason", [
    ({"metadata": []}, "metadata is not an object"),
    ({"metadata": {"course": "00"}}, "metadata.course"),
    ({"cells": {"0": 1}}, "invalid-notebook"),
    ({"cells": [{"cell_type": "code", "source": 5, "metadata": {}, "outputs": [], "execution_count": None}]},
     "source is not text"),
    ({"cells": [{"cell_type": "code", "source": [1, 2], "metadata": {}, "outputs": [], "execution_count": None}]},
     "invalid-notebook"),
    ({"cells": [{"cell_type": "nonsense", "source": "", "metadata": {}}]}, "cell_type"),
    ({"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": 7,
                 "execution_count": None}]}, "outputs"),
    ({"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [],
                 "execution_count": None, "unknown_key": 1}]}, "invalid-notebook"),
    ({"nbformat": "four"}, "invalid-notebook"),
    (None, "invalid-notebook: not JSON"),
])
def test_a_notebook_of_the_wrong_shape_is_a_row(tmp_path, fake_grading, broken, reason):
    subs = tmp_path / "subs"
    subs.mkdir()
    good(subs, "00_fine.ipynb")
    base = json.loads(EX00.read_text())
    if broken is None:
        (subs / "00_bad.ipynb").write_text('{"cells": [ this is not json')
    else:
        base.update(broken)
        (subs / "00_bad.ipynb").write_text(json.dumps(base))
    run(subs, tmp_path / "out")
    got = scores(tmp_path / "out")
    assert set(got) == {"00_fine", "00_bad"}
    assert got["00_fine"]["status"] == "ok"
    assert got["00_bad"]["status"].startswith("invalid-notebook") and reason in got["00_bad"]["status"], got["00_bad"]
    assert got["00_bad"]["total"] == "0" and got["00_bad"]["max"] == "5"
    assert fake_grading["_seen"] == ["00_fine.ipynb"]  # the bad one never reached the grading


def test_a_name_longer_than_the_file_system_allows_in_the_output(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    deep = subs / ("d" * 200)
    deep.mkdir(parents=True)
    good(deep, "00_" + "é" * 100 + ".ipynb", "long")       # 252 bytes: a legal name, but id + folder is not
    good(subs, "00_fine.ipynb")
    rows = run(subs, tmp_path / "out")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for r in rows:
        assert len(r["feedback"].encode()) < 100
        assert (tmp_path / "out" / "feedback" / f"{r['feedback']}.json").exists()


def test_an_exception_while_grading_one_submission_costs_only_it(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    for k in range(4):
        good(subs, f"00_s{k}.ipynb")
    fake_grading["00_s1.ipynb"] = AttributeError("'int' object has no attribute 'strip'")
    fake_grading["00_s2.ipynb"] = RecursionError("deep")
    run(subs, tmp_path / "out")
    got = scores(tmp_path / "out")
    assert [got[f"00_s{k}"]["status"] for k in range(4)] == [
        "ok", "grader-error: AttributeError: 'int' object has no attribute 'strip'",
        "grader-error: RecursionError: deep", "ok"]
    assert got["00_s3"]["total"] == "5" and got["00_s1"]["total"] == "0"
    fb = json.loads((tmp_path / "out" / "feedback" / f"{safe_name('00_s1')}.json").read_text())
    assert fb["status"].startswith("grader-error") and fb["questions"][0]["points"] == 0


def test_a_failing_report_is_the_row_status(tmp_path, fake_grading, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    good(subs, "00_a.ipynb")
    good(subs, "00_b.ipynb")
    real = grade.write_feedback

    def write_feedback(row, out):
        if row["submission"] == "00_a":
            raise OSError(28, "No space left on device")
        return real(row, out)

    monkeypatch.setattr(grade, "write_feedback", write_feedback)
    run(subs, tmp_path / "out")
    got = scores(tmp_path / "out")
    assert got["00_a"]["status"].startswith("report-error: OSError") and got["00_b"]["status"] == "ok"


def test_links_pipes_and_devices_are_not_graded(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    good(subs, "00_fine.ipynb")
    (subs / "00_link.ipynb").symlink_to(SOL00)               # a solution outside the folder
    (subs / "00_dangling.ipynb").symlink_to(tmp_path / "nowhere")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    good(outside, "00_x.ipynb")
    (subs / "linked_folder").symlink_to(outside)             # not followed
    os.mkfifo(subs / "05_x.ipynb")                            # read before grading, it would hang forever
    device = True
    try:
        os.mknod(subs / "00_dev.ipynb", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except (PermissionError, OSError):
        device = False
    t0 = time.monotonic()
    run(subs, tmp_path / "out")
    assert time.monotonic() - t0 < 60
    got = scores(tmp_path / "out")
    expected = {"00_fine": "ok", "00_link": "not-a-regular-file: symbolic link",
                "00_dangling": "not-a-regular-file: symbolic link", "05_x": "not-a-regular-file: named pipe"}
    if device:
        expected["00_dev"] = "not-a-regular-file: character device"
    assert {k: v["status"] for k, v in got.items()} == expected
    assert got["00_link"]["total"] == "0" and got["05_x"]["max"] == str(int(sum(q.points for q in load_lesson("05"))))
    assert fake_grading["_seen"] == ["00_fine.ipynb"]


def test_ids_map_one_to_one_to_safe_file_names(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("05 bob.ipynb", "05_bob.ipynb", "...ipynb", ".hidden.ipynb", "-rf.ipynb"):
        good(subs, name)
    (subs / "alice").mkdir()
    good(subs / "alice", "05_bob.ipynb")
    rows = run(subs, tmp_path / "out", lesson="00")
    ids = sorted(r["submission"] for r in rows)
    assert ids == sorted(["05 bob", "05_bob", "..", ".hidden", "-rf", "alice/05_bob"])
    names = {r["feedback"] for r in rows}
    assert len(names) == len(rows)
    for n in names:
        assert not n.startswith(".") and "/" not in n and n == safe_name(next(
            r["submission"] for r in rows if r["feedback"] == n))
        assert (tmp_path / "out" / "feedback" / f"{n}.json").parent == tmp_path / "out" / "feedback"
        assert (tmp_path / "out" / "results" / n / "results.json").exists()
    got = scores(tmp_path / "out")
    assert got["'-rf"]["status"] == "ok"         # a cell starting with '-' is prefixed with a quote too


def test_csv_cells_cannot_start_a_formula(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    good(subs, '=HYPERLINK("x.example","click").ipynb')
    good(subs, "+1.ipynb")
    good(subs, "@SUM(A1).ipynb")
    run(subs, tmp_path / "out", lesson="00")
    with open(tmp_path / "out" / "scores.csv", newline="") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert "'=HYPERLINK(\"x.example\",\"click\")" in cells and "'+1" in cells and "'@SUM(A1)" in cells


def test_no_sandbox_is_refused_unless_asked(tmp_path, fake_grading, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    good(subs, "00_a.ipynb")
    monkeypatch.setattr(grade, "sandbox_kind", lambda: (None, "user namespaces are off and this is not root (test)"))
    monkeypatch.delenv(grade.NO_SANDBOX_ENV, raising=False)
    with pytest.raises(grade.GradingRefused, match="--no-sandbox"):
        run(subs, tmp_path / "out")
    assert not (tmp_path / "out" / "scores.csv").exists()
    (row,) = run(subs, tmp_path / "out", no_sandbox=True)
    assert row["sandbox"] == "none: --no-sandbox" and row["status"] == "ok"
    assert os.environ.get(grade.NO_SANDBOX_ENV) is None          # restored after the batch
    assert scores(tmp_path / "out")["00_a"]["sandbox"] == "none: --no-sandbox"
    fb = json.loads((tmp_path / "out" / "feedback" / f"{safe_name('00_a')}.json").read_text())
    assert fb["sandbox"] == "none: --no-sandbox" and fb["checks"] == "visible+hidden"
    monkeypatch.setenv(grade.NO_SANDBOX_ENV, "1")                 # the tests' explicit opt-in
    (row,) = run(subs, tmp_path / "out2")
    assert row["sandbox"].startswith("none: ")


def test_no_hidden_checks_is_refused_unless_asked(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    good(subs, "00_a.ipynb")
    for hidden in (tmp_path / "no_such_folder", tmp_path):   # missing, or without ex00.py
        with pytest.raises(grade.GradingRefused, match="--visible-only"):
            run(subs, tmp_path / "out", hidden_dir=hidden)
    (row,) = run(subs, tmp_path / "out", hidden_dir=tmp_path / "no_such_folder", visible_only=True)
    assert row["checks"] == "visible-only"
    assert scores(tmp_path / "out")["00_a"]["checks"] == "visible-only"
    fb = tmp_path / "out" / "feedback" / safe_name("00_a")
    assert json.loads(fb.with_suffix(".json").read_text())["checks"] == "visible-only"
    assert "visible-only" in fb.with_suffix(".md").read_text()
    cp = subprocess.run([sys.executable, "-m", "course_lib.grade", str(subs), "--out", str(tmp_path / "cli"),
                         "--hidden", str(tmp_path / "no_such_folder")], capture_output=True, text=True, timeout=120,
                        cwd=REPO_ROOT)
    assert cp.returncode == 2 and "--visible-only" in cp.stderr, cp.stderr[-2000:]


def test_an_interrupted_batch_still_writes_every_row(tmp_path, fake_grading):
    subs = tmp_path / "subs"
    subs.mkdir()
    for k in range(5):
        good(subs, f"00_s{k}.ipynb")
    gate = threading.Event()

    def interrupt(questions):
        os.kill(os.getpid(), signal.SIGINT)      # Ctrl-C while the batch runs
        gate.wait(5)
        raise RuntimeError("cut short")

    fake_grading["00_s1.ipynb"] = interrupt
    with pytest.raises(KeyboardInterrupt):
        grade.grade_paths([subs], tmp_path / "out", hidden_dir=DEFAULT_HIDDEN_DIR, jobs=1, quiet=True)
    gate.set()
    got = scores(tmp_path / "out")
    assert sorted(got) == [f"00_s{k}" for k in range(5)]
    assert got["00_s0"]["status"] == "ok" and got["00_s0"]["total"] == "5"
    assert all(got[f"00_s{k}"]["status"] == "not-graded: interrupted" for k in range(2, 5))


def test_student_feedback_has_no_grader_paths_or_frames(tmp_path):
    hidden_file = DEFAULT_HIDDEN_DIR / "ex00.py"
    tb = (f'Traceback (most recent call last):\n  File "{REPO_ROOT}/course_lib/grading/kernel.py", line 80, in run\n'
          f'    exec(code, ns)\n  File "<cell 3>", line 4, in sum_shard\n    return total / 0\n'
          f'  File "{hidden_file}", line 12, in check\n    assert x\n'
          f'  File "/tmp/course_grading_lib_abc/course_lib/grading/student.py", line 5, in call\n'
          f'    fn()\nZeroDivisionError: division by zero (see {REPO_ROOT}/solutions/00.ipynb)')
    row = {"submission": "00_alice", "notebook": str(tmp_path / "subs" / "00_alice.ipynb"), "status": "ok",
           "checks": "visible+hidden", "sandbox": "bubblewrap", "score": 2, "max_score": 5,
           "questions": [{"qid": "ex00_1", "title": "Sum | shard", "points": 0, "max_points": 2, "status": "error",
                          "message": f"`sum_shard` raised in {tmp_path}/subs/00_alice.ipynb", "traceback": tb},
                         {"qid": "ex00_2", "title": "Fit", "points": 2, "max_points": 2, "status": "passed",
                          "message": "All 4 checks passed.", "traceback": ""}],
           "notes": [f"cell 2: error in {Path.home()}/secret.txt and _course_hidden_ex00"]}
    md = student_markdown(row)
    for leak in (str(REPO_ROOT), str(tmp_path), str(Path.home()), "tests/hidden", "ex00.py", "_course_hidden",
                 "course_lib/grading", "course_grading_lib", "exec(code, ns)"):
        assert leak not in md, (leak, md)
    assert "ZeroDivisionError" in md and "<cell 3>" in md and "return total / 0" in md
    assert "| ex00_1 Sum \\| shard | 0 / 2 | error |" in md
    assert Scrubber()(f"{sys.prefix}/lib/numpy/x.py") == "<python>/lib/numpy/x.py"


# -- real grading (sandboxed where bubblewrap runs) ---------------------------------------------

@pytest.mark.slow
def test_a_real_batch_with_bad_files_grades_the_good_ones(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(nbformat.read(EX00, as_version=4), subs / "00_blank.ipynb")
    (subs / "00_link.ipynb").symlink_to(SOL00)
    os.mkfifo(subs / "00_pipe.ipynb")
    (subs / "00_text.ipynb").write_text("not a notebook")
    env = dict(os.environ)
    if grade.sandbox_kind()[0] != "bubblewrap":
        env[grade.NO_SANDBOX_ENV] = "1"
    cp = subprocess.run([sys.executable, "-m", "course_lib.grade", str(subs), "--out", str(tmp_path / "out"),
                         "--jobs", "2"], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=env)
    assert cp.returncode == 0, cp.stderr[-3000:]
    got = scores(tmp_path / "out")
    assert {k: (v["status"], v["total"]) for k, v in got.items()} == {
        "00_blank": ("ok", "0"), "00_link": ("not-a-regular-file: symbolic link", "0"),
        "00_pipe": ("not-a-regular-file: named pipe", "0"), "00_text": ("invalid-notebook: not JSON "
                                                                       "(JSONDecodeError)", "0")}
    assert "3 not graded normally" in cp.stdout
