"""``make lab`` opens the whole course: JupyterLab served at the course's root, in the checkout and
in the student release, with ``notebooks/`` and ``exercises/`` reachable and the start page first."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course_lib import lessons

from common import REPO

TOKEN = "course-lab-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{'&' if '?' in path else '?'}token={TOKEN}",
                                timeout=5) as r:
        return r.status, r.geturl(), r.read()


def _serve_and_look(root: Path) -> dict:
    """Start ``python -m course_lib.lab`` (what ``make lab`` runs) from ``root``'s library, as a
    student would from another folder; return what its contents API shows."""
    port = _free_port()
    cmd = [sys.executable, "-m", "course_lib.lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
           f"--IdentityProvider.token={TOKEN}"]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(cmd, cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(port, "/api/status")
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer within 60 s"
                time.sleep(0.3)
        seen = {}
        for folder in ("notebooks", "exercises"):
            status, _, body = _get(port, f"/api/contents/{folder}?content=1")
            seen[folder] = (status, sorted(x["name"] for x in json.loads(body)["content"] if x["type"] == "notebook"))
        seen["start"] = _get(port, "/api/contents/START_HERE.ipynb?content=0")[0]
        seen["opens"] = _get(port, "/")[1]
        return seen
    finally:
        proc.terminate()
        proc.wait(20)


def _check(seen):
    assert seen["notebooks"] == (200, sorted(x.notebook for x in lessons.LESSONS)), seen["notebooks"]
    assert seen["exercises"] == (200, sorted(x.notebook for x in lessons.graded())), seen["exercises"]
    assert seen["start"] == 200
    assert re.search(r"/lab/tree/START_HERE\.ipynb", seen["opens"]), seen["opens"]


@pytest.mark.slow
def test_lab_serves_the_course_root_in_the_checkout():
    _check(_serve_and_look(REPO))


@pytest.mark.slow
def test_lab_serves_the_course_root_in_the_release(tmp_path):
    from course_lib.release import build

    out = build(tmp_path / "course", archive=False)
    _check(_serve_and_look(out))
    assert "python -m course_lib.lab" in (out / "Makefile").read_text()


def test_make_lab_runs_the_lab_module():
    text = (REPO / "Makefile").read_text()
    recipe = text.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/python -m course_lib.lab" in recipe and "$(MPI_STAMP)" in recipe.splitlines()[0]


def test_start_page_lists_every_lesson_with_its_exercise_and_is_up_to_date():
    page = nbformat.read(REPO / "START_HERE.ipynb", as_version=4)
    assert nbformat.writes(page) == nbformat.writes(lessons.start_page()), \
        "START_HERE.ipynb is stale: python -m course_lib.lessons --start-page START_HERE.ipynb"
    text = page.cells[0].source
    for x in lessons.LESSONS:
        assert f"(notebooks/{x.notebook})" in text
        assert (f"(exercises/{x.notebook})" in text) == x.graded


def _makefiles(tmp_path):
    from course_lib.release import STUDENT_MAKEFILE

    student = tmp_path / "student.mk"
    student.write_text(STUDENT_MAKEFILE)
    return {"the course's": REPO / "Makefile", "the release's": student}


@pytest.mark.parametrize("installs", [True, False], ids=["pip works", "pip fails"])
def test_make_lab_installs_the_mpi_extra_and_tries_again_after_a_failure(tmp_path, installs):
    """The lab target depends on the MPI stamp, whose rule installs the ``mpi`` extra. When that
    fails it says so (lesson 07's MPI cells then skip, saying how to install it) and writes no stamp,
    so the next ``make lab`` tries again. Run with a stand-in for the environment's Python."""
    import subprocess

    assert "mpi" in (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1]
    for name, makefile in _makefiles(tmp_path).items():
        assert re.search(r"^lab: .*\$\(MPI_STAMP\)", makefile.read_text(), re.M), f"{name} lab skips the extra"
        venv = tmp_path / name.split()[1].strip("'s") / "venv"
        (venv / "bin").mkdir(parents=True)
        pip_log = venv / "pip.log"
        python = venv / "bin" / "python"
        python.write_text(f'#!/bin/sh\necho "$@" >> {pip_log}\nexit {0 if installs else 1}\n')
        python.chmod(0o755)
        (venv / ".installed").touch()       # the base install is done (newer than pyproject.toml)
        run = subprocess.run(["make", "-f", str(makefile), f"VENV={venv}", str(venv / ".installed-mpi")],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (name, run.stdout, run.stderr)
        assert ".[mpi]" in pip_log.read_text(), name
        assert (venv / ".installed-mpi").exists() == installs, name
        if not installs:
            assert "lesson 07's MPI cells" in run.stdout and "tries again" in run.stdout, (name, run.stdout)


def test_without_mpi_the_lab_says_what_skips_and_how_to_install_it(monkeypatch, capsys):
    """``python -m course_lib.lab`` prints, before JupyterLab starts, whether lesson 07's MPI cells can
    run; without mpiexec the message names what skips and the command that installs the extra."""
    import course_lib.runtime.mpi_backend as mpi_backend
    from course_lib import lab

    started = []
    monkeypatch.setattr(lab.os, "execv", lambda path, argv: started.append(argv))
    monkeypatch.setattr(lab.os, "chdir", lambda path: None)
    monkeypatch.setattr(mpi_backend, "mpiexec_path", lambda: None)
    lab.main(["--no-browser"])
    said = capsys.readouterr().err
    assert started and started[0][-1] == "--no-browser"
    assert said.startswith("warning: ") and "lesson 07's MPI cells will skip" in said
    assert lab.MPI_INSTALL in said and "restart" in said
    assert lab.mpi_missing_message() in said

    monkeypatch.setattr(mpi_backend, "mpiexec_path", lambda: "/opt/mpich/bin/mpiexec")
    lab.main([])
    said = capsys.readouterr().err
    assert "/opt/mpich/bin/mpiexec" in said and "will run" in said and "warning" not in said


def test_lesson_07_tells_a_student_without_mpi_how_to_get_it():
    """The lesson's first cell prints the lab's message where mpiexec is missing, and its
    prerequisites say that make lab installs the extra."""
    nb = nbformat.read(REPO / "notebooks" / "07_beyond_one_machine.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "mpi_missing_message()" in code[0]
    assert "`make lab` installs it" in nb.cells[0].source
