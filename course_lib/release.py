"""Build the student release of the course: ``python -m course_lib.release --out DIR`` (``make release``).

The release folder (and ``DIR.tar.gz`` next to it) holds what students get:

* ``notebooks/`` (the lessons) and ``exercises/`` (what they solve), without outputs;
* ``examples/``, the programs lesson 07 launches with mpiexec (they call the library only);
* ``course_lib/`` with the visible checks (``course_lib/questions``) and the grader, but with
  ``course_lib/reference`` replaced by *stand-ins*: each function a question asks for becomes a
  function of the same name and parameters that runs the student's own answer from the exercise
  notebook (:mod:`course_lib.standin`), or says which exercise to solve;
* ``pyproject.toml``, ``environment.yml``, a README and a Makefile for students.

It leaves out ``solutions/``, ``tests/`` (the hidden checks and the fixtures) and the benchmarks.
``tests/test_release.py`` checks that no answer gets through.

The grader builds its sandbox's library with :func:`build_library`, so graded code sees the
library students have.
"""
from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from .lessons import BY_NUMBER
from .lessons import graded as graded_lessons
from .reference import NOTEBOOKS, lesson_of, questions_of

PACKAGE = Path(__file__).resolve().parent          # course_lib/
ROOT = PACKAGE.parent                              # the checkout (or a release) it belongs to
MARKER = ".course-release"                         # marks a folder this module may overwrite

LESSONS = [lesson.number for lesson in graded_lessons()]


# -- stand-ins ---------------------------------------------------------------------------------

def reference_signatures(lesson: str, package: Path = PACKAGE) -> dict:
    """``{name: (parameter names, number with a default)}`` of a lesson's reference functions,
    read from ``course_lib/reference/exNN.py`` (the real one, or stand-ins: they agree)."""
    path = package / "reference" / f"ex{lesson}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    wanted = questions_of(lesson)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            a = node.args
            if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
                raise ValueError(f"{path}: {node.name} must take plain positional parameters only")
            out[node.name] = ([x.arg for x in a.args], len(a.defaults))
    missing = sorted(set(wanted) - set(out))
    if missing:
        raise ValueError(f"{path} has no reference for {', '.join(missing)}")
    return out


def standin_function(qid: str, name: str, params, n_defaults: int) -> str:
    """The source of the stand-in of ``name``: same parameters, defaults left to the student's own."""
    required = len(params) - n_defaults
    sig = ", ".join(p if i < required else f"{p}=_UNSET" for i, p in enumerate(params))
    args = ", ".join(params) + ("," if len(params) == 1 else "")
    nb = NOTEBOOKS[lesson_of(qid)]
    return (f"def {name}({sig}):\n"
            f'    """Question {qid}: runs your ``{name}``, from exercises/{nb}."""\n'
            f"    return _call({qid!r}, {name!r}, ({args}), {tuple(params)!r})\n")


def standin_module(lesson: str, package: Path = PACKAGE) -> str:
    """The source of ``course_lib/reference/exNN.py`` in the release."""
    sigs = reference_signatures(lesson, package)
    nb = NOTEBOOKS[lesson]
    head = (f'"""Lesson {lesson}: the functions its exercise questions ask for, as stand-ins.\n\n'
            "This release of the course leaves the answers out. Each function below runs *your* answer:\n"
            f"the function of the same name in exercises/{nb} (see course_lib/standin.py).\n"
            "The library calls these where a lesson needs them, so that part of the lesson runs on your\n"
            "code; until you have solved the question, they stop with a NotImplementedError that says\n"
            'which exercise to solve.\n"""\n'
            "from course_lib.standin import UNSET as _UNSET  # noqa: F401\n"
            "from course_lib.standin import call as _call\n\n"
            "STANDINS = True   # course_lib.replay.is_release() reads it\n")
    body = [standin_function(qid, name, *sigs[name]) for name, qid in questions_of(lesson).items()]
    return head + "\n\n" + "\n\n".join(body)


# -- the library ---------------------------------------------------------------------------------

def _ignore(directory, names):
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".egg-info")) or n.startswith(".")]


def build_library(dest, package: Path = PACKAGE) -> Path:
    """Write ``dest/course_lib``: the library as students get it (reference answers replaced by
    stand-ins). Returns that folder. The grader's sandbox imports it."""
    dest = Path(dest)
    target = dest / "course_lib"
    if target.exists():
        shutil.rmtree(target)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(package, target, ignore=_ignore)
    for lesson in LESSONS:
        (target / "reference" / f"ex{lesson}.py").write_text(standin_module(lesson, package), encoding="utf-8")
    return target


# -- recorded lessons ----------------------------------------------------------------------------

@dataclass
class RecordedLesson:
    """A lesson run once with every exercise solved: the notebook with its outputs, and per code
    cell the outputs and values that :mod:`course_lib.replay` shows where an answer is missing."""
    notebook: object        # nbformat NotebookNode, executed
    cells: dict             # course_lib.replay.merge_recording's table
    seconds: float = 0.0    # how long the lesson's cells took
    extra_outputs: list = field(default_factory=list, repr=False)   # of the cells run after it


def student_env(release: Path, exercises: Path, base: dict | None = None) -> dict:
    """The environment of a kernel that runs a lesson of ``release`` as a student does: the
    release's library first on the path, the exercise notebooks read from ``exercises``."""
    import os

    from .standin import ENV as EXERCISES_ENV

    env = dict(os.environ if base is None else base)
    env.update({"PYTHONPATH": str(release), EXERCISES_ENV: str(exercises)})
    return env


def record_lesson(release: Path, number: str, solutions: Path = ROOT / "solutions", timeout: float = 600,
                  env: dict | None = None, extra_cells: tuple = ()) -> RecordedLesson:
    """Execute lesson ``number`` of ``release`` headless, in its own folder, as a student who
    has solved every exercise runs it (the release's library, whose stand-ins run the answers of
    the notebooks in ``solutions``), and record what each cell showed and changed.

    The recording is made by the code students run: the release's library and the answers as
    the solution notebooks write them (the same source as ``course_lib/reference``), so what a
    release lesson replays is what that lesson computes once the exercises are solved.
    ``env`` is the kernel's base environment (default: this process's); ``extra_cells`` run after
    the lesson's own cells, in the same kernel, and only their outputs are kept (the tests read
    the kernel's state with them)."""
    import tempfile

    import nbformat

    from . import nbrun
    from .replay import RECORD_ENV, merge_recording

    path = Path(release) / "notebooks" / BY_NUMBER[number].notebook
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:           # a release notebook may hold an earlier recording's outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    own = len(nb.cells)
    nb.cells += [nbformat.v4.new_code_cell(source) for source in extra_cells]
    with tempfile.TemporaryDirectory(prefix="course_record_") as folder:
        # the kernel inherits RECORD_ENV; lesson_status() and `import course_lib` read it
        kernel_env = student_env(release, solutions, env)
        kernel_env[RECORD_ENV] = folder
        seconds = nbrun.execute(nb, path.parent, timeout=timeout, env=kernel_env)
        extra_outputs = [cell.outputs for cell in nb.cells[own:]]
        nb.cells = nb.cells[:own]
        return RecordedLesson(nb, merge_recording(nb, Path(folder)), seconds, extra_outputs)


def write_recordings(out: Path, recorded: dict) -> None:
    """Executed lesson notebooks into ``out/notebooks`` and their recordings into the library."""
    import pickle

    import nbformat

    folder = out / "course_lib" / "recorded"
    folder.mkdir(parents=True, exist_ok=True)
    for number, rec in sorted(recorded.items()):
        (folder / f"{number}.pkl").write_bytes(pickle.dumps(rec.cells))
        nbformat.write(rec.notebook, out / "notebooks" / BY_NUMBER[number].notebook)


# -- the release folder ----------------------------------------------------------------------------

def _copy_notebooks(src: Path, dst: Path) -> list:
    """Copy the notebooks of a folder, outputs and execution counts cleared."""
    dst.mkdir(parents=True, exist_ok=True)
    done = []
    for nb_path in sorted(src.glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if cell.get("cell_type") == "code":
                cell["outputs"] = []
                cell["execution_count"] = None
        (dst / nb_path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        done.append(nb_path.name)
    return done


STUDENT_MAKEFILE = """\
# Distributed machine learning, taught with real processes: the student release.
#   make lab      set up (a virtual environment in .venv) and open the course in JupyterLab
#   make test     run the visible checks of every exercise (same as: make check)
#   make grade NB=exercises/00_cluster_in_your_laptop.ipynb   one notebook, as the grader runs it
#   make clean-shm   remove shared memory left behind by a killed kernel
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: lab test check grade clean-shm setup

$(STAMP): pyproject.toml
\t$(PYTHON) -m venv $(VENV)
\t$(BIN)/python -m pip install --quiet --upgrade pip
\t$(BIN)/python -m pip install --quiet -e .
\t$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
\ttouch $(STAMP)

setup: $(STAMP)

# The optional MPI backend (mpi4py + MPICH) for lesson 07's MPI cells; they skip, saying why, without it.
MPI_STAMP := $(VENV)/.installed-mpi
$(MPI_STAMP): $(STAMP)
\t@if $(BIN)/python -m pip install --quiet -e ".[mpi]"; then touch $(MPI_STAMP); else \\
\t\techo "warning: the mpi extra (mpi4py, mpich) could not be installed: lesson 07's MPI cells" \\
\t\t     "will skip, saying why; make lab tries again"; fi

# JupyterLab at the course's root (notebooks/ and exercises/ both reachable), opening on START_HERE.ipynb.
lab: $(STAMP) $(MPI_STAMP)
\t$(BIN)/python -m course_lib.lab

NB ?= exercises
OUT ?= grades
# Your own work on your own machine: the visible checks (the hidden ones stay with your instructor),
# and no sandbox, which guards an instructor's machine from a class's code, not you from yours.
GRADE := $(BIN)/python -m course_lib.grade --visible-only --no-sandbox
test check: $(STAMP)
\t$(GRADE) exercises --out $(OUT)

grade: $(STAMP)
\t$(GRADE) $(NB) --out $(OUT)

clean-shm: $(STAMP)
\t$(BIN)/python -m course_lib.runtime.shm --sweep
"""

STUDENT_README = """\
# Distributed machine learning, taught with real processes

An open course in Jupyter notebooks. Every distributed algorithm in it runs on **real worker
processes on your own machine**, started by the small library `course_lib`, talking through
`multiprocessing` Pipes (message passing) and `multiprocessing.shared_memory` (shared memory).
Every run is observable: bytes and messages per link, a timeline of compute / send / wait per
worker, the loss curve.

## Two commands

```bash
make lab     # set up (a virtual environment in .venv) and open the course in JupyterLab
make test    # run the visible checks of every exercise (make check is the same)
```

You need Python 3.10 or newer and `make`. With conda instead:

```bash
conda env create -f environment.yml
conda activate dml-course
pip install -e . --no-deps
python -m course_lib.lab      # JupyterLab at this folder, opening on START_HERE.ipynb
```

## What is here

- `START_HERE.ipynb`: each lesson with its exercise; `make lab` opens it.
- `notebooks/`: the lessons, `00_...` to `08_...`, shipped with the outputs of a run on the
  course's machine, so you can read one before running it. Run each one top to bottom on yours.
- `exercises/`: one exercise notebook per lesson. Replace each
  `raise NotImplementedError("ex00_1: ...")` with your code, then run the question's check cell:

  ```python
  from course_lib import check
  check("ex00_1")      # runs the visible checks on your current code, in real worker processes
  ```

  It prints a pass or a fail with a hint. The grader also runs hidden checks on other inputs:
  write general code, not code that fits the visible example. `make grade NB=exercises/04_gossip.ipynb`
  grades one notebook the way your instructor will (visible checks only, here).
- `course_lib/`: the library. `course_lib/questions/` holds the visible checks; read them for hints.

## Lessons that run on your answers

This release of the course leaves out the reference answers of the exercises. Where a lesson
needs one (the gossip lesson builds Metropolis-Hastings weights, the parameter server looks keys
up on its hash ring, the tensor-parallel network runs its layers, ...), the library runs **your**
function of the same name from the exercise notebook, `exercises/NN_name.ipynb`. Until you have
written it, the lesson still runs top to bottom: such a cell shows the result recorded when the
course was built with the reference answers, under a first line that says so and names the
exercise:

    recorded result (this cell needs exercise ex04_1 (metropolis_weights in exercises/04_gossip.ipynb),
    not solved yet): below is what this cell showed when the course was built with the reference
    answers; solve ex04_1 and run this cell again to see it on your code.

Each lesson's first cells list the exercises it runs on and which of them you have written.
Save the exercise notebook after editing it: the library reads the saved file (again each time it
changes). If your exercise notebooks live elsewhere, set `COURSE_EXERCISES` to their folder before
starting JupyterLab.

## Troubleshooting

- **Start methods.** Everything works under `fork`, `spawn` (macOS, Windows) and `forkserver`. Set
  `COURSE_START_METHOD=spawn` to see what a Mac or Windows user sees.
- **Leftover shared memory** after a killed kernel: `make clean-shm`.
- **A run seems stuck**: every run has a timeout (`Cluster(..., timeout=120)`) and then names the
  ranks still running; a worker that raises gives a `WorkerError` with its traceback.
- **macOS**: if you see `Too many open files`, run `ulimit -n 4096` before `make lab`.
- **Windows**: use conda (above) or WSL.
"""


def build(out="release", root: Path = ROOT, archive: bool = True, record: bool = False,
          recorded: dict | None = None) -> Path:
    """Build the student release in ``out`` (and ``out.tar.gz`` next to it); returns ``out``.

    ``out`` must not exist, be empty, or hold an earlier release (which is replaced). With
    ``record``, every lesson is then run in the release with the solutions' answers (:func:`record_lesson`);
    ``recorded`` gives such runs instead (``{lesson number: RecordedLesson}``). Recorded lessons
    ship executed, with their figures, and teach before their exercises are solved
    (:mod:`course_lib.replay`); without a recording a cell that needs a missing answer stops."""
    root = Path(root).resolve()
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise FileExistsError(f"{out} exists and is not a course release: give another --out")
    sources = [root] + [root / d for d in ("course_lib", "notebooks", "exercises", "solutions", "tests")]
    if any(out == s or s in out.parents for s in sources[1:]) or out == root:
        raise ValueError(f"refusing to build the release into {out}, a folder of the course itself")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _copy_notebooks(root / "notebooks", out / "notebooks")
    _copy_notebooks(root / "exercises", out / "exercises")
    build_library(out, root / "course_lib")
    shutil.copytree(root / "examples", out / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "environment.yml", "START_HERE.ipynb"):
        shutil.copy2(root / name, out / name)
    (out / "README.md").write_text(STUDENT_README, encoding="utf-8")
    (out / "Makefile").write_text(STUDENT_MAKEFILE, encoding="utf-8")
    (out / ".gitignore").write_text(".venv/\n__pycache__/\n*.egg-info/\n.ipynb_checkpoints/\ngrades/\n",
                                    encoding="utf-8")
    (out / MARKER).write_text("A student release of the course, built by python -m course_lib.release.\n",
                              encoding="utf-8")
    if record and recorded is None:   # the release is whole now: its lessons run as students run them
        recorded = {number: record_lesson(out, number, root / "solutions") for number in BY_NUMBER}
    write_recordings(out, recorded or {})
    if archive:
        tar = out.parent / f"{out.name}.tar.gz"
        with tarfile.open(tar, "w:gz") as t:
            t.add(out, arcname=out.name)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_lib.release", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="release", help="the release folder to write (default: release/)")
    ap.add_argument("--no-archive", action="store_true", help="do not write OUT.tar.gz")
    ap.add_argument("--no-record", action="store_true",
                    help="do not run the lessons first: they ship without outputs, and a cell that needs an "
                         "unsolved exercise stops instead of showing its recorded result")
    args = ap.parse_args(argv)
    out = build(args.out, archive=not args.no_archive, record=not args.no_record)
    print(f"student release in {out}" + ("" if args.no_archive else f" and {out.parent / (out.name + '.tar.gz')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
