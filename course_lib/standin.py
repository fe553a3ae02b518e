"""Run a student's own answer where the student release of the course leaves the reference out.

In the release (``make release``, :mod:`course_lib.release`) every module
``course_lib/reference/exNN.py`` holds *stand-ins*: functions with the names and parameters of
the functions the exercise questions ask for, whose body is one call to :func:`call`. It finds
the lesson's exercise notebook, ``exercises/NN_name.ipynb`` next to the release's ``course_lib``
folder (or in the folder ``$COURSE_EXERCISES`` names), takes from it

* the top-level ``def`` of that name,
* the notebook's top-level import statements,
* the top-level functions, classes and constant assignments that def uses (transitively),

executes them in a fresh module (again whenever the notebook file changes on disk) and calls
the function. So a part of a lesson that needs, say, the Metropolis-Hastings weights runs on the
weights the student wrote. A question not solved yet (no notebook, no such function, or the
exercise's ``raise NotImplementedError("exNN_k: ...")`` still in it) raises
``NotImplementedError`` saying which exercise to solve.

Worker processes, under fork, spawn or forkserver, get a stand-in like any library function
(by reference: ``course_lib.reference.exNN`` is importable there) and load the notebook
themselves. Only saved notebooks count: save the exercise notebook after editing it.

Where there is no exercise notebook at all, as in the grader's sandbox (which runs a
submission's cells in its kernel and has no exercises folder), a function of that name defined
at the top level of ``__main__`` (the kernel's namespace, inherited by forked workers) is the
student's answer.

Where the library passes an array for what the question defines as one value
(``ELEMENTWISE`` in :mod:`course_lib.reference`: the keys of ``ring_lookup``, the worker counts
of ``comm_time``), the student's function is called once per element.
"""
from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import re
import symtable
import threading
import time
import types
from pathlib import Path

from .reference import ELEMENTWISE, NOTEBOOKS, lesson_of

#: Environment variable naming the folder of the exercise notebooks (default: ``exercises/``
#: next to the ``course_lib`` folder), or one exercise notebook.
ENV = "COURSE_EXERCISES"
#: Seconds between two looks at a notebook file's modification time.
RECHECK_S = 0.5


class _Unset:
    """The default of a stand-in's optional parameters: "not given, use the student's default"."""

    def __repr__(self):
        return "<default>"


UNSET = _Unset()

_lock = threading.RLock()
_cache: dict = {}               # notebook path -> _Loaded
_active = threading.local()     # stand-ins running in this thread (a student's answer calling itself)


def _reset_after_fork():
    global _lock
    _lock = threading.RLock()
    _active.__dict__.clear()
    _found.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class _Loaded:
    def __init__(self, stamp, module, unparsed):
        self.stamp, self.module, self.unparsed = stamp, module, unparsed
        self.checked = time.monotonic()


def exercises_dir() -> Path:
    """Where the exercise notebooks are looked for."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "exercises"


def notebook_path(lesson: str):
    """The exercise notebook of ``lesson``, or None if there is none."""
    where = exercises_dir()
    if where.suffix == ".ipynb":
        return where if where.is_file() else None
    p = where / NOTEBOOKS.get(lesson, "")
    if lesson in NOTEBOOKS and p.is_file():
        return p
    found = sorted(where.glob(f"{lesson}_*.ipynb")) if where.is_dir() else []
    return found[0] if found else None


#: How :func:`message` names the exercise, for code that reads it back from an error (in a
#: worker's report too): the lesson replay, the grader's feedback.
UNSOLVED_PATTERN = re.compile(r"is what exercise (ex\d\d_\d+) asks you to write")


def message(qid: str, name: str) -> str:
    """What a student reads when a lesson needs an answer they have not written yet."""
    lesson = lesson_of(qid)
    nb = NOTEBOOKS.get(lesson, f"{lesson}_*.ipynb")
    return (f"{name} is what exercise {qid} asks you to write, and this release of the course leaves it out: "
            f"solve {qid} in exercises/{nb}, then run this cell again; this part of the lesson then runs on "
            "your code.")


def _saved(path: Path | None) -> str:
    if path is None:
        return f" (No exercise notebook found in {exercises_dir()}; ${ENV} can name the folder that holds it.)"
    return f" (The library reads {path.name} as saved on disk: save it after editing.)"


def exercise_file(qid: str) -> str:
    """Where a student writes the answer to ``qid``: the notebook's path, as found or as expected."""
    path = notebook_path(lesson_of(qid))
    return str(path) if path is not None else f"exercises/{NOTEBOOKS.get(lesson_of(qid), '?')}"


def _is_stub(stmt, qid: str) -> bool:
    """True if the def ``stmt`` still holds the exercise's ``raise NotImplementedError("exNN_k: ...")``."""
    for node in ast.walk(stmt):
        if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args
                and isinstance(node.exc.args[0], ast.Constant) and isinstance(node.exc.args[0].value, str)
                and node.exc.args[0].value.startswith(f"{qid}:")):
            return True
    return False


def state(qid: str) -> str:
    """``"written"`` if the exercise notebook defines the function of ``qid`` without its stub (its
    visible checks say whether it is right), else ``"not written"``."""
    from .reference import QUESTIONS

    path = notebook_path(lesson_of(qid))
    if path is None:
        return "written" if _defined_in_main(QUESTIONS[qid]) is not None else "not written"
    try:
        defs = _loaded(path, lesson_of(qid)).module.__dict__["__defs__"]
    except (OSError, ValueError):
        return "not written"
    item = defs.get(QUESTIONS[qid])
    if item is None or not isinstance(item[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "not written"
    return "not written" if _is_stub(item[2], qid) else "written"


# -- reading a notebook ----------------------------------------------------------------------

def _code_cells(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for k, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(src)
        yield k, python_only(src)


def python_only(source: str) -> str:
    """A cell's source with IPython magics and shell escapes (not Python) blanked, line numbers kept."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


_SAFE_CALL_ROOTS = {"np", "numpy", "math", "fractions", "Fraction", "int", "float", "complex", "str", "bool",
                    "tuple", "list", "dict", "set", "frozenset", "range", "len", "abs", "min", "max", "sorted"}


def _call_root(func) -> str:
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else ""


def _constant(value) -> bool:
    """An assignment's value a def may rely on: literals, names, arithmetic, and calls of numpy,
    math or builtin constructors only (nothing that runs the notebook's own code or a cluster)."""
    for node in ast.walk(value):
        if isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda)):
            return False
        if isinstance(node, ast.Call) and _call_root(node.func) not in _SAFE_CALL_ROOTS:
            return False
    return True


def _targets(stmt) -> list:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    out = []
    for t in targets:
        for node in ast.walk(t):
            if isinstance(node, ast.Name):
                out.append(node.id)
    return out


def _names_used(stmt) -> set:
    """The global names a top-level statement uses: what its functions read from the module (not
    their parameters and locals), and what its decorators, defaults or value read at top level."""
    table = symtable.symtable(ast.unparse(stmt), "<cell>", "exec")
    out = set()

    def walk(t, top):
        for sym in t.get_symbols():
            if (top and sym.is_referenced()) or (not top and sym.is_global()):
                out.add(sym.get_name())
        for child in t.get_children():
            walk(child, False)

    walk(table, True)
    return out


def _extract(path: Path):
    """(imports, {name: definition}, cells that do not parse), each statement as (order, cell, stmt, source)."""
    imports, defs, unparsed = [], {}, []
    order = 0
    for k, src in _code_cells(path):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            unparsed.append(k)
            continue
        for stmt in tree.body:
            order += 1
            item = (order, k, stmt, src)
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                imports.append(item)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs[stmt.name] = item
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for name in _targets(stmt):
                    # a later assignment that is not a constant hides an earlier constant
                    if isinstance(stmt, ast.AugAssign) or stmt.value is None or not _constant(stmt.value):
                        defs.pop(name, None)
                    else:
                        defs[name] = item
    return imports, defs, unparsed


def _execute(module, item, path: Path):
    order, k, stmt, src = item
    filename = f"<{path.name}, cell {k}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # tracebacks show the lines
    code = compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec")
    exec(code, module.__dict__)


def _load(path: Path, lesson: str) -> _Loaded:
    """The notebook's functions and what they need, executed in a fresh module (cached per file version)."""
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    imports, defs, unparsed = _extract(path)
    module = types.ModuleType(f"exercise_{lesson}")  # not in sys.modules: pickled by value if shipped
    module.__dict__["__builtins__"] = builtins
    module.__file__ = str(path)
    module.__dict__["__defs__"] = defs
    for item in imports:
        try:
            _execute(module, item, path)
        except Exception:  # noqa: BLE001 - an import the wanted function does not need may fail here
            pass
    return _Loaded(stamp, module, unparsed)


def _loaded(path: Path, lesson: str) -> _Loaded:
    key = str(path)
    with _lock:
        entry = _cache.get(key)
        now = time.monotonic()
        if entry is not None and now - entry.checked < RECHECK_S:
            return entry
        st = path.stat()
        if entry is None or entry.stamp != (st.st_mtime_ns, st.st_size):
            entry = _load(path, lesson)
            _cache[key] = entry
        entry.checked = now
        return entry


def _define(entry: _Loaded, name: str, path: Path):
    """Execute the def of ``name`` and, first, the definitions it uses; return the function."""
    module = entry.module
    fns = module.__dict__.setdefault("__functions__", {})
    if name in fns:
        return fns[name]
    defs = module.__dict__["__defs__"]
    if name not in defs or not isinstance(defs[name][2], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    wanted, todo = {name}, [name]
    while todo:
        for used in _names_used(defs[todo.pop()][2]):
            if used in defs and used not in wanted:
                wanted.add(used)
                todo.append(used)
    done = module.__dict__.setdefault("__done__", set())     # statements executed, by notebook order
    for item in sorted((defs[n] for n in wanted), key=lambda it: it[0]):
        if item[0] not in done:
            _execute(module, item, path)
            done.add(item[0])
    fns[name] = module.__dict__[name]
    return fns[name]


_found: dict = {}               # qid -> (the student's function, when it was looked up)


def student_function(qid: str, name: str):
    """The student's function ``name`` (question ``qid``), or NotImplementedError saying what to solve."""
    hit = _found.get(qid)
    now = time.monotonic()
    if hit is not None and now - hit[1] < RECHECK_S:   # a stand-in called in a loop: no file system
        return hit[0]
    fn = _student_function(qid, name)
    _found[qid] = (fn, now)
    _log_use(qid)
    return fn


#: A file to which each process appends the question ids whose answers it ran (once each): the
#: test that checks each lesson's ``uses`` in the manifest reads it.
LOG_ENV = "COURSE_STANDIN_LOG"
_logged: set = set()


def _log_use(qid: str) -> None:
    path = os.environ.get(LOG_ENV)
    if path and qid not in _logged:
        _logged.add(qid)
        with open(path, "a", encoding="utf-8") as f:
            f.write(qid + "\n")


def _student_function(qid: str, name: str):
    lesson = lesson_of(qid)
    path = notebook_path(lesson)
    if path is None:
        in_main = _defined_in_main(name)
        if in_main is not None:
            return in_main
        raise NotImplementedError(message(qid, name) + f" (No exercise notebook of lesson {lesson} in "
                                  f"{exercises_dir()}; ${ENV} can name the folder that holds it.)")
    try:
        entry = _loaded(path, lesson)
    except (OSError, ValueError) as e:   # unreadable, or not a notebook (invalid JSON)
        raise NotImplementedError(message(qid, name) + f" (Could not read {path}: {e}.)") from e
    try:
        with _lock:
            fn = _define(entry, name, path)
    except Exception as e:
        raise ExerciseCodeError(f"{name} (exercise {qid}) could not be defined from {path.name}: running its "
                                f"definition, or a name it uses, raised {type(e).__name__}: {e}") from e
    if fn is None:
        extra = (f" (Cells {', '.join(map(str, entry.unparsed))} of {path.name} are not valid Python yet.)"
                 if entry.unparsed else "")
        raise NotImplementedError(message(qid, name) + (extra or _saved(path)))
    return fn


def _elementwise(fn, pos: tuple, kw: dict, at: int):
    """``fn`` applied to each element of the array ``pos[at]`` (the question defines it on one
    value). A student's function often takes the whole array too (``np.searchsorted`` does): it is
    tried on the array once, and its answer used if its shape is right and it agrees with ``fn`` on
    single elements (first, middle, last); otherwise one call per element, as defined. A lesson
    looking up 100,000 keys then takes milliseconds instead of seconds."""
    import numpy as np

    many = np.asarray(pos[at])
    flat = many.ravel()

    def one(v):
        return fn(*pos[:at], v, *pos[at + 1:], **kw)

    if flat.size > 3:
        try:
            whole = np.asarray(fn(*pos[:at], many, *pos[at + 1:], **kw))
        except Exception:  # noqa: BLE001 - a function of one value only: called per element below
            whole = None
        if whole is not None and whole.shape == many.shape:
            picks = sorted({0, flat.size // 2, flat.size - 1})
            if all(np.array_equal(np.asarray(one(flat[k].item())), whole.ravel()[k]) for k in picks):
                return whole
    return np.asarray([one(v) for v in flat.tolist()]).reshape(many.shape)


class ExerciseCodeError(RuntimeError):
    """The exercise notebook's code for an answer could not even be defined (its def, or a
    definition it uses, raised when run)."""


def _name_the_exercise(exc: BaseException, qid: str, name: str) -> None:
    """Add a line naming the exercise to an error the student's answer raised (its type is kept,
    so code that expects that type still catches it; Python 3.11+, where notes exist)."""
    if hasattr(exc, "add_note") and not getattr(exc, "_course_named", False):
        exc.add_note(f"(raised by your {name}, exercise {qid}, from {exercise_file(qid)})")
        exc._course_named = True


def _defined_in_main(name: str):
    """The function ``name`` defined at the top level of ``__main__``, or None."""
    import sys

    fn = getattr(sys.modules.get("__main__"), name, None)
    return fn if isinstance(fn, types.FunctionType) and fn.__module__ == "__main__" else None


def call(qid: str, name: str, args: tuple, params: tuple):
    """Call the student's answer to ``qid`` with a stand-in's arguments.

    ``args`` are the stand-in's parameters in order, :data:`UNSET` where the caller gave none
    (the student's own default then applies); ``params`` their names."""
    fn = student_function(qid, name)
    k = next((i for i, a in enumerate(args) if a is UNSET), len(args))
    pos = tuple(args[:k])
    kw = {p: a for p, a in zip(params[k:], args[k:]) if a is not UNSET}
    stack = _active.__dict__.setdefault("stack", [])
    if qid in stack:
        raise NotImplementedError(
            f"{name} (exercise {qid}) calls the library's {name}, which in this release of the course runs "
            f"your {name} again: write it with your own code.")
    stack.append(qid)
    try:
        at = ELEMENTWISE.get(qid)
        if at is not None and at < len(pos) and getattr(pos[at], "ndim", 0) >= 1:
            return _elementwise(fn, pos, kw, at)
        return fn(*pos, **kw)
    except NotImplementedError as e:
        if str(e).startswith(qid):  # the exercise's stub: "exNN_k: ..."
            raise NotImplementedError(message(qid, name) + _saved(notebook_path(lesson_of(qid)))) from None
        _name_the_exercise(e, qid, name)
        raise
    except Exception as e:
        _name_the_exercise(e, qid, name)
        raise
    finally:
        stack.pop()


__all__ = ["ENV", "UNSET", "call", "exercise_file", "exercises_dir", "message", "notebook_path", "state",
           "student_function"]
