"""A class of 300 submissions graded with ``--jobs 2``: every row present, time per submission.

The class (issue 29: grading a class of hundreds) is generated from what ``tests/fixtures``
holds, for the lessons whose checks are fast (00 and 04): solutions and the correct alternatives
(full marks), the wrong answers (each loses its question's points), blank exercises (0), broken
files (not JSON, fields of the wrong type, not UTF-8, empty, a named pipe, a symbolic link to a
solution, names with spaces, accents, a formula, a lone surrogate) and, where the sandbox runs,
the hostile notebooks (each gains nothing). Prints the wall time, the time per submission, the
rows per status and every score that differs from what its kind expects.
``python -m benchmarks.bench_class [N]`` (default 300).
"""
from __future__ import annotations

import collections
import csv
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
LESSONS = ("00", "04")
JOBS = 2


def _nb(kind: str, lesson: str):
    folder = REPO / ("solutions" if kind == "solution" else "exercises")
    return nbformat.read(next(folder.glob(f"{lesson}_*.ipynb")), as_version=4)


def _answers(full: dict):
    """(name, notebook, expected score) for the correct, wrong and blank submissions, cycled."""
    from course_lib.grading.regions import replace_region_in_notebook

    kinds = []
    for lesson in LESSONS:
        kinds.append((f"{lesson}_solution", _nb("solution", lesson), full[lesson][None]))
        kinds.append((f"{lesson}_blank", _nb("exercise", lesson), 0))
        for sub, score in (("correct_alternatives", None), ("wrong_answers", "lose")):
            for fx in sorted((FIXTURES / sub).glob(f"ex{lesson}_*__*.py")):
                qid = fx.name.split("__")[0]
                nb = replace_region_in_notebook(_nb("solution", lesson), qid, fx.read_text())
                expect = full[lesson][None] - (full[lesson][qid] if score == "lose" else 0)
                kinds.append((f"{lesson}_{'wrong' if score else 'correct'}__{fx.stem}", nb, expect))
    return kinds


def _hostile(folder: Path, out: Path):
    """(name, notebook, expected score) per hostile fixture (tests/test_grading.py's recipe)."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from test_grading import apply_misbehaviour, base_notebook

        from common import expected_points
    finally:
        sys.path.pop(0)
    found = []
    for fx in sorted((FIXTURES / "hostile").glob("*.py")):
        lesson, nb = base_notebook(fx)
        if nb is None or lesson not in LESSONS:
            continue
        nb = apply_misbehaviour(nb, fx, {"OUT": out, "SUBS": folder})
        found.append((f"{lesson}_hostile__{fx.stem}", nb, sum(expected_points(fx).values())))
    return found


def _broken(folder: Path, k: int) -> str:
    """Write the k-th kind of broken submission in ``folder``; return its id."""
    ex = json.loads(next((REPO / "exercises").glob("00_*.ipynb")).read_text())
    kinds = [
        ("00_not_json", lambda p: p.write_text('{"cells": [ this is not json')),
        ("00_empty", lambda p: p.write_bytes(b"")),
        ("00_latin1", lambda p: p.write_bytes(json.dumps(ex).encode().replace(b"Sum", b"S\xfcm"))),
        ("00_source_int", lambda p: p.write_text(json.dumps(dict(ex, cells=[dict(ex["cells"][0], source=5)])))),
        ("00_metadata_list", lambda p: p.write_text(json.dumps(dict(ex, metadata=[])))),
        ("00_cells_dict", lambda p: p.write_text(json.dumps(dict(ex, cells={"a": 1})))),
        ("00_pipe", lambda p: os.mkfifo(p)),
        ("00_link", lambda p: p.symlink_to(next((REPO / "solutions").glob("00_*.ipynb")))),
    ]
    name, make = kinds[k % len(kinds)]
    sid = f"{name}_{k:03d}"
    make(folder / f"{sid}.ipynb")
    return sid


def _odd_names(folder: Path, n: int):
    """Blank exercises under names that used to break the batch: spaces, accents, a formula, a lone
    surrogate, a name as long as the file system allows."""
    names = ["00 bob", "00_bob", "00_café", '=HYPERLINK("x","y")', "-00_dash", "..."]
    raw = [b"00_\xff\xfe", b"00_" + "é".encode() * 120]
    nb = _nb("exercise", "00")
    out = []
    for k in range(n):
        if k < len(names):
            path = folder / f"{names[k]}.ipynb"
        else:
            path = Path(os.fsdecode(bytes(folder) + b"/" + raw[(k - len(names)) % len(raw)] + b"%d.ipynb" % k))
        nbformat.write(nb, path)
        out.append(path)
    return out


def _full_marks() -> dict:
    from course_lib.grading.registry import load_lesson

    full = {}
    for lesson in LESSONS:
        qs = load_lesson(lesson)
        full[lesson] = {q.qid: q.points for q in qs}
        full[lesson][None] = sum(q.points for q in qs)
    return full


def build_class(folder: Path, out: Path, n: int, sandboxed: bool) -> dict:
    """Write ``n`` submissions in ``folder``; return {submission id: expected score (None: any)}."""
    expected = {}
    n_broken = n // 10
    for k in range(n_broken):
        expected[_broken(folder, k)] = 0
    odd = _odd_names(folder, max(8, n // 30))
    hostile = _hostile(folder, out) if sandboxed else []
    for name, nb, score in hostile:
        nbformat.write(nb, folder / f"{name}.ipynb")
        expected[name] = score
    answers = itertools.cycle(_answers(_full_marks()))
    k = 0
    while len(expected) + len(odd) < n:
        name, nb, score = next(answers)
        sid = f"{name}_{k:03d}"
        nbformat.write(nb, folder / f"{sid}.ipynb")
        expected[sid] = score
        k += 1
    return {"expected": expected, "odd": len(odd), "hostile": len(hostile)}


def run(n: int = 300) -> None:
    from course_lib.grade import grade_paths
    from course_lib.grading.sandbox import sandbox_status

    usable, why = sandbox_status()
    print(f"sandbox: {'bubblewrap' if usable else 'none'} ({why}); {os.cpu_count()} cores; --jobs {JOBS}")
    with tempfile.TemporaryDirectory(prefix="bench_class_") as tmp:
        folder, out = Path(tmp) / "class", Path(tmp) / "grades"
        folder.mkdir()
        plan = build_class(folder, out, n, usable)
        t0 = time.perf_counter()
        rows = grade_paths([folder], out, jobs=JOBS, quiet=True, no_sandbox=not usable)
        wall = time.perf_counter() - t0
        with open(out / "scores.csv", newline="", encoding="utf-8") as f:
            table = list(csv.DictReader(f))
    statuses = collections.Counter(r["status"].split(":")[0] for r in rows)
    graded = [r["elapsed"] for r in rows if r["status"] == "ok"]
    wrong = [(r["submission"], r["score"], plan["expected"][r["submission"]]) for r in rows
             if r["submission"] in plan["expected"] and r["score"] != plan["expected"][r["submission"]]]
    print(f"{n} submissions ({plan['hostile']} hostile, {plan['odd']} with odd names): {len(rows)} rows, "
          f"{len(table)} in scores.csv: {'every row present' if len(rows) == len(table) == n else 'ROWS MISSING'}")
    print("rows per status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    print(f"wall {wall:.1f} s: {wall / n:.2f} s per submission with {JOBS} jobs; a graded notebook took "
          f"{sum(graded) / max(1, len(graded)):.2f} s on average, {max(graded, default=0):.1f} s at most")
    print(f"scores that differ from what their kind expects: {len(wrong)}"
          + "".join(f"\n   {sid}: {got:g}, expected {exp:g}" for sid, got, exp in wrong[:20]))
    assert len(rows) == len(table) == n, "a submission has no row"


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
