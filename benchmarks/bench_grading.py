"""Grading speed: each solution notebook alone, and a folder of submissions on every core.

Targets (issue: grading an instructor can trust): a correct notebook grades in at most 15 s on
a 2-core machine; a folder of 40 submissions graded with one job per core takes about
1/cores of the time of one job (printed as the parallel speedup against the core count).
``python -m benchmarks.bench_grading [N]`` (N submissions, default 40).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_ONE = 15.0


def _grade(paths, out, jobs):
    from course_lib.grade import grade_paths
    from course_lib.grading.sandbox import sandbox_status

    t0 = time.perf_counter()
    # where bubblewrap cannot run the grader refuses unless told: the benchmark then says so above
    rows = grade_paths(paths, out, jobs=jobs, quiet=True, no_sandbox=not sandbox_status()[0])
    return time.perf_counter() - t0, rows


def run(n_submissions: int = 40) -> None:
    from course_lib.grading.sandbox import sandbox_status

    usable, why = sandbox_status()
    print(f"sandbox: {'bubblewrap' if usable else 'none'} ({why})")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"{'solution notebook':<44} {'seconds':>8} {'score':>8}")
        worst = 0.0
        for nb in sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb")):
            seconds, (row,) = _grade([nb], tmp / nb.stem, jobs=1)
            worst = max(worst, row["elapsed"])
            print(f"{nb.name:<44} {row['elapsed']:8.1f} {row['score']:>4g}/{row['max_score']:<3g}")
        print(f"slowest correct notebook: {worst:.1f} s (target <= {TARGET_ONE:g} s): "
              f"{'ok' if worst <= TARGET_ONE else 'OVER'}")

        folder = tmp / "submissions"
        folder.mkdir()
        source = REPO / "solutions" / "00_cluster_in_your_laptop.ipynb"
        for k in range(n_submissions):
            shutil.copy(source, folder / f"00_student{k:02d}.ipynb")
        serial, _ = _grade([folder], tmp / "serial", jobs=1)
        parallel, rows = _grade([folder], tmp / "parallel", jobs=cores)
        assert all(r["score"] == r["max_score"] for r in rows)
        speedup = serial / parallel
        print(f"{n_submissions} submissions: {serial:.1f} s with 1 job, {parallel:.1f} s with {cores} jobs: "
              f"speedup {speedup:.2f} on {cores} cores ({speedup / cores:.2f} of the cores)")


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
