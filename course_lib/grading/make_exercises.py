"""Write ``solutions/`` from ``course_lib/reference/``, then ``exercises/`` from ``solutions/``.

Usage::

    python -m course_lib.grading.make_exercises            # (make exercises) every graded lesson
    python -m course_lib.grading.make_exercises --check    # exit 1 if a solution or exercise is stale

An answer is written in one place only: its function in ``course_lib/reference/exNN.py`` (the
function the library runs, and the name :data:`course_lib.reference.QUESTIONS` gives the question).
Never edit a solution region by hand; the next run rewrites it, and tests/test_one_source.py fails
until it has.

1. Solutions. In ``solutions/NN_name.ipynb`` each region ``# BEGIN SOLUTION exNN_k`` ... ``# END
   SOLUTION`` sits in the body of a top-level ``def`` of the question's function. That ``def``, from
   its first line to the END line, becomes the reference function's source: its ``def`` line and
   docstring (what the exercise shows, so the docstring states the task, not the method), then its
   body between the markers (the answer, with comments that say why). The rest of the notebook is
   kept. Every global name the function reads must be bound in that cell or an earlier one (the
   notebook's imports), or be imported inside the function; helpers are nested inside it. An
   import inside the function that binds what the notebook's imports already bound (a reference
   imports there what its library's import order keeps from the module's top) is left out of
   the region, with the comment just above it.
2. Exercises. Each region becomes a stub raising ``NotImplementedError("exNN_k: <title>")``; cells
   tagged ``solution-only`` are dropped; outputs and execution counts are cleared;
   ``metadata.course`` records the lesson and its question ids (the grader reads it).

Adding a question: its id in the lesson's manifest entry (:mod:`course_lib.lessons`); its function
in ``course_lib/reference/exNN.py`` and its name in :data:`course_lib.reference.QUESTIONS`; its
visible checks (``@question`` in ``course_lib/questions/exNN.py``) and hidden ones
(``@hidden_check`` in ``tests/hidden/exNN.py``); its fixtures (``tests/fixtures/wrong_answers/`` and
``correct_alternatives/``); in the solution notebook, the statement and a cell with the ``def`` and
an empty region (``# BEGIN SOLUTION exNN_k`` / ``# END SOLUTION``); then ``make exercises``.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import importlib
import inspect
import symtable
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Set, Tuple

import nbformat

from ..lessons import graded as graded_lessons
from ..reference import module_name, questions_of
from .regions import (
    BEGIN_RE,
    RegionError,
    function_with_region,
    lesson_of_path,
    replace_regions,
    stub,
    write_region_functions,
)
from .registry import REPO_ROOT, load_lesson

SOLUTION_ONLY_TAG = "solution-only"


# -- solutions from the references -----------------------------------------------------------
def reference_sources(lesson: str) -> Dict[str, Tuple[str, str]]:
    """{question id: (function name, the source of its reference function)} of one lesson."""
    module = importlib.import_module(module_name(lesson))
    return {qid: (name, textwrap.dedent(inspect.getsource(getattr(module, name))))
            for name, qid in questions_of(lesson).items()}


def _imports(node) -> List[Tuple[str, object]]:
    """(name bound, object) of each name an import statement binds; object None if it cannot be resolved."""
    out = []
    for alias in node.names:
        try:
            if isinstance(node, ast.ImportFrom):
                obj = None if node.level else getattr(importlib.import_module(node.module), alias.name)
            else:
                obj = importlib.import_module(alias.name if alias.asname else alias.name.split(".")[0])
        except (ImportError, AttributeError):
            obj = None
        out.append((alias.asname or alias.name.split(".")[0], obj))
    return out


def _python_of(cell_source: str) -> str:
    """A code cell's text with its IPython magics and shell lines (``%...``, ``!...``) blanked."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines())


def imported_objects(source: str) -> Dict[str, object]:
    """{name: object} that a cell's top-level imports bind."""
    return {name: obj for node in ast.parse(_python_of(source)).body if isinstance(node, (ast.Import, ast.ImportFrom))
            for name, obj in _imports(node) if obj is not None}


def without_imports_made(function_source: str, imported: Dict[str, object]) -> str:
    """``function_source`` less the imports in its body that bind names to the objects the notebook's
    imports already bound them to (a reference imports inside a function what its library's import
    order keeps from its module's top), with the comment lines just above them and the blank lines after."""
    lines = function_source.splitlines()
    drop: Set[int] = set()
    for node in ast.parse(function_source).body[0].body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and all(
                obj is not None and imported.get(name, None) is obj for name, obj in _imports(node)):
            first, last = node.lineno - 1, node.end_lineno
            while first > 0 and lines[first - 1].lstrip().startswith("#"):
                first -= 1
            while last < len(lines) and not lines[last].strip():
                last += 1
            drop.update(range(first, last))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def names_bound(source: str) -> Set[str]:
    """Names a cell binds at its top level (imports, assignments, ``def``, ``class``, loop targets)."""
    table = symtable.symtable(_python_of(source), "<cell>", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def names_needed(function_text: str) -> Set[str]:
    """Global names a function's text reads (its defaults, and its body's and nested functions'), builtins aside."""
    table = symtable.symtable(function_text, "<answer>", "exec")
    needed = {s.get_name() for s in table.get_symbols() if s.is_referenced()}

    def read_in(tab):
        for child in tab.get_children():
            if child.get_type() == "function":
                needed.update(child.get_globals())
            read_in(child)

    read_in(table)
    return needed - set(dir(builtins))


def write_answers(nb, lesson: str, source_name: str = ""):
    """A copy of solution notebook ``nb`` whose answer functions are the references of ``lesson``.

    Each region, with the ``def`` around it, becomes the reference function's text, less the
    imports the notebook has already made (:func:`without_imports_made`), its body marked as the
    region; the rest of the notebook is kept. A name the function reads must be bound by this
    cell or an earlier one (an import, a constant), else RegionError."""
    sources = reference_sources(lesson)
    nb = copy.deepcopy(nb)
    bound: Set[str] = set()
    imported: Dict[str, object] = {}
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        where = f"{source_name} cell {k}"
        imported.update(imported_objects(cell.source))
        if not any(BEGIN_RE.match(line) for line in cell.source.splitlines()):
            bound |= names_bound(cell.source)
            continue
        answers = {qid: (name, function_with_region(without_imports_made(source, imported), qid))
                   for qid, (name, source) in sources.items()}
        cell.source, qids = write_region_functions(cell.source, answers, where)
        bound |= names_bound(cell.source)
        for qid in qids:
            missing = sorted(names_needed(answers[qid][1]) - bound)
            if missing:
                raise RegionError(f"{where}: the reference of {qid} reads {', '.join(missing)}, which neither this "
                                  "cell nor an earlier one defines: import it in the notebook or inside the function")
    return nb


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


def _solution_notebooks(solutions_dir: Path):
    """(lesson number, path) of every graded lesson of the manifest whose solution is in ``solutions_dir``
    (tests/test_lessons.py checks that the course has them all)."""
    for lesson in graded_lessons():
        path = Path(solutions_dir) / lesson.notebook
        if path.is_file():
            yield lesson_of_path(path), path


def expected_solutions(solutions_dir: Path) -> Dict[Path, str]:
    """{solution path: its text with every answer written from course_lib/reference}."""
    return {path: render(write_answers(nbformat.read(path, as_version=4), lesson, path.name))
            for lesson, path in _solution_notebooks(solutions_dir)}


def expected_exercises(solutions_dir: Path, exercises_dir: Path, solutions: Dict[Path, str] | None = None
                       ) -> Dict[Path, str]:
    """{exercise path: expected file text}, from the solution notebooks as they are in ``solutions_dir``,
    or as ``solutions`` ({path: text}, e.g. :func:`expected_solutions`) gives them."""
    out = {}
    for lesson, path in _solution_notebooks(solutions_dir):
        text = solutions[path] if solutions is not None else path.read_text(encoding="utf-8")
        ex, _ = build_exercise(nbformat.reads(text, as_version=4), lesson, path.name)
        out[Path(exercises_dir) / path.name] = render(ex)
    return out


def _differ(expected: Dict[Path, str]) -> List[Path]:
    return [path for path, text in expected.items()
            if not path.exists() or path.read_text(encoding="utf-8") != text]


def stale(solutions_dir: Path, exercises_dir: Path) -> List[Path]:
    """Exercise notebooks that are missing or differ from what the solutions generate."""
    return _differ(expected_exercises(solutions_dir, exercises_dir))


def stale_solutions(solutions_dir: Path) -> List[Path]:
    """Solution notebooks whose answers differ from the reference functions' text."""
    return _differ(expected_solutions(solutions_dir))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grading.make_exercises", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--solutions", type=Path, default=REPO_ROOT / "solutions")
    p.add_argument("--exercises", type=Path, default=REPO_ROOT / "exercises")
    p.add_argument("--check", action="store_true",
                   help="only report stale solution and exercise notebooks (exit 1 if any)")
    a = p.parse_args(argv)
    try:
        solutions = expected_solutions(a.solutions)
        expected = {**solutions, **expected_exercises(a.solutions, a.exercises, solutions)}
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
