"""Lessons that teach before their exercises are solved: recorded cells, replayed.

In the student release a lesson calls the student's own answers (the stand-ins of
:mod:`course_lib.standin`). Until a question is solved, a cell that needs its answer cannot
run. So ``make release`` runs every lesson once with the reference answers and *records*, per
code cell, the outputs it showed and the top-level values it bound or changed (pickled), as
data in ``course_lib/recorded/NN.pkl``. In the release, a cell that stops because an answer is
missing (the stand-in's ``NotImplementedError``, raised in the notebook or inside a worker) is
*replayed*: what it printed so far is cleared, one line names the exercise, the recorded
outputs are shown and the recorded values take the cell's place in the namespace, so the
cells after it run on them. Once the student has written the function, the cell runs live, on
their code, and nothing is replayed.

A cell is known by the hash of its source, so a cell the student edited has no recording: the
missing answer is then an ordinary error that names the exercise. A cell that fails for
another reason (a bug in a solved answer) shows its error as always, except a knock-on error
(a name, key or index missing) in a cell after a replayed one, which is replayed too and says so.

Each lesson opens with :func:`lesson_status`, which lists the exercises the lesson runs on
(from the lesson manifest), solved or not, and turns replaying on (or recording, while
``make release`` builds).
"""
from __future__ import annotations

import ast
import hashlib
import os
import pickle
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

#: While ``make release`` records a lesson, the kernel's environment names the folder where
#: each cell's values go (one pickle per cell, merged by :func:`merge_recording`).
RECORD_ENV = "COURSE_RECORD_DIR"
from .standin import UNSOLVED_PATTERN, python_only  # noqa: E402

RECORDED = Path(__file__).resolve().parent / "recorded"   # the release's recordings, one per lesson
# A value larger than this, compressed, is not recorded: a cell after it that reads it is recorded
# instead and replayed as a knock-on. (Training data and long traces, mostly; the lessons' 26 MB
# of recordings at this cap would be 290 MB uncapped and uncompressed.)
MAX_VALUE_BYTES = 1_000_000
BANNER = "recorded result"        # every replayed cell's first line starts with this

# A cell after a replayed one that misses a value the replay could not restore fails with one of
# these; it is replayed too. Any other error is the student's to see.
_KNOCK_ON = (NameError, KeyError, IndexError, AttributeError)
# Methods that change their object in place: a cell calling one at top level changes that name.
_MUTATORS = {"append", "extend", "update", "setdefault", "pop", "popitem", "insert", "add", "remove",
             "discard", "clear", "sort", "fill", "__setitem__"}


def cell_key(source: str) -> str:
    """A code cell's identity in a recording: the hash of its source (whitespace at the ends ignored)."""
    return hashlib.sha256(source.strip().encode("utf-8")).hexdigest()[:20]


def unsolved_question(exc: BaseException | None) -> str | None:
    """The question id whose missing answer stopped ``exc`` (or its cause, or a worker's error
    that quotes it, or another rank's error of the same run), or None when it is something else."""
    seen, todo = set(), [exc]
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        found = UNSOLVED_PATTERN.search(str(exc))
        if found:
            return found.group(1)
        todo += [exc.__cause__, exc.__context__, *getattr(exc, "others", ())]
    return None


# Classes whose pickles name a resource of the process that made them (a shared-memory segment;
# a Cluster does not pickle at all): a value holding one is not recorded; the replay has its own.
_HANDLES = (b"SharedArray",)


# -- which names a cell changes ----------------------------------------------------------------

def _root(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _top_level_nodes(tree):
    """The nodes of a module outside function and class bodies (whose names are local)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))


def changed_names(source: str) -> set[str]:
    """The top-level names a cell binds (``x = ...``, ``for x in``, ``with ... as x``) or visibly
    changes in place (``x[k] = ...``, ``x.attr = ...``, ``x += ...``, ``x.append(...)``)."""
    try:
        tree = ast.parse(python_only(source))
    except SyntaxError:
        return set()
    out = set()
    for node in _top_level_nodes(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            out.add(_root(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            out.add(_root(node.func.value))
    out.discard(None)
    return out


def _definitions(source: str) -> list:
    """The cell's top-level ``def``, ``class`` and import statements, as code to run again."""
    try:
        tree = ast.parse(python_only(source))
    except SyntaxError:
        return []
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return [ast.Module(body=[stmt], type_ignores=[]) for stmt in tree.body if isinstance(stmt, kinds)]


# -- recording (make release) ------------------------------------------------------------------
# Only a cell that runs a reference answer (in the notebook or in a worker) can stop in the
# release, so only such cells are recorded, and the cells after them that read a value the
# recording could not keep. While recording, every reference answer appends its question id to
# a log in the recording folder (one short write per call, from any process); a cell that made
# the log grow ran an answer.

CALLS_LOG = "answers-called.log"
_log = {"fd": None, "pid": None}


def _note_call(qid: str) -> None:
    if _log["pid"] != os.getpid():             # a forked worker opens its own descriptor
        _log["fd"] = os.open(Path(os.environ[RECORD_ENV]) / CALLS_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        _log["pid"] = os.getpid()
    os.write(_log["fd"], f"{qid}\n".encode())


def _traced(fn, qid: str):
    import functools

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        _note_call(qid)
        return fn(*args, **kwargs)

    return traced


class _TraceAnswers:
    """An import hook, while recording: each ``course_lib.reference.exNN`` module, once executed,
    has its question functions replaced by :func:`_traced` ones, before any module imports them."""

    def find_spec(self, name, path=None, target=None):
        if not re.fullmatch(r"course_lib\.reference\.ex\d\d", name):
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _TracingLoader(spec.loader)
        return spec


class _TracingLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        from .reference import questions_of

        self.loader.exec_module(module)
        for name, qid in questions_of(module.__name__[-2:]).items():
            if callable(getattr(module, name, None)):
                setattr(module, name, _traced(getattr(module, name), qid))


def trace_answers_if_recording() -> None:
    """Called first thing by ``import course_lib``: under ``make release``'s recording, trace the
    reference answers (:class:`_TraceAnswers`). Does nothing otherwise."""
    if os.environ.get(RECORD_ENV) and not any(isinstance(f, _TraceAnswers) for f in sys.meta_path):
        sys.meta_path.insert(0, _TraceAnswers())


def _calls_so_far(folder: Path) -> int:
    try:
        return (Path(folder) / CALLS_LOG).stat().st_size
    except FileNotFoundError:
        return 0

def unpack(blob: bytes):
    """A recorded value (see :func:`_picklable`)."""
    return pickle.loads(zlib.decompress(blob))


def _picklable(value) -> bytes | None:
    import types

    if isinstance(value, (types.ModuleType, types.FunctionType, type)):
        return None   # defs and imports are run again from the cell's source
    if type(value).__module__.startswith("matplotlib"):
        return None   # a figure's picture is in the recorded outputs
    try:
        blob = pickle.dumps(value)
        if any(handle in blob for handle in _HANDLES):
            return None   # it names a resource of the recording kernel (not rebuilt here: that attaches it)
        pickle.loads(blob)   # some objects pickle but cannot be rebuilt
    except Exception:  # noqa: BLE001 - whatever does not pickle is not recorded
        return None
    packed = zlib.compress(blob, 6)
    return packed if len(packed) <= MAX_VALUE_BYTES else None


def record_cell(folder: Path, source: str, namespace: dict) -> set:
    """Write what one cell changed (``{name: pickled value}``) to ``folder/<cell key>.pkl``; return
    the names it changed that could not be recorded."""
    values, missing = {}, set()
    for name in sorted(changed_names(source)):
        if name.startswith("_") or name not in namespace:
            continue
        blob = _picklable(namespace[name])
        if blob is not None:
            values[name] = blob
        elif not isinstance(namespace[name], type(pickle)):
            missing.add(name)
    with open(Path(folder) / f"{cell_key(source)}.pkl", "wb") as f:
        pickle.dump(values, f)
    return missing


def _reads(source: str) -> set:
    """The names a cell reads at top level (or its functions read from the namespace)."""
    try:
        tree = ast.parse(python_only(source))
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def merge_recording(notebook, folder: Path) -> dict:
    """One lesson's recording: ``{cell key: {"outputs": [...], "values": {name: bytes}}}`` from the
    executed ``notebook`` (its outputs) and the per-cell values the kernel wrote to ``folder``, for
    the cells that can stop in the release (those the kernel listed in ``folder/cells.txt``)."""
    listed = Path(folder) / "cells.txt"
    keep = set(listed.read_text().split()) if listed.exists() else None
    cells = {}
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        key = cell_key(cell.source)
        path = Path(folder) / f"{key}.pkl"
        if (keep is not None and key not in keep) or not path.exists():
            continue
        cells[key] = {"outputs": [_plain_output(o) for o in cell.get("outputs", [])],
                      "values": pickle.loads(path.read_bytes())}
    return cells


def _plain_output(output) -> dict:
    """An nbformat output as a plain dict (nbformat's nodes pickle, but plain dicts load anywhere)."""
    import json

    return json.loads(json.dumps(output))


# -- replaying (the release) -------------------------------------------------------------------

@dataclass
class _Session:
    """The kernel's replay state: the lesson's recording and what has been replayed."""
    lesson: str
    cells: dict
    current: str = ""                          # source of the cell running now
    replayed: list = field(default_factory=list)    # (cell key, question or None), in order
    handled: bool = False                      # the running cell's error was replayed
    show_traceback: object = None              # IPython's own showtraceback (before ours wrapped it)


_session: _Session | None = None


def replayed_cells() -> list:
    """``[(cell key, question id or None), ...]``: the cells replayed in this kernel so far."""
    return list(_session.replayed) if _session else []


def _announce(qid: str | None, lesson: str) -> str:
    from .reference import NOTEBOOKS, QUESTIONS, lesson_of

    if qid is None:
        why = "a cell above showed a recorded result, and this one builds on it"
        todo = "solve the exercises that cell names"
    else:
        nb = NOTEBOOKS.get(lesson_of(qid), "")
        why = f"this cell needs exercise {qid} ({QUESTIONS.get(qid, '?')} in exercises/{nb}), not written yet"
        todo = f"solve {qid} and run this cell again to see it on your code"
    return (f"{BANNER} ({why}): below is what this cell showed when the course was built with the "
            f"reference answers; {todo}.")


def _show_recorded(outputs: list) -> None:
    from IPython.display import publish_display_data

    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            stream = sys.stderr if out.get("name") == "stderr" else sys.stdout
            stream.write("".join(out.get("text", "")))
            stream.flush()
        elif kind in ("display_data", "execute_result"):
            data = {k: ("".join(v) if isinstance(v, list) else v) for k, v in out.get("data", {}).items()}
            if "application/vnd.jupyter.widget-view+json" in data:
                data = {"text/plain": "(an interactive widget: it runs here once the exercises above are solved)"}
            publish_display_data(data, out.get("metadata", {}))


def _restore(shell, source: str, values: dict) -> None:
    """Put the recorded values of a cell in the namespace, and run its defs and imports again."""
    for stmt in _definitions(source):
        try:
            exec(compile(stmt, "<recorded cell>", "exec"), shell.user_ns)
        except Exception:  # noqa: BLE001 - a def whose decorator needs a missing answer stays undefined
            pass
    for name, blob in values.items():
        try:
            shell.user_ns[name] = unpack(blob)
        except Exception:  # noqa: BLE001 - a value whose class moved since the build is recomputed later
            pass


def _replay(shell, exc) -> bool:
    """Replay the running cell if ``exc`` is a missing answer (or its knock-on); True if done."""
    s = _session
    key = cell_key(s.current)
    if key not in s.cells:
        return False
    qid = unsolved_question(exc)
    if qid is None and not (s.replayed and isinstance(exc, _KNOCK_ON)):
        return False
    from IPython.display import clear_output, publish_display_data

    clear_output()
    text = _announce(qid, s.lesson)
    publish_display_data({"text/plain": text, "text/markdown": f"**{BANNER}** {text[len(BANNER):]}"}, {})
    _show_recorded(s.cells[key]["outputs"])
    _restore(shell, s.current, s.cells[key]["values"])
    s.replayed.append((key, qid))
    return True


def _on_error(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler: replay, or show the traceback as IPython would (IPython
    ignores what a custom handler returns for an error in a cell, so it is shown here)."""
    if _session is not None and _replay(shell, value):
        _session.handled = True
        return None
    show = _session.show_traceback if _session is not None and _session.show_traceback else shell.showtraceback
    show((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
    return None


def _pre_run_cell(info) -> None:
    _session.current = info.raw_cell or ""
    _session.handled = False


def _post_run_cell(result) -> None:
    if _session.handled and result is not None:
        result.error_in_exec = None      # a replayed cell succeeded: Run All goes on
    _session.handled = False


def _quiet_widget_tracebacks(shell):
    """A widget callback (``interact``) that needs a missing answer says so in one line instead
    of a traceback (ipywidgets shows a callback's error with ``showtraceback``). Returns IPython's
    own ``showtraceback``."""
    show = shell.showtraceback

    def showtraceback(exc_tuple=None, *args, **kwargs):
        exc = (exc_tuple or sys.exc_info())[1]
        qid = unsolved_question(exc)
        if qid is None:
            return show(exc_tuple, *args, **kwargs)
        print(f"This widget runs on your answer to {qid}: solve it (and save the exercise notebook) to use it.")

    shell.showtraceback = showtraceback
    return show


def install_replay(lesson: str, recording: dict) -> None:
    """Replay the cells of ``lesson`` that stop on a missing answer (in this IPython kernel)."""
    global _session
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or (_session is not None and _session.lesson == lesson):
        return
    show = _session.show_traceback if _session is not None else None
    if _session is None:
        shell.events.register("pre_run_cell", _pre_run_cell)
        shell.events.register("post_run_cell", _post_run_cell)
        show = _quiet_widget_tracebacks(shell)
    _session = _Session(lesson, recording, show_traceback=show)
    shell.set_custom_exc((Exception,), _on_error)


def install_recorder(folder: str) -> None:
    """While ``make release`` runs a lesson: after every cell that succeeds, record its values."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or getattr(shell, "_course_recorder", False):
        return
    shell._course_recorder = True
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"source": "", "calls": 0, "unrecorded": set()}

    def pre(info):
        state["source"] = info.raw_cell or ""
        state["calls"] = _calls_so_far(folder)

    def post(result):
        source = state["source"]
        ran_an_answer = _calls_so_far(folder) > state["calls"]
        knock_on = bool(_reads(source) & state["unrecorded"])
        if result is not None and result.success and (ran_an_answer or knock_on):
            state["unrecorded"] |= record_cell(folder, source, shell.user_ns)
            with open(folder / "cells.txt", "a") as f:
                f.write(cell_key(source) + "\n")

    shell.events.register("pre_run_cell", pre)
    shell.events.register("post_run_cell", post)


def load_recording(lesson: str) -> dict:
    path = RECORDED / f"{lesson}.pkl"
    return pickle.loads(path.read_bytes()) if path.exists() else {}


# -- the status cell ---------------------------------------------------------------------------

def is_release() -> bool:
    """True in the student release, whose ``course_lib/reference`` holds stand-ins."""
    from .reference import ex00

    return bool(getattr(ex00, "STANDINS", False))


def exercise_status(number: str) -> dict:
    """``{question id: "reference" | "written" | "not written"}`` for the answers lesson ``number``
    runs on ("written": the exercise notebook defines the function without its stub; its check
    cell says whether it is right; "reference": this checkout has the reference answers)."""
    from . import standin
    from .lessons import lesson

    release = is_release()
    return {qid: (standin.state(qid) if release else "reference") for qid in lesson(number).uses}


def _where(qid: str) -> str:
    """Where the student writes ``qid``'s answer, relative to the course's folder when inside it."""
    from . import standin

    path = Path(standin.exercise_file(qid))
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return str(path)


def lesson_status(number: str) -> None:
    """The status cell of a lesson: which exercises it runs on, written or not (printed); turns
    replaying on in the release (recording, while ``make release`` records the lesson)."""
    from .lessons import lesson
    from .reference import QUESTIONS

    this = lesson(number)
    if os.environ.get(RECORD_ENV):
        install_recorder(os.environ[RECORD_ENV])
    release = is_release()
    status = exercise_status(number)
    if release:
        install_replay(number, load_recording(number))
    if not this.uses:
        print(f"Lesson {number} runs on the library alone: no exercise answer is needed.")
        return
    names = ", ".join(f"{qid} ({QUESTIONS[qid]})" for qid in this.uses)
    if os.environ.get(RECORD_ENV):
        print(f"Lesson {number} runs on the answers to {names}. These outputs were recorded when the course "
              "was built, with the reference answers; run this cell to see which of them you have written.")
        return
    if not release:
        print(f"Lesson {number} runs on the answers to {names}: this checkout has the reference answers, "
              "so every cell runs as written.")
        return
    print(f"Lesson {number} runs on your answers to these exercises:")
    for qid, state in status.items():
        print(f"  {qid} {QUESTIONS[qid]:<24} {state:<11} (in {_where(qid)})")
    if "not written" in status.values():
        print(f"A cell that needs an answer you have not written shows the result recorded when the course "
              f"was built, and says so in a first line starting '{BANNER}'; once you solve the exercise "
              "(and save its notebook), run the cell again to see it on your code.")


__all__ = ["BANNER", "cell_key", "changed_names", "exercise_status", "install_replay", "lesson_status",
           "replayed_cells",
           "unsolved_question"]
