"""Generate ``exercises/NN_name.ipynb`` from ``solutions/NN_name.ipynb``.

Usage::

    python -m course_lib.grading.make_exercises            # every solution notebook
    python -m course_lib.grading.make_exercises --check    # exit 1 if exercises/ is stale

Each solution region becomes a stub raising ``NotImplementedError("exNN_k: <title>")``;
cells tagged ``solution-only`` are dropped; outputs and execution counts are cleared;
``metadata.course`` records the lesson and its question ids (the grader reads it).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Dict, List

import nbformat

from ..lessons import graded as graded_lessons
from .regions import RegionError, lesson_of_path, replace_regions, stub
from .registry import REPO_ROOT, load_lesson

SOLUTION_ONLY_TAG = "solution-only"


def build_exercise(nb, lesson: str, source_name: str = ""):
    """Return (exercise notebook, question ids in order of appearance)."""
    questions = {q.qid: q for q in load_lesson(lesson)}
    nb = copy.deepcopy(nb)
    cells, seen = [], []
    for k, cell in enumerate(nb.cells):
        if SOLUTION_ONLY_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        if cell.cell_type == "code":
            def rep(qid, indent, k=k):
                if qid not in questions:
                    known = ", ".join(questions) or "none"
                    raise RegionError(f"{source_name} cell {k}: unknown question {qid} (lesson {lesson} has {known})")
                return stub(qid, questions[qid].title, indent)

            cell.source, qids = replace_regions(cell.source, rep, where=f"{source_name} cell {k}")
            seen += [q for q in qids if q not in seen]
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
        cells.append(cell)
    missing = [q for q in questions if q not in seen]
    if missing:
        raise RegionError(f"{source_name}: no solution region for {', '.join(missing)}")
    nb.cells = cells
    nb.metadata["course"] = {"lesson": lesson, "questions": seen,
                             "generated_from": f"solutions/{Path(source_name).name}" if source_name else ""}
    return nb, seen


def render(nb) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def expected_exercises(solutions_dir: Path, exercises_dir: Path) -> Dict[Path, str]:
    """{exercise path: expected file text} for every graded lesson of the manifest whose solution
    notebook is in ``solutions_dir`` (tests/test_lessons.py checks that the course has them all)."""
    out = {}
    for lesson in graded_lessons():
        sol = Path(solutions_dir) / lesson.notebook
        if not sol.is_file():
            continue
        nb = nbformat.read(sol, as_version=4)
        ex, _ = build_exercise(nb, lesson_of_path(sol), sol.name)
        out[Path(exercises_dir) / sol.name] = render(ex)
    return out


def stale(solutions_dir: Path, exercises_dir: Path) -> List[Path]:
    """Exercise notebooks that are missing or differ from what the solutions generate."""
    bad = []
    for path, text in expected_exercises(solutions_dir, exercises_dir).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            bad.append(path)
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grading.make_exercises", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--solutions", type=Path, default=REPO_ROOT / "solutions")
    p.add_argument("--exercises", type=Path, default=REPO_ROOT / "exercises")
    p.add_argument("--check", action="store_true", help="only report stale exercise notebooks (exit 1 if any)")
    a = p.parse_args(argv)
    try:
        expected = expected_exercises(a.solutions, a.exercises)
    except (RegionError, LookupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    status = 0
    for path, text in expected.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            print(f"up to date: {path}")
        elif a.check:
            print(f"STALE: {path} (run `make exercises`)")
            status = 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
