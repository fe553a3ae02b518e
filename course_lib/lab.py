"""Open the course in JupyterLab: ``python -m course_lib.lab`` (what ``make lab`` runs).

JupyterLab serves one folder and nothing above it, so it is started at the course's root
(the checkout, or the student release): ``notebooks/`` and ``exercises/`` are both reachable,
and it opens on ``START_HERE.ipynb``, which lists each lesson with its exercise
(:func:`course_lib.lessons.start_page`). Extra arguments go to ``jupyter lab``
(``python -m course_lib.lab --no-browser --port 8890``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent      # the folder that holds course_lib/
START_PAGE = "START_HERE.ipynb"


def command(root: Path = ROOT, extra: list[str] | None = None) -> list[str]:
    """The ``jupyter lab`` command line that serves ``root`` and opens its start page."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
           f"--LabApp.default_url=/lab/tree/{START_PAGE}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")   # a container's root user: JupyterLab refuses it otherwise
    return cmd + list(extra or [])


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    cmd = command(ROOT, args)
    os.chdir(ROOT)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
