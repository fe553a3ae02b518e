"""Each lesson notebook executed headless on a quiet machine, against the course's promise.

The promise (developers' guide): every notebook executes headless in under 60 s on 2 cores. The
tests run the notebooks while other tests share the cores and allow 1.5x; the number here is
the one to hold to. ``python -m benchmarks.bench_notebooks``.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 60.0


def run() -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from course_lib import lessons

    from common import execute_notebook

    print(f"{'notebook':<44} {'seconds':>8}  budget {BUDGET_S:g} s")
    for lesson in lessons.LESSONS:
        ran = execute_notebook(REPO / "notebooks" / lesson.notebook)
        verdict = "ok" if ran.seconds < BUDGET_S and not ran.errors else "OVER" if not ran.errors else "ERROR"
        print(f"{lesson.notebook:<44} {ran.seconds:8.1f}  {verdict}", flush=True)


if __name__ == "__main__":
    run()
