"""The unprivileged-user sandbox (course_lib/grading/sandbox.py, ``sandbox_kind() == "user"``): where
bubblewrap cannot run but the grader is root, as in a Docker container such as Gradescope's, each
kernel runs as a uid of its own. The grader proves, as that uid, that the hidden checks, solutions,
submissions and output are unreadable, refuses otherwise, and kills every process of the uid.

The end-to-end test grades honest and hostile notebooks that way. On a machine whose interpreter
lives where other users cannot go (``/root``, mode 700, here), it runs the grader in a private mount
namespace (``unshare -m``) where that folder is opened to other users and the checkout's secrets
are replaced by private copies, as ``run_autograder`` makes them on Gradescope."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from course_lib.grade import GradingRefused, grade_paths
from course_lib.grading.sandbox import SANDBOX_ENV, _drop_to, _kill_uid, next_uid, readable_as, sandbox_kind

from common import EXERCISES, FIXTURES, REPO, SOLUTIONS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("user_sandbox"),   # one process: the uid checks are module-wide
              pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                 reason="the unprivileged-user sandbox needs root on Linux")]

SECRETS = ("tests/hidden", "solutions", "course_lib/reference")


def uid_processes(uid: int) -> list:
    return [e.name for e in os.scandir("/proc") if e.name.isdigit() and _owner(e) == uid]


def _owner(entry):
    try:
        return entry.stat().st_uid
    except OSError:
        return None


def test_it_is_chosen_when_asked_or_when_bubblewrap_cannot_run(monkeypatch):
    monkeypatch.setenv(SANDBOX_ENV, "user")
    assert sandbox_kind() == ("user", f"{SANDBOX_ENV}=user is set")
    monkeypatch.setenv(SANDBOX_ENV, "bogus")
    assert sandbox_kind()[0] is None
    monkeypatch.delenv(SANDBOX_ENV)
    monkeypatch.setattr("course_lib.grading.sandbox.sandbox_status", lambda: (False, "no user namespaces"))
    assert sandbox_kind() == ("user", "no user namespaces")


def test_readable_as_tries_for_real(tmp_path):
    open_dir = Path(tempfile.mkdtemp(prefix="course_test_open_"))
    try:
        open_dir.chmod(0o755)
        (open_dir / "public.txt").write_text("x")
        (open_dir / "public.txt").chmod(0o644)
        (open_dir / "private.txt").write_text("x")
        (open_dir / "private.txt").chmod(0o600)
        inner = open_dir / "closed"
        inner.mkdir(mode=0o700)
        (inner / "public_but_behind.txt").write_text("x")
        (inner / "public_but_behind.txt").chmod(0o644)
        (tmp_path / "mine.txt").write_text("x")            # pytest's tmp_path sits in a 700 folder
        paths = [open_dir, open_dir / "public.txt", open_dir / "private.txt", inner,
                 inner / "public_but_behind.txt", tmp_path / "mine.txt", open_dir / "absent"]
        assert readable_as(next_uid(), paths) == [str(open_dir), str(open_dir / "public.txt")]
    finally:
        shutil.rmtree(open_dir)


def test_grading_refuses_when_the_uid_could_read_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv(SANDBOX_ENV, "user")
    subs = Path(tempfile.mkdtemp(prefix="course_test_subs_"))
    try:
        subs.chmod(0o755)
        shutil.copy(SOLUTIONS / "00_cluster_in_your_laptop.ipynb", subs / "00_a.ipynb")
        (subs / "00_a.ipynb").chmod(0o644)
        with pytest.raises(GradingRefused) as e:
            grade_paths([subs], tmp_path / "out", quiet=True)
        assert str(subs) in str(e.value) and "chmod" in str(e.value), e.value
    finally:
        shutil.rmtree(subs)


def test_every_process_of_the_uid_is_killed():
    uid = next_uid()
    # a process that double-forks out of its session, as a daemon would
    subprocess.run(["/bin/sh", "-c", "setsid sleep 60 >/dev/null 2>&1 < /dev/null &"], preexec_fn=_drop_to(uid),
                   cwd="/", check=True, env={"PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 5
    while not uid_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uid_processes(uid), "the daemon did not start"
    _kill_uid(uid)
    deadline = time.monotonic() + 5
    while [p for p in uid_processes(uid) if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in uid_processes(uid) if _alive(p)]


def _alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ----------------------------------------------------------------------------- end to end

HOSTILE = ("write_outside", "daemon", "fork_bomb", "tamper_registry")


def _blocked_ancestor(path: Path, uid: int):
    """The outermost folder above ``path`` that ``uid`` cannot enter, or None."""
    for parent in reversed(path.parents):
        if str(parent) != "/" and not readable_as(uid, [parent]):
            return parent
    return None


def _namespace_script(work: Path, args: list, command=None) -> str:
    """Bash for a private mount namespace: the interpreter reachable by other users, the checkout's
    secrets replaced by private copies (mode 700, unless ``command`` is given), then the grader
    (or ``command``)."""
    # The checkout read-only in here: whatever goes wrong, the test cannot change it.
    lines = ["set -e", f"mount --rbind {REPO} {REPO}", f"mount -o remount,bind,ro {REPO}"]
    blocked = _blocked_ancestor(Path(sys.base_prefix).resolve(), next_uid())
    if blocked is not None:
        inside = Path(sys.base_prefix).resolve()
        lines += [f"mkdir -p {work}/interp", f"mount --bind {inside} {work}/interp",
                  f"mount -t tmpfs -o mode=755 tmpfs {blocked}", f"mkdir -p {inside}",
                  f"mount --bind {work}/interp {inside}"]
    if command is not None:
        return "\n".join(lines + [" ".join([f"{SANDBOX_ENV}=user", *command])])
    for rel in SECRETS:
        lines.append(f"mount --bind {work}/private/{rel} {REPO}/{rel}")
    lines.append(" ".join([f"{SANDBOX_ENV}=user", sys.executable, "-m", "course_lib.grade", *map(str, args)]))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def user_batch(tmp_path_factory):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_grading import apply_misbehaviour, base_notebook

    work = tmp_path_factory.mktemp("user_sandbox")          # 700: the grader's private side
    for rel in SECRETS:
        shutil.copytree(REPO / rel, work / "private" / rel)
        (work / "private" / rel).chmod(0o700)
    subs, out = work / "subs", work / "out"
    subs.mkdir()
    nbformat.write(nbformat.read(SOLUTIONS / "00_cluster_in_your_laptop.ipynb", as_version=4), subs / "00_victim.ipynb")
    nbformat.write(nbformat.read(EXERCISES / "00_cluster_in_your_laptop.ipynb", as_version=4), subs / "00_blank.ipynb")
    for name in HOSTILE:
        fx = FIXTURES / "hostile" / f"{name}.py"
        _, nb = base_notebook(fx)
        nbformat.write(apply_misbehaviour(nb, fx, {"OUT": out, "SUBS": subs}), subs / f"00_{name}.ipynb")
    before = {p: p.read_bytes() for p in subs.iterdir()}
    script = _namespace_script(work, [subs, "--out", out, "--jobs", "2"])
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    time.sleep(0.5)
    rows = {row["submission"]: row for row in csv.DictReader((out / "scores.csv").open())}
    return {"rows": rows, "stderr": r.stderr, "before": before, "subs": subs, "work": work}


def test_graded_as_an_unprivileged_user(user_batch):
    rows = user_batch["rows"]
    assert set(rows) == {"00_victim", "00_blank", *(f"00_{n}" for n in HOSTILE)}, rows
    assert all(r["sandbox"].startswith("user:") for r in rows.values()), rows
    assert "grading as an unprivileged user" in user_batch["stderr"]
    assert rows["00_victim"]["total"] == "5", rows["00_victim"]
    for name in ["00_blank", *(f"00_{n}" for n in HOSTILE)]:
        assert rows[name]["total"] == "0", rows[name]


def test_hostile_code_changed_nothing_and_left_no_process(user_batch):
    for path, data in user_batch["before"].items():
        assert path.read_bytes() == data, f"{path.name} was changed"
    assert {p.name for p in user_batch["subs"].iterdir()} == {p.name for p in user_batch["before"]}
    for rel in SECRETS:
        for f in (REPO / rel).rglob("*"):
            if f.is_file() and f.suffix in (".py", ".ipynb"):
                assert b"pwned" not in f.read_bytes(), f
    stray = [e.name for e in os.scandir("/proc") if e.name.isdigit() and (_owner(e) or 0) >= 1_600_000_000
             and _alive(e.name)]
    assert not stray, textwrap.shorten(f"processes of sandbox uids left: {stray}", 300)


def test_gradescope_grades_as_an_unprivileged_user(tmp_path):
    """Gradescope's layout in a folder every user may enter (as /autograder is): ``run_autograder``
    closes the source and the submission, then grades in the unprivileged-user sandbox."""
    from course_lib.grading.gradescope import build
    from course_lib.grading.registry import DEFAULT_HIDDEN_DIR

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_grading import apply_misbehaviour, base_notebook

    zip_path = build(tmp_path / "autograder.zip", DEFAULT_HIDDEN_DIR, "00", [])
    results = {}
    for name in ("solution", "write_outside"):
        root = Path(tempfile.mkdtemp(prefix="course_test_autograder_"))
        try:
            root.chmod(0o755)
            with zipfile.ZipFile(zip_path) as z:
                z.extractall(root / "source")
            for p in [root / "source", *(root / "source").rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)      # as an unzip leaves them: readable by all
            (root / "submission").mkdir(mode=0o755)
            if name == "solution":
                nb = nbformat.read(SOLUTIONS / "00_cluster_in_your_laptop.ipynb", as_version=4)
            else:
                fx = FIXTURES / "hostile" / f"{name}.py"
                _, nb = base_notebook(fx)
                nb = apply_misbehaviour(nb, fx, {"OUT": root / "results", "SUBS": root / "submission"})
                nb.cells[1].source += f"\nopen('{root}/source/hidden/ex00.py', 'a').write('pwned')"
            nbformat.write(nb, root / "submission" / "work.ipynb")
            script = _namespace_script(root, [], command=["bash", str(root / "source" / "run_autograder")])
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COURSE_GRADING_NO_SANDBOX")}
            env.update(AUTOGRADER_ROOT=str(root), COURSE_PYTHON=sys.executable)
            r = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script],
                               capture_output=True, text=True, timeout=300, env=env, cwd=root)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
            results[name] = json.loads((root / "results" / "results.json").read_text())
            assert b"pwned" not in (root / "source" / "hidden" / "ex00.py").read_bytes()
            assert os.stat(root / "source").st_mode & 0o077 == 0
        finally:
            shutil.rmtree(root, ignore_errors=True)
    assert results["solution"]["score"] == sum(t["max_score"] for t in results["solution"]["tests"]) > 0, \
        results["solution"]
    assert "sandbox: user:" in results["solution"]["output"], results["solution"]["output"]
    assert results["write_outside"]["score"] == 0, results["write_outside"]
