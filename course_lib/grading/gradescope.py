"""Gradescope: build the autograder zip, and grade the one submission Gradescope hands it.

``python -m course_lib.grading.gradescope build --out build/gradescope/autograder.zip [--lesson NN]``
(``make gradescope``) writes a zip with, at its top level:

- ``setup.sh``: installs Python and the course's requirements (``requirements.txt``) in
  ``/autograder/venv``; Gradescope runs it once, when it builds the autograder image;
- ``run_autograder``: grades ``$AUTOGRADER_ROOT/submission`` (default ``/autograder``) and writes
  ``$AUTOGRADER_ROOT/results/results.json``; it closes the source and the submission to other
  users first, so that where bubblewrap cannot run (Gradescope's Docker containers forbid new user
  namespaces) student code runs as an unprivileged user that can read none of it;
- ``course_lib/``: the instructor's library, which the checks run with (the hidden checks may use
  the reference answers); the grader builds the student release of it (``build_library``) for the
  sandbox at each run, as ``make grade`` does, so graded code never sees the reference answers;
- ``hidden/exNN.py``: the hidden checks (of ``--lesson`` only, or of every lesson).

``python -m course_lib.grading.gradescope run --root DIR`` is what ``run_autograder`` calls. It
grades the notebook(s) in ``DIR/submission`` with the batch grader (a notebook that is not one, or a
link, is a 0 with its reason; several notebooks: the best counts) and writes one ``results.json``:
per question a visible test with its points, and a companion test worth 0 points, shown only once
grades are published (``after_published``), with the hidden checks' outcome.
"""
from __future__ import annotations

import argparse
import json
import re
import stat
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Optional, Sequence

from .registry import DEFAULT_HIDDEN_DIR, REPO_ROOT
from .report import gradescope_results, write_text

PACKAGE = Path(__file__).resolve().parents[1]
DEFAULT_ZIP = REPO_ROOT / "build" / "gradescope" / "autograder.zip"
# Not needed to grade: the lesson recordings (tens of MB), the JupyterLab UI.
_LEAVE_OUT = {"__pycache__", "recorded"}
_NOT_FOR_GRADING = ("jupyterlab",)

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu).
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \\
        || ! python3 -m venv --help >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv python3-pip
fi
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --quiet --upgrade pip
/autograder/venv/bin/python -m pip install --quiet -r requirements.txt
# Which sandbox runs in this image: bubblewrap, else (as root) an unprivileged user per submission:
PYTHONPATH="$PWD" /autograder/venv/bin/python -c \
    'from course_lib.grading.sandbox import sandbox_kind; print("sandbox:", sandbox_kind())' || true
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades $AUTOGRADER_ROOT/submission (default
# /autograder/submission) and writes $AUTOGRADER_ROOT/results/results.json.
set -uo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
SRC="$ROOT/source"
[ -d "$SRC/course_lib" ] || SRC="$(cd "$(dirname "$0")" && pwd)"
PY="${{COURSE_PYTHON:-/autograder/venv/bin/python}}"
[ -x "$PY" ] || PY=python3
# Where bubblewrap cannot run (Docker forbids new namespaces) student code runs as an unprivileged
# user, which the grader allows only when that user can read nothing of the grader's: so the
# source (hidden checks, reference answers) and the submission are closed to other users.
chmod 700 "$SRC" 2>/dev/null || true
chmod -R go-rwx "$ROOT/submission" 2>/dev/null || true
cd "$SRC"
export PYTHONPATH="$SRC${{PYTHONPATH:+:$PYTHONPATH}}"
exec "$PY" -m course_lib.grading.gradescope run --root "$ROOT" --hidden "$SRC/hidden" {args} "$@"
"""


def requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> List[str]:
    """The course's runtime dependencies (pyproject.toml), less the notebook-only ones."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib

        deps = tomllib.loads(text)["project"]["dependencies"]
    except ImportError:  # Python 3.10
        block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
        deps = re.findall(r'"([^"]+)"', block)
    return [d for d in deps if not d.lower().startswith(_NOT_FOR_GRADING)]


def _add(z: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
    z.writestr(info, data)


def _lesson_files(folder: Path, lesson: Optional[str]) -> List[Path]:
    return sorted(folder.glob(f"ex{lesson}.py" if lesson else "ex[0-9][0-9].py"))


def build(out: Path = DEFAULT_ZIP, hidden_dir: Path = DEFAULT_HIDDEN_DIR, lesson: Optional[str] = None,
          grader_args: Sequence[str] = ()) -> Path:
    """Write the Gradescope autograder zip (see the module doc); return its path."""
    out, hidden_dir = Path(out), Path(hidden_dir)
    hidden = _lesson_files(hidden_dir, lesson)
    if not hidden and "--visible-only" not in grader_args:
        raise SystemExit(f"no hidden checks {'ex' + lesson + '.py' if lesson else 'exNN.py'} in {hidden_dir}: "
                         "pass --hidden DIR, or --visible-only to build an autograder without them")
    args = list(grader_args) + (["--lesson", lesson] if lesson else [])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        _add(z, "setup.sh", SETUP_SH.encode(), executable=True)
        run = RUN_AUTOGRADER.format(args=" ".join(_shell_quote(a) for a in args))
        _add(z, "run_autograder", run.encode(), executable=True)
        _add(z, "requirements.txt", ("\n".join(requirements()) + "\n").encode())
        for path in sorted(PACKAGE.rglob("*")):
            rel = path.relative_to(PACKAGE.parent)
            if path.is_file() and not _LEAVE_OUT & set(rel.parts) and path.suffix != ".pyc":
                _add(z, rel.as_posix(), path.read_bytes())
        for path in hidden:
            _add(z, f"hidden/{path.name}", path.read_bytes())
    tmp.replace(out)
    return out


def _shell_quote(arg: str) -> str:
    return arg if re.fullmatch(r"[A-Za-z0-9_./=-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


# ----------------------------------------------------------------------------- grading one submission

def _refusal(message: str) -> dict:
    return {"score": 0, "output": f"The autograder could not grade this submission: {message} "
                                  "Tell your instructor; your submission is kept and can be regraded.",
            "tests": []}


def grade_submission(root: Path, hidden_dir: Optional[Path] = None, lesson: Optional[str] = None,
                     no_sandbox: bool = False, visible_only: bool = False, jobs: int = 1) -> dict:
    """Grade ``root/submission``; return the Gradescope result (also written to ``root/results/results.json``)."""
    from ..grade import GradingRefused, grade_paths

    root = Path(root)
    sub = root / "submission"
    with tempfile.TemporaryDirectory(prefix="course_gradescope_") as tmp:
        try:
            rows = grade_paths([sub], Path(tmp) / "out", hidden_dir=hidden_dir, lesson=lesson, jobs=jobs,
                               quiet=True, no_sandbox=no_sandbox, visible_only=visible_only) if sub.is_dir() else []
        except GradingRefused as e:
            result = _refusal(str(e))
            rows = None
    if rows is not None:
        result = _result_of(rows)
    write_text(root / "results" / "results.json", json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def _result_of(rows: List[dict]) -> dict:
    if not rows:
        return {"score": 0, "output": "No notebook (.ipynb file) in this submission: upload your exercise "
                                      "notebook.", "tests": []}
    best = max(rows, key=lambda r: (r["status"] == "ok", r["score"]))
    result = gradescope_results(best)
    if len(rows) > 1:
        others = ", ".join(f"{r['submission']} ({r['score']:g}/{r['max_score']:g})" for r in rows if r is not best)
        result["output"] = (f"Several notebooks were submitted; the best, {best['submission']}, counts. "
                            f"The others: {others}.\n" + result["output"])
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grading.gradescope", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the autograder zip")
    b.add_argument("--out", default=str(DEFAULT_ZIP))
    b.add_argument("--hidden", default=str(DEFAULT_HIDDEN_DIR), help="folder of the hidden checks exNN.py")
    b.add_argument("--lesson", default=None, help="the assignment's lesson (only its hidden checks are shipped)")
    b.add_argument("--no-sandbox", action="store_true", help="let run_autograder grade without bubblewrap")
    b.add_argument("--visible-only", action="store_true", help="an autograder without hidden checks")
    r = sub.add_parser("run", help="grade ROOT/submission into ROOT/results/results.json")
    r.add_argument("--root", default="/autograder")
    r.add_argument("--hidden", default=None)
    r.add_argument("--lesson", default=None)
    r.add_argument("--no-sandbox", action="store_true")
    r.add_argument("--visible-only", action="store_true")
    a = p.parse_args(argv)
    if a.command == "build":
        args = [f for f, on in (("--no-sandbox", a.no_sandbox), ("--visible-only", a.visible_only)) if on]
        path = build(Path(a.out), Path(a.hidden), a.lesson, args)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): upload it as the assignment's autograder")
        return 0
    result = grade_submission(Path(a.root), Path(a.hidden) if a.hidden else None, a.lesson, a.no_sandbox,
                              a.visible_only)
    print(f"score {result['score']}; {len(result['tests'])} tests; {a.root}/results/results.json")
    return 0 if result["tests"] or "No notebook" in result["output"] else 2


if __name__ == "__main__":
    sys.exit(main())
