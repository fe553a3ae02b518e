"""Grade exercise notebooks: ``python -m course_lib.grade PATH... --out DIR``.

PATH is a notebook or a folder of submissions (searched recursively for ``*.ipynb``; symbolic
links are not followed). Each notebook is executed in its own sandboxed subprocess (time limits
per cell and per question, a memory limit, its worker processes killed at the end) and graded
with the visible and the hidden (instructor) checks of its lesson. Writes:

- ``DIR/scores.csv``: a row per submission, always (rewritten as each one finishes, and at the
  end even when grading is interrupted): ``submission``, a column per question id, ``status``
  (``ok``, or why the submission could not be graded: ``invalid-notebook: ...``,
  ``not-a-regular-file: ...``, ``grader-error: ...``), ``sandbox``, ``checks``, ``total``, ``max``;
- ``DIR/feedback/<name>.json``: the instructor's record (points, status, message and traceback
  per question, and a hidden failure's ``detail`` with its inputs, notes, output);
  ``DIR/feedback/<name>.md``: the feedback a student can be handed;
- ``DIR/results/<name>/results.json``: the same in Gradescope's format.

``<name>`` is the submission id made a safe file name, with a hash of the id (:func:`safe_name`).

Grading refuses to run weaker than it should unless told: without a working sandbox
(bubblewrap) pass ``--no-sandbox``; without hidden checks for a lesson pass ``--visible-only``.
Both facts are in ``scores.csv`` and in every feedback file.

The lesson of a notebook is read from its metadata (``metadata.course.lesson``, written by
``make exercises``), else from its file name (``00_name.ipynb``), else from the question ids
its code mentions; ``--lesson`` forces it.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from .grading.registry import DEFAULT_HIDDEN_DIR, REPO_ROOT, load_lesson
from .grading.report import safe_name, write_feedback, write_gradescope, write_scores
from .grading.sandbox import CELL_TIMEOUT, MEMORY_MB, Limits, grade_notebook, next_uid, readable_as, sandbox_kind

_QID_IN_TEXT = re.compile(r"\bex(\d{2})_\d+\b")
MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024   # larger files are not read (a row says so)
NO_SANDBOX_ENV = "COURSE_GRADING_NO_SANDBOX"
SUFFIX = ".ipynb"


class GradingRefused(RuntimeError):
    """Grading would be weaker than asked (no sandbox, no hidden checks) and was not allowed to be."""


# ----------------------------------------------------------------------------- finding and reading

def _walk(folder: Path) -> List[Path]:
    """Every entry named ``*.ipynb`` under ``folder``, whatever its type; symbolic links to
    folders are not followed, checkpoint folders are skipped."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            if name.endswith(SUFFIX):
                found.append(Path(root) / name)
    return found


def _sid_of(rel: str) -> str:
    rel = rel.replace("\\", "/")
    return rel[: -len(SUFFIX)] if rel.endswith(SUFFIX) else rel


def find_submissions(paths: Iterable) -> List[Tuple[str, Path]]:
    """[(submission id, notebook path)] for notebooks and folders of notebooks (ids unique)."""
    out, used = [], set()
    for p in map(Path, paths):
        if p.is_dir():  # a folder named on the command line may be a link; nothing under it is followed
            found = [(_sid_of(os.path.relpath(f, p)), f) for f in _walk(p)]
        elif os.path.lexists(p):
            found = [(_sid_of(p.name), p)]
        else:
            raise FileNotFoundError(f"{p}: no such notebook or folder")
        for sid, f in found:
            unique, k = sid, 1
            while unique in used:
                k += 1
                unique = f"{sid}-{k}"
            used.add(unique)
            out.append((unique, f))
    return out


class InvalidSubmission(Exception):
    """The file is not a notebook we can grade; ``status`` says why (a scores.csv status)."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "named pipe"), (stat.S_ISDIR, "folder"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def read_bytes(path: Path, max_bytes: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of a regular file (never a link, pipe or device: those raise InvalidSubmission
    without being opened for reading, or opened without blocking and refused)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise InvalidSubmission(f"unreadable: {e.strerror or type(e).__name__}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidSubmission(f"not-a-regular-file: {_file_kind(st.st_mode)}")
    if st.st_size > max_bytes:
        raise InvalidSubmission(f"too-large: {st.st_size} bytes (at most {max_bytes})")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise InvalidSubmission(f"unreadable: {e.strerror or type(e).__name__}") from None
    try:
        st = os.fstat(fd)  # what was opened: the file may have been swapped since lstat
        if not stat.S_ISREG(st.st_mode):
            raise InvalidSubmission(f"not-a-regular-file: {_file_kind(st.st_mode)}")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InvalidSubmission(f"too-large: more than {max_bytes} bytes")
    return b"".join(chunks)


def _is_text(x, lines: bool) -> bool:
    """A string (or, in a file as saved, a list of strings: nbformat joins them)."""
    return isinstance(x, str) or (lines and isinstance(x, list) and all(isinstance(s, str) for s in x))


def _check_types(nb, lines: bool = False) -> None:
    """The types grading relies on; raises InvalidSubmission naming the first wrong one. ``lines``:
    the JSON as saved, where a source may be a list of lines."""
    def bad(what):
        raise InvalidSubmission(f"invalid-notebook: {what}")

    if not isinstance(nb, dict):
        bad("not a JSON object")
    if not isinstance(nb.get("metadata"), dict):
        bad("metadata is not an object")
    course = nb["metadata"].get("course")
    if course is not None and not (isinstance(course, dict) and isinstance(course.get("lesson", ""), (str, int))):
        bad("metadata.course is not an object with a lesson string")
    if not isinstance(nb.get("cells"), list):
        bad("cells is not a list")
    for k, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict):
            bad(f"cell {k + 1} is not an object")
        if cell.get("cell_type") not in ("code", "markdown", "raw"):
            bad(f"cell {k + 1} has no valid cell_type")
        if not _is_text(cell.get("source"), lines):
            bad(f"cell {k + 1}'s source is not text")
        if not isinstance(cell.get("metadata", {}), dict):
            bad(f"cell {k + 1}'s metadata is not an object")
        if cell["cell_type"] == "code" and not isinstance(cell.get("outputs", []), list):
            bad(f"cell {k + 1}'s outputs is not a list")


def read_notebook(path: Path):
    """A validated notebook (nbformat 4) from ``path``, its outputs dropped (grading runs the code
    again); raises InvalidSubmission saying why it cannot be graded."""
    import json

    import nbformat
    from nbformat.converter import convert
    from nbformat.reader import reads as read_any

    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidSubmission("invalid-notebook: not UTF-8 text") from None
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidSubmission(f"invalid-notebook: not JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise InvalidSubmission("invalid-notebook: not a JSON object")
    if raw.get("nbformat") == 4:
        _check_types(raw, lines=True)   # before nbformat touches it: it assumes these types
    try:
        nb = convert(read_any(text), 4)
    except Exception as e:  # noqa: BLE001 - anything nbformat cannot read (wrong version, wrong shape)
        raise InvalidSubmission(f"invalid-notebook: not a notebook ({type(e).__name__})") from None
    _check_types(nb)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nbformat.validate(nb)
    except Exception as e:  # noqa: BLE001 - ValidationError, or the validator choking on the input
        first = str(getattr(e, "message", e)).splitlines()[0][:150] if str(e) else type(e).__name__
        raise InvalidSubmission(f"invalid-notebook: {first}") from None
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
        cell.pop("attachments", None)
    return nb


def detect_lesson(path: Path, forced: Optional[str] = None, nb=None) -> Optional[str]:
    """The lesson a notebook answers (see the module doc), or None. ``nb``: the notebook, read
    already (else it is read here, safely)."""
    if nb is None and not forced:
        with contextlib.suppress(InvalidSubmission):
            nb = read_notebook(path)
    return _lesson_of(path, forced, nb)


def _lesson_of(path: Path, forced: Optional[str], nb) -> Optional[str]:
    """:func:`detect_lesson` without reading: ``nb`` is the notebook, or None if it is unreadable."""
    if forced:
        return forced
    if nb is not None:
        lesson = str((nb.metadata.get("course") or {}).get("lesson", ""))
        if re.fullmatch(r"\d{2}", lesson):
            return lesson
    m = re.match(r"^(\d{2})_", Path(path).name)
    if m:
        return m.group(1)
    if nb is not None:
        hits = collections.Counter(m.group(1) for c in nb.cells for m in _QID_IN_TEXT.finditer(c.source))
        if hits:
            return hits.most_common(1)[0][0]
    return None


# ----------------------------------------------------------------------------- grading

def grading_library(dest: Path) -> Path:
    """Build, in ``dest``, the ``course_lib`` the sandbox imports: the student release's.

    Graded code must see the library students have, not the instructor's (which holds the
    reference answers), or calling a library function would score where it fails at home.
    """
    dest = Path(dest)
    try:
        from .release import build_library
    except ImportError:  # pragma: no cover - the release builder is part of the course
        build_library = None
    if build_library is not None:
        build_library(dest)
    else:
        shutil.copytree(Path(__file__).resolve().parent, dest / "course_lib",
                        ignore=shutil.ignore_patterns("__pycache__", "reference"))
    for p in [dest, *dest.rglob("*")]:  # the sandbox's user must be able to read it
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def score_of(results: dict, questions) -> tuple:
    """(score, max): each question's points capped by its own, the total by the notebook's maximum."""
    top = {q.qid: float(q.points) for q in questions}
    score = sum(min(max(float(r.points), 0.0), top[qid]) for qid, r in results.items() if qid in top)
    maximum = sum(top.values())
    return min(score, maximum), maximum


def _one_line(text, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def new_row(sid: str, path: Path, lesson=None, questions=None, status: str = "ok", note: str = "",
            sandbox: str = "", checks: str = "") -> dict:
    """A feedback row; while not graded, every known question has 0 points and says why."""
    row = {"submission": sid, "notebook": str(path), "feedback": safe_name(sid), "lesson": lesson,
           "status": status, "sandbox": sandbox, "checks": checks, "score": 0,
           "max_score": sum(q.points for q in questions or []), "questions": [], "notes": [note] if note else [],
           "elapsed": 0.0, "output_tail": ""}
    why = "" if status == "ok" else f"Not graded: {status}."
    row["questions"] = [{"qid": q.qid, "title": q.title, "points": 0, "max_points": q.points,
                         "status": "not_graded", "message": why, "traceback": "", "elapsed": 0.0,
                         "hidden_checks": 0} for q in questions or []]
    return row


def grade_one(sid: str, path: Path, questions: Optional[list], library: Path, limits: Limits, seed: int = 0,
              lesson: Optional[str] = None, start_method: Optional[str] = None, note: str = "", nb=None,
              hidden: bool = True, sandbox: str = "", checks: str = "") -> dict:
    """Grade one notebook; return its feedback row (student errors never raise; a notebook that
    cannot be read or is not valid is a row whose status says why)."""
    if questions is None:
        return new_row(sid, path, lesson, None, "unknown-lesson" if not note else "no-questions", note, sandbox,
                       checks)
    try:
        nb = nb if nb is not None else read_notebook(path)
    except InvalidSubmission as e:
        row = new_row(sid, path, lesson, questions, e.status, note, sandbox, checks)
        row["notes"].append(f"The notebook could not be graded ({e.status}); every question scores 0.")
        return row
    row = new_row(sid, path, lesson, questions, "ok", note, sandbox, checks)
    g = grade_notebook(nb, questions, library, limits, seed=seed, start_method=start_method, hidden=hidden)
    n_hidden = {q.qid: len(q.hidden) if hidden else 0 for q in questions}
    row["questions"] = [dict(r.to_dict(), hidden_checks=n_hidden.get(r.qid, 0)) for r in g.results.values()]
    row["score"], row["max_score"] = score_of(g.results, questions)
    for q in row["questions"]:
        q["points"] = min(max(float(q["points"]), 0.0), float(q["max_points"]))
    row["notes"] += g.notes
    row["elapsed"] = g.elapsed
    row["output_tail"] = g.output[-4000:]
    return row


class _Plan:
    """What to grade: per submission its notebook (read and validated), lesson and questions."""

    def __init__(self, subs, lesson, hidden_dir, visible_only):
        self.items, self.lessons = [], {}
        self.hidden_dir = Path(hidden_dir) if hidden_dir else DEFAULT_HIDDEN_DIR
        for sid, path in subs:
            self.items.append(self._plan_one(sid, path, lesson, visible_only))

    def _plan_one(self, sid, path, forced, visible_only) -> dict:
        item = {"sid": sid, "path": path, "lesson": None, "questions": None, "note": "", "nb": None, "status": "ok"}
        try:
            try:
                item["nb"] = read_notebook(path)
            except InvalidSubmission as e:
                item["status"] = e.status
            found = _lesson_of(path, forced, item["nb"])
            item["lesson"] = found
            if found is None:
                item["note"] = ("Cannot tell which lesson this notebook answers: name it NN_name.ipynb "
                                "or keep the metadata of the exercise notebook.")
            else:
                item["questions"] = self._questions(found, visible_only)
        except LookupError as e:
            item["note"] = _one_line(e, 300)
        except Exception as e:  # noqa: BLE001 - one submission never stops the batch
            item["status"] = f"grader-error: {type(e).__name__}: {_one_line(e)}"
        return item

    def _questions(self, lesson, visible_only):
        if lesson not in self.lessons:
            self.lessons[lesson] = load_lesson(lesson, hidden_dir=self.hidden_dir, with_hidden=not visible_only)
        return self.lessons[lesson]

    def lessons_without_hidden(self) -> List[str]:
        """Lessons to grade whose hidden checks file (``exNN.py`` in the hidden folder) is missing."""
        return sorted(n for n in self.lessons if not (self.hidden_dir / f"ex{n}.py").is_file())


def _is_release() -> bool:
    try:
        from .replay import is_release

        return is_release()
    except Exception:  # noqa: BLE001 - no replay module, or no reference package: not the release
        return False


def _private_paths(paths, out: Path, hidden_dir) -> list:
    """What student code must not read: the submissions, the output, the hidden checks, the
    solutions and the reference answers."""
    package = Path(__file__).resolve().parent
    return [*map(Path, paths), out, Path(hidden_dir or DEFAULT_HIDDEN_DIR), REPO_ROOT / "solutions",
            package / "reference"]


def _sandbox_mode(no_sandbox: bool, private=()) -> str:
    """The ``sandbox`` column: ``bubblewrap``, ``user: why`` or ``none: why``; raises GradingRefused
    where no sandbox can run and no one said to grade without it, or where the unprivileged user
    could read one of the ``private`` paths (hidden checks, solutions, submissions, output)."""
    if no_sandbox:
        os.environ[NO_SANDBOX_ENV] = "1"   # restored by grade_paths
        print("grading without a sandbox (--no-sandbox): student code runs as this user, in its own session "
              "with a memory limit (see README, 'Grading without a sandbox').", file=sys.stderr)
        return "none: --no-sandbox"
    kind, why = sandbox_kind()
    if kind == "bubblewrap":
        return "bubblewrap"
    if kind == "user":
        readable = readable_as(next_uid(), private)
        if readable:
            raise GradingRefused(
                f"bubblewrap cannot run here ({why}), and the unprivileged user student code would run as can "
                f"read {', '.join(readable[:5])}. Make them unreadable by other users (chmod -R go-rwx) or grade "
                "where bubblewrap runs (see README, 'Grading in a container').")
        print(f"grading as an unprivileged user (bubblewrap cannot run here: {why}); it cannot read the hidden "
              "checks, solutions, submissions or output (tried).", file=sys.stderr)
        return f"user: {_one_line(why, 100)}"
    opted = os.environ.get(NO_SANDBOX_ENV) == "1"
    if not opted and not _is_release():
        raise GradingRefused(f"the sandbox cannot run here ({why}). Grade on a Linux machine where bubblewrap "
                             "runs, or pass --no-sandbox to grade without it (student code then runs as this user; "
                             "see README, 'Grading without a sandbox').")
    print(f"grading without a sandbox: {why}. Student code then runs as this user, in its own session "
          "with a memory limit, and could read or change files this user can (see README, "
          "'Grading without a sandbox').", file=sys.stderr)
    return f"none: {_one_line(why, 100)}"


def _checks_mode(plan: _Plan, visible_only: bool) -> str:
    if visible_only:
        return "visible-only"
    missing = plan.lessons_without_hidden()
    if not plan.hidden_dir.is_dir() or missing:
        where = (f"no folder {plan.hidden_dir}" if not plan.hidden_dir.is_dir()
                 else f"no hidden checks for lesson{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                      f"in {plan.hidden_dir}")
        if not _is_release():
            raise GradingRefused(f"{where}. Pass --hidden DIR (the instructor's checks), or --visible-only to "
                                 "grade with the visible checks only.")
        print(f"note: {where}; grading with the visible checks only (the student release)", file=sys.stderr)
        return "visible-only"
    return "visible+hidden"


def _status_line(row: dict) -> str:
    text = f"{row['submission']}: {row['score']:g}/{row['max_score']:g}"
    if row["status"] != "ok":
        text += f" ({row['status']})"
    text += "".join(f"\n   {q['qid']} {q['points']:g}/{q['max_points']:g} {q['message'][:150]}"
                    for q in row["questions"] if q["status"] != "passed")
    return text + "".join(f"\n   note: {n[:150]}" for n in row["notes"])


class _Batch:
    """The rows of a batch, in submission order, with ``scores.csv`` rewritten as they arrive."""

    def __init__(self, plan: _Plan, out: Path, sandbox: str, checks: str):
        self.out, self.lock = out, threading.Lock()
        self.rows = [new_row(i["sid"], i["path"], i["lesson"], i["questions"], "not-graded: interrupted",
                             i["note"], sandbox, checks) for i in plan.items]
        self.closed = False

    def finish(self, k: int, row: dict) -> None:
        with self.lock:
            if self.closed:  # interrupted: a grading still running when the batch ended does not count
                return
            self.rows[k] = row
            try:
                write_scores(self.rows, self.out)
            except Exception as e:  # noqa: BLE001 - the final write tries again
                print(f"warning: scores.csv not written yet: {e!r}", file=sys.stderr)

    def write(self) -> None:
        with self.lock:
            self.closed = True
            write_scores(self.rows, self.out)


def _report(row: dict, out: Path) -> dict:
    """Write a row's feedback files; a failure becomes its status (the row stays in scores.csv)."""
    try:
        write_feedback(row, out)
        write_gradescope(row, out)
    except Exception as e:  # noqa: BLE001 - e.g. a full disk: the other submissions go on
        row["status"] = f"report-error: {type(e).__name__}: {_one_line(e)}"
    return row


def grade_paths(paths, out, limits: Limits = Limits(), hidden_dir=None, seed: int = 0, jobs: Optional[int] = None,
                lesson: Optional[str] = None, start_method: Optional[str] = None, quiet: bool = False,
                no_sandbox: bool = False, visible_only: bool = False) -> List[dict]:
    """Grade every submission under ``paths``, ``jobs`` at a time (default: one per core); write the
    reports in ``out``; return the rows, one per submission whatever happened to it.

    Raises :class:`GradingRefused` where the sandbox cannot run (unless ``no_sandbox``, or the
    environment variable ``COURSE_GRADING_NO_SANDBOX=1``) or a lesson has no hidden checks (unless
    ``visible_only``), before grading anything."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    saved_env = os.environ.get(NO_SANDBOX_ENV)
    try:
        subs = find_submissions(paths)
        sandbox = _sandbox_mode(no_sandbox, _private_paths(paths, out, hidden_dir)) if subs else ""
        # Notebooks are read and checks loaded here, before any thread starts: the registry is not thread-safe.
        plan = _Plan(subs, lesson, hidden_dir, visible_only)
        checks = _checks_mode(plan, visible_only) if subs else ""
        batch = _Batch(plan, out, sandbox, checks)
        try:
            _grade_all(plan, batch, out, limits, seed, jobs, start_method, quiet, hidden=checks != "visible-only")
        finally:
            batch.write()
        return batch.rows
    finally:
        if saved_env is None:
            os.environ.pop(NO_SANDBOX_ENV, None)
        else:
            os.environ[NO_SANDBOX_ENV] = saved_env


def _grade_all(plan, batch, out, limits, seed, jobs, start_method, quiet, hidden) -> None:
    jobs = max(1, jobs or os.cpu_count() or 1)
    items = plan.items
    with tempfile.TemporaryDirectory(prefix="course_grading_lib_") as tmp:
        library = grading_library(Path(tmp)) if items else Path(tmp)
        bar = None
        if not quiet and len(items) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(items), desc="grading", unit="notebook", file=sys.stderr)
        base = batch.rows

        def one(k):
            i = items[k]
            try:
                if i["status"] != "ok":
                    row = dict(base[k], status=i["status"])
                    row["questions"] = [dict(q, message=f"Not graded: {i['status']}.") for q in row["questions"]]
                    row["notes"] = row["notes"] + [f"The notebook could not be graded ({i['status']}); "
                                                   "every question scores 0."]
                else:
                    row = grade_one(i["sid"], i["path"], i["questions"], library, limits, seed, i["lesson"],
                                    start_method, i["note"], nb=i["nb"], hidden=hidden, sandbox=base[k]["sandbox"],
                                    checks=base[k]["checks"])
            except Exception as e:  # noqa: BLE001 - one submission never stops the batch
                row = dict(base[k], status=f"grader-error: {type(e).__name__}: {_one_line(e)}")
                row["questions"] = [dict(q, message="Not graded: the grader failed on this submission.")
                                    for q in row["questions"]]
            i["nb"] = None  # the memory goes back as the batch proceeds
            row = _report(row, out)
            batch.finish(k, row)
            if bar is not None:
                bar.update(1)
            if not quiet:
                (bar.write if bar is not None else print)(_status_line(row))
            return row

        ex = ThreadPoolExecutor(max_workers=jobs)
        try:
            pending = {ex.submit(one, k) for k in range(len(items))}
            while pending:
                _, pending = wait(pending, return_when=FIRST_COMPLETED)
        finally:
            ex.shutdown(wait=False, cancel_futures=True)
            if bar is not None:
                bar.close()


def _interrupt_on_sigterm() -> None:
    """SIGTERM ends grading like Ctrl-C: scores.csv is written with the rows done so far."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, handler)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grade", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    p.add_argument("--out", default="grades", help="output folder (default: grades)")
    p.add_argument("--hidden", default=str(DEFAULT_HIDDEN_DIR),
                   help="folder of instructor checks exNN.py (default: tests/hidden)")
    p.add_argument("--visible-only", action="store_true",
                   help="grade with the visible checks only (otherwise a lesson without hidden checks is refused)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade without the bubblewrap sandbox (otherwise refused where it cannot run)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per question (default: each question's own, at most 20)")
    p.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT,
                   help=f"seconds per notebook cell (default {CELL_TIMEOUT:g})")
    p.add_argument("--memory-mb", type=int, default=MEMORY_MB,
                   help=f"memory limit per process in MiB (default {MEMORY_MB}; 0: none)")
    p.add_argument("--jobs", type=int, default=None, help="submissions graded at once (default: one per core)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lesson", default=None, help="force the lesson number, e.g. 00")
    p.add_argument("--start-method", default=None, choices=["fork", "spawn", "forkserver"])
    a = p.parse_args(argv)
    limits = Limits(cell_timeout=a.cell_timeout, timeout=a.timeout, memory_mb=a.memory_mb or None)
    _interrupt_on_sigterm()
    try:
        rows = grade_paths(a.paths, a.out, limits, hidden_dir=a.hidden, seed=a.seed, jobs=a.jobs,
                           lesson=a.lesson, start_method=a.start_method, no_sandbox=a.no_sandbox,
                           visible_only=a.visible_only)
    except (FileNotFoundError, GradingRefused) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {Path(a.out) / 'scores.csv'} has the submissions graded so far", file=sys.stderr)
        return 130
    if not rows:
        print("no notebooks found", file=sys.stderr)
        return 2
    bad = sum(r["status"] != "ok" for r in rows)
    print(f"wrote {Path(a.out) / 'scores.csv'} ({len(rows)} submission{'s' if len(rows) != 1 else ''}"
          + (f", {bad} not graded normally: see the status column" if bad else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
