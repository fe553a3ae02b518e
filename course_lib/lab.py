"""Open the course in JupyterLab: ``python -m course_lib.lab`` (what ``make lab`` runs).

JupyterLab serves one folder and nothing above it, so it is started at the course's root
(the checkout, or the student release): ``notebooks/`` and ``exercises/`` are both reachable,
and it opens on ``START_HERE.ipynb``, which lists each lesson with its exercise
(:func:`course_lib.lessons.start_page`). Extra arguments go to ``jupyter lab``
(``python -m course_lib.lab --no-browser --port 8890``).

Lesson 07 runs the course's programs under MPI as well. ``make lab`` installs the MPI extra
(mpi4py and MPICH from the package index) before it starts JupyterLab; where that install
failed (no network, no wheel for the platform), :func:`main` says so before JupyterLab starts,
and lesson 07's MPI cells print the same message (:func:`mpi_missing_message`) and skip.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent      # the folder that holds course_lib/
START_PAGE = "START_HERE.ipynb"


MPI_INSTALL = ".venv/bin/python -m pip install -e '.[mpi]'"


def mpi_missing_message() -> str:
    """What a student reads where MPI is missing: what skips, and how to install the extra."""
    return ("The MPI extra (mpi4py and MPICH) is not installed in this environment, so lesson 07's MPI "
            "cells will skip. `make lab` installs it when the package index can be reached; to try again, "
            f"run `make lab` again (it retries) or `{MPI_INSTALL}` in the course's folder, "
            "then restart the notebook's kernel.")


def mpi_status() -> str:
    """One line on whether lesson 07 can run its MPI cells: ``mpiexec`` found, or why not."""
    from course_lib.runtime.mpi_backend import mpiexec_path

    found = mpiexec_path()
    if found is None:
        return "warning: " + mpi_missing_message()
    return f"MPI: {found} (lesson 07's MPI cells will run)"


def command(root: Path = ROOT, extra: list[str] | None = None) -> list[str]:
    """The ``jupyter lab`` command line that serves ``root`` and opens its start page."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
           f"--LabApp.default_url=/lab/tree/{START_PAGE}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")   # a container's root user: JupyterLab refuses it otherwise
    return cmd + list(extra or [])


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    print(mpi_status(), file=sys.stderr, flush=True)      # before JupyterLab's own log fills the terminal
    cmd = command(ROOT, args)
    os.chdir(ROOT)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
