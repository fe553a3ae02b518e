"""Grade exercise notebooks: ``python -m course_lib.grade PATH... --out DIR``.

PATH is a notebook or a folder of submissions (searched recursively for ``*.ipynb``).
Each notebook is executed in its own sandboxed subprocess (time limits per cell and per
question, a memory limit, its worker processes killed at the end) and graded with the
visible and the hidden (instructor) checks of its lesson. Writes:

- ``DIR/scores.csv``: a row per submission, a column per question id, then ``total`` and ``max``;
- ``DIR/feedback/<submission>.json``: points, status, message and traceback per question;
- ``DIR/results/<submission>/results.json``: the same in Gradescope's format.

The lesson of a notebook is read from its metadata (``metadata.course.lesson``, written by
``make exercises``), else from its file name (``00_name.ipynb``), else from the question ids
its code mentions; ``--lesson`` forces it.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from .grading.registry import DEFAULT_HIDDEN_DIR, load_lesson
from .grading.report import write_feedback, write_gradescope, write_scores
from .grading.sandbox import CELL_TIMEOUT, MEMORY_MB, Limits, grade_notebook, sandbox_status

_QID_IN_TEXT = re.compile(r"\bex(\d{2})_\d+\b")


def find_submissions(paths: Iterable) -> List[Tuple[str, Path]]:
    """[(submission id, notebook path)] for notebooks and folders of notebooks."""
    out, used = [], collections.Counter()
    for p in map(Path, paths):
        if p.is_dir():
            found = [(str(f.relative_to(p).with_suffix("")).replace("\\", "/"), f)
                     for f in sorted(p.rglob("*.ipynb")) if ".ipynb_checkpoints" not in f.parts]
        elif p.exists():
            found = [(p.stem, p)]
        else:
            raise FileNotFoundError(f"{p}: no such notebook or folder")
        for sid, f in found:
            used[sid] += 1
            out.append((sid if used[sid] == 1 else f"{sid}-{used[sid]}", f))
    return out


def detect_lesson(path: Path, forced: Optional[str] = None) -> Optional[str]:
    """The lesson a notebook answers (see the module doc), or None."""
    if forced:
        return forced
    try:
        import nbformat

        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - a corrupt notebook: maybe its name still tells
        nb = None
    if nb is not None:
        lesson = (nb.metadata.get("course") or {}).get("lesson")
        if lesson:
            return str(lesson)
    m = re.match(r"^(\d{2})_", path.name)
    if m:
        return m.group(1)
    if nb is not None:
        hits = collections.Counter(m.group(1) for c in nb.cells for m in _QID_IN_TEXT.finditer(c.source))
        if hits:
            return hits.most_common(1)[0][0]
    return None


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


def grade_one(sid: str, path: Path, questions: Optional[list], library: Path, limits: Limits, seed: int = 0,
              lesson: Optional[str] = None, start_method: Optional[str] = None, note: str = "") -> dict:
    """Grade one notebook; return its feedback row (never raises on student errors)."""
    import nbformat

    row = {"submission": sid, "notebook": str(path), "lesson": lesson, "score": 0, "max_score": 0,
           "questions": [], "notes": [note] if note else [], "elapsed": 0.0, "output_tail": ""}
    if questions is None:
        return row
    row["max_score"] = sum(q.points for q in questions)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - a corrupt or truncated file still gets a row
        row["notes"].append(f"The notebook could not be read ({type(e).__name__}); every question scores 0.")
        row["questions"] = [{"qid": q.qid, "title": q.title, "points": 0, "max_points": q.points,
                             "status": "crashed", "message": "Not graded: the notebook file could not be read.",
                             "traceback": "", "elapsed": 0.0} for q in questions]
        return row
    g = grade_notebook(nb, questions, library, limits, seed=seed, start_method=start_method)
    row["questions"] = [r.to_dict() for r in g.results.values()]
    row["score"], row["max_score"] = score_of(g.results, questions)
    for q in row["questions"]:
        q["points"] = min(max(float(q["points"]), 0.0), float(q["max_points"]))
    row["notes"] += g.notes
    row["elapsed"] = g.elapsed
    row["output_tail"] = g.output[-4000:]
    return row


def grade_paths(paths, out, limits: Limits = Limits(), hidden_dir=None, seed: int = 0, jobs: Optional[int] = None,
                lesson: Optional[str] = None, start_method: Optional[str] = None, quiet: bool = False) -> List[dict]:
    """Grade every submission under ``paths``, ``jobs`` at a time (default: one per core); write the
    reports in ``out``; return the rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    subs = find_submissions(paths)
    usable, why = sandbox_status()
    if not usable:
        print(f"grading without a sandbox: {why}. Student code then runs as this user, in its own "
              "session with a memory limit, and could read or change files this user can (see README, "
              "'Grading without a sandbox').", file=sys.stderr)
    # Checks are loaded here, before any thread starts: the registry is not thread-safe.
    plan = []
    for sid, path in subs:
        found = detect_lesson(path, lesson)
        note, questions = "", None
        if found is None:
            note = ("Cannot tell which lesson this notebook answers: name it NN_name.ipynb "
                    "or keep the metadata of the exercise notebook.")
        else:
            try:
                questions = load_lesson(found, hidden_dir=hidden_dir, with_hidden=True)
            except LookupError as e:
                note = str(e)
        plan.append((sid, path, found, questions, note))
    jobs = max(1, jobs or os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="course_grading_lib_") as tmp:
        library = grading_library(Path(tmp)) if subs else Path(tmp)
        bar = None
        if not quiet and len(plan) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(plan), desc="grading", unit="notebook", file=sys.stderr)

        def one(item):
            sid, path, found, questions, note = item
            row = grade_one(sid, path, questions, library, limits, seed, found, start_method, note)
            write_feedback(row, out)
            write_gradescope(row, out)
            if bar is not None:
                bar.update(1)
            if not quiet:
                text = (f"{sid}: {row['score']:g}/{row['max_score']:g}"
                        + "".join(f"\n   {q['qid']} {q['points']:g}/{q['max_points']:g} {q['message'][:150]}"
                                  for q in row["questions"] if q["status"] != "passed")
                        + "".join(f"\n   note: {n[:150]}" for n in row["notes"]))
                (bar.write(text) if bar is not None else print(text, flush=True))
            return row

        try:
            with ThreadPoolExecutor(max_workers=jobs) as ex:
                rows = list(ex.map(one, plan))
        finally:
            if bar is not None:
                bar.close()
    write_scores(rows, out)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grade", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    p.add_argument("--out", default="grades", help="output folder (default: grades)")
    p.add_argument("--hidden", default=str(DEFAULT_HIDDEN_DIR),
                   help="folder of instructor checks exNN.py (default: tests/hidden)")
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
    if not Path(a.hidden).is_dir():
        print(f"note: no instructor checks in {a.hidden}; grading with the visible checks only", file=sys.stderr)
    try:
        rows = grade_paths(a.paths, a.out, limits, hidden_dir=a.hidden, seed=a.seed, jobs=a.jobs,
                           lesson=a.lesson, start_method=a.start_method)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("no notebooks found", file=sys.stderr)
        return 2
    print(f"wrote {Path(a.out) / 'scores.csv'} ({len(rows)} submission{'s' if len(rows) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
