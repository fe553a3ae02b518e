"""What several test files share: the checkout's folders, the MPI skip mark, fixture headers,
and each lesson notebook executed once per test process (``executed_notebook``)."""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import pickle
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from course_lib import claims, nbrun
from course_lib.replay import RECORD_ENV, changed_names, merge_recording, python_only
from course_lib.runtime.mpi_backend import mpiexec_path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS, SOLUTIONS, EXERCISES = REPO / "notebooks", REPO / "solutions", REPO / "exercises"
FIXTURES = REPO / "tests" / "fixtures"

HAVE_MPI = mpiexec_path() is not None and importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py or mpiexec is not installed (pip install '.[mpi]')")

# `make test LESSON=04` (COURSE_TEST_LESSONS=04; a list like 00,01 works too): the files that build
# their work per lesson (the grader's batch, the questions graded alone, the checks) build only these.
TEST_LESSONS = [s.strip() for s in os.environ.get("COURSE_TEST_LESSONS", "").split(",") if s.strip()]

NOTEBOOK_BUDGET_S = 60   # the course's promise: each notebook executes headless within this on 2 cores
# The tests run the notebooks while other tests load the same cores, so they allow 1.5x, and more
# when the run itself measured a heavier load (see loaded_budget); the promise itself is measured
# on a quiet machine by `make bench` (benchmarks/bench_notebooks.py).
LOADED_BUDGET_S = 1.5 * NOTEBOOK_BUDGET_S


def loaded_budget(load: float) -> float:
    """The time a notebook may take while the machine's load average is ``load``: each runnable
    process gets about cores / load of a core, so a run that needs the budget alone takes
    load / cores times as long (and at least the 1.5x allowance)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return NOTEBOOK_BUDGET_S * max(1.5, load / cores)
NOTEBOOK_TIMEOUT_S = 240  # a hard stop per cell, well beyond the budget, for loaded CI machines


def fixture_header(path: Path) -> dict[str, list[str]]:
    """The ``# key: value`` lines of an answer fixture (base, action, expect, expect-note,
    expect-message), each key with its values in order."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#\s*(base|action|expect|expect-note|expect-message):\s*(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2).strip())
    return out


def expected_points(path: Path) -> dict[str, float]:
    """A fixture's ``# expect: ex00_1=0 ex00_2=2`` lines as {question id: points}."""
    pairs = " ".join(fixture_header(path).get("expect", [])).split()
    return {qid: float(points) for qid, _, points in (kv.partition("=") for kv in pairs)}


# -- a notebook, executed as a student runs it ------------------------------------------------
# The last cell pickles the notebook's top-level values (what pickles, under 50 MB each) so a
# test can check each sentence of the text on the numbers the run itself produced.
_DUMP_CELL = """
import pickle as _pickle, types as _types
_values = {}
for _name, _value in list(globals().items()):
    if _name.startswith("_") or _name in ("In", "Out", "exit", "quit", "get_ipython"):
        continue
    if isinstance(_value, (_types.ModuleType, _types.FunctionType, type)):
        continue
    try:
        _blob = _pickle.dumps(_value)
        _pickle.loads(_blob)  # some objects pickle but cannot be rebuilt
    except Exception:
        continue
    if len(_blob) < 50_000_000:
        _values[_name] = _value
with open(__DUMP_PATH__, "wb") as _f:
    _pickle.dump(_values, _f)
"""


def _printed_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if claims.MIME in output.get("data", {}):
        return output["data"]["text/plain"] + "\n"
    return ""


@dataclass
class ExecutedNotebook:
    path: Path
    notebook: nbformat.NotebookNode   # with its outputs
    seconds: float                    # wall time of the notebook's own cells
    load: float                       # the machine's 1-minute load average during the run (the larger end)
    values: dict = field(repr=False)  # its top-level values after the last cell
    # per code cell, the outputs and values it changed (course_lib.replay), what the release replays
    recording: dict = field(default_factory=dict, repr=False)
    student: "StudentReport | None" = None   # for a run in a student release (execute_as_student)

    @property
    def markdown(self) -> str:
        return "\n".join(c.source for c in self.notebook.cells if c.cell_type == "markdown")

    @property
    def printed(self) -> str:
        """Everything its code cells printed (stream outputs) and the sentences they stated through
        course_lib.claims (one line each), in order."""
        return "".join(_printed_text(o) for c in self.notebook.cells if c.cell_type == "code"
                       for o in c.outputs)

    def slowest_cells(self, k: int = 3) -> str:
        """Where the time went, for a budget failure: the kernel's start and the k slowest cells
        (nbclient stamps each cell's start and end in its metadata)."""
        spans = []
        for i, c in enumerate(self.notebook.cells):
            stamps = c.get("metadata", {}).get("execution", {})
            if "iopub.execute_input" in stamps and "shell.execute_reply" in stamps:
                start, end = (datetime.fromisoformat(stamps[key].replace("Z", "+00:00"))
                              for key in ("iopub.execute_input", "shell.execute_reply"))
                first = next((line for line in c.source.splitlines() if line.strip()), "")
                spans.append((start, end, i, first[:60]))
        if not spans:
            return "no cell timings recorded"
        cells = sorted(spans, key=lambda sp: sp[0] - sp[1])[:k]     # longest first
        cell_total = sum((end - start).total_seconds() for start, end, _, _ in spans)
        parts = [f"cell {i}: {(end - start).total_seconds():.1f} s ({line!r})" for start, end, i, line in cells]
        return (f"cells took {cell_total:.1f} s of {self.seconds:.1f} s (the rest: starting the kernel, "
                f"between cells); slowest: " + "; ".join(parts))

    @property
    def errors(self) -> list[str]:
        return [f"{o.ename}: {o.evalue}" for c in self.notebook.cells if c.cell_type == "code"
                for o in c.outputs if o.output_type == "error"]


def _incoming_and_bound(source: str) -> tuple[set, set]:
    """(the names a cell reads from the namespace, the names it binds or changes there). A name
    the cell itself assigns (or a function of it takes as a parameter) is not read from the
    namespace; a function defined in the cell reads what its body loads."""
    try:
        tree = ast.parse(python_only(source))
    except SyntaxError:
        return set(), set()
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    assigned |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return loads - assigned, changed_names(source) | defined


def cells_reached(nb, starts) -> list[int]:
    """The code cells whose results can depend on the cells ``starts(index, cell)`` picks, in order:
    those, then every later cell that reads a name one of the reached cells bound or changed. A
    test that varies only what the start cells see need not run the notebook past the last of them."""
    reached, tainted = [], set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        reads, binds = _incoming_and_bound(cell.source)
        if starts(i, cell) or reads & tainted:
            reached.append(i)
            tainted |= binds
    return reached


def line(ran, start: str) -> str:
    """The one line the notebook ``ran`` printed that starts with ``start`` (a claim test reads
    its numbers from there; two such lines would make the claim ambiguous)."""
    found = [x for x in ran.printed.splitlines() if x.startswith(start)]
    assert len(found) == 1, (start, found)
    return found[0]


# In a release run, a cell before the dump reports what the kernel saw: which course_lib it
# imported, which cells it replayed, and the state of each exercise the lesson runs on.
_STUDENT_REPORT_CELL = """
import json as _json, course_lib as _cl, course_lib.replay as _replay
print("STUDENT-REPORT " + _json.dumps({"course_lib": _cl.__file__, "replayed": _replay.replayed_cells(),
                                       "status": _replay.exercise_status(__LESSON__)}))
"""
REPORT_PREFIX = "STUDENT-REPORT "


@dataclass
class StudentReport:
    """What a lesson's kernel saw in a release: the library it imported, the cells it replayed
    (cell key, question id or None), each exercise's state, and the answers the stand-ins ran."""
    library: str
    replayed: list
    status: dict
    answers_used: set


def _run(nb, cwd: Path, env: dict):
    """Execute ``nb`` with the value dump appended (and, as the release's recording run does,
    RECORD_ENV set); returns (seconds, load, values, recording). ``nb`` keeps its own cells,
    with their outputs."""
    n_cells = len(nb.cells)
    with _dumped_values() as (dump_cell, read_values), \
            tempfile.TemporaryDirectory(prefix="course_record_") as record:
        nb.cells.append(nbformat.v4.new_code_cell(dump_cell))
        load_before = os.getloadavg()[0]
        seconds = nbrun.execute(nb, cwd, timeout=NOTEBOOK_TIMEOUT_S, env=dict(env, **{RECORD_ENV: record}))
        load = max(load_before, os.getloadavg()[0])
        values = read_values()
        nb.cells = nb.cells[:n_cells]
        recording = merge_recording(nb, Path(record))
    return seconds, load, values, recording


@contextlib.contextmanager
def _dumped_values():
    """(the source of a last cell that pickles the notebook's top-level values into a temporary
    file, a function that reads them back)."""
    fd, dump = tempfile.mkstemp(suffix=".pkl", prefix="notebook_values_")
    os.close(fd)

    def read():
        with open(dump, "rb") as f:
            return pickle.load(f)
    try:
        yield _DUMP_CELL.replace("__DUMP_PATH__", repr(dump)), read
    finally:
        os.unlink(dump)


def _start_method_env(start_method: str, env: dict) -> dict:
    if start_method != "default":
        env["COURSE_START_METHOD"] = start_method  # read by course_lib in the kernel
    return env


def execute_notebook(path: Path, start_method: str = "default", cells: int | None = None) -> ExecutedNotebook:
    """Execute ``path`` headless (nbclient, in its own folder) with this checkout's library, under
    ``start_method`` ("default" keeps the platform's), only its first ``cells`` cells if given;
    time its cells; read its values back."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = nb.cells[:cells]
    env = _start_method_env(start_method, dict(os.environ))
    seconds, load, values, recording = _run(nb, path.parent, env)
    return ExecutedNotebook(path, nb, seconds, load, values, recording)


def execute_as_student(release: Path, lesson, exercises: Path, start_method: str = "default") -> ExecutedNotebook:
    """Execute lesson ``lesson`` of the student release ``release`` headless, as a student runs it:
    in its own folder, with the release's library, whose stand-ins run the answers of the exercise
    notebooks in ``exercises``. It is ``make release``'s own recording run
    (course_lib.release.record_lesson), with two cells appended that report what the kernel saw
    (``.student``) and dump its values. The load average is read around it."""
    from course_lib.release import record_lesson
    from course_lib.standin import LOG_ENV

    report_cell = _STUDENT_REPORT_CELL.replace("__LESSON__", repr(lesson.number))
    with _dumped_values() as (dump_cell, read_values), \
            tempfile.TemporaryDirectory(prefix="course_answers_used_") as folder:
        log = Path(folder) / "used.log"
        env = _start_method_env(start_method, {**os.environ, LOG_ENV: str(log)})
        load_before = os.getloadavg()[0]
        rec = record_lesson(release, lesson.number, exercises, timeout=NOTEBOOK_TIMEOUT_S, env=env,
                            extra_cells=(report_cell, dump_cell))
        load = max(load_before, os.getloadavg()[0])
        values = read_values()
        used = set(log.read_text().split()) if log.exists() else set()
    report = next(json.loads(text[len(REPORT_PREFIX):]) for o in rec.extra_outputs[0]
                  for text in o.get("text", "").splitlines() if text.startswith(REPORT_PREFIX))
    assert report["course_lib"].startswith(str(release)), f"the lesson imported {report['course_lib']}"
    ran = ExecutedNotebook(Path(release) / "notebooks" / lesson.notebook, rec.notebook, rec.seconds, load,
                           values, rec.cells)
    ran.student = StudentReport(report["course_lib"], [tuple(r) for r in report["replayed"]], report["status"],
                                used)
    return ran


_environment = nbrun.environment   # tests that start a kernel under another environment
