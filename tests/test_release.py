"""The student release (``make release``): no answer gets through, and what is there works.

The release is built once into a temporary folder. Then:

(a) it has no ``solutions/`` and no ``tests/``, and no file of it contains a non-trivial line of
    the hidden checks, of the test fixtures or of a solution region;
(b) its ``course_lib/reference`` holds only the generated stand-ins, and no function anywhere in
    its ``course_lib`` has the body of a reference answer;
(c) behaviour: in a process that imports the release's ``course_lib``, every function of that
    library (all modules, top-level functions and static/class methods, private ones too) with as
    many required positional parameters as a question's function is tried as the answer to that
    question with its visible checks, each in a forked child, and none passes. The solution's own
    function is tried first, as a control that the checks can pass at all; it also records the
    arguments the checks give it, and where the checks are slow (clusters), a candidate that raises
    on those arguments is counted as failing without the cluster run. Skipped as obviously not
    applicable: a candidate whose first parameter is a communicator, a cluster, a function, a
    notebook namespace or a file descriptor when the question's is not (and the other way round),
    and the transport algorithms behind the communicator's collective methods
    (``comm.allgather(x, algorithm=...)``): the MPI interface students are given, not answers;
(d) the release imports without ``make``, and a stand-in runs the answer written in a (solved)
    exercise notebook, in worker processes under fork, spawn and forkserver, and says which
    exercise to solve while it is not.

Run as a script (``python tests/test_release.py candidates ...``) this file is the child process
of (c).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
BEGIN = re.compile(r"^\s*# BEGIN SOLUTION\b")
END = re.compile(r"^\s*# END SOLUTION\b")
MIN_LINE = 25                      # shorter lines are too common to mean anything
# What a function's first parameter is, from its name, where no question passes that kind of object
# first unless its own function's first parameter has a name of the same kind.
FIRST_KINDS = {
    "communicator": {"comm", "transport", "group"},     # (not "t": a clock as often as a transport)
    "cluster": {"cluster"},
    "function": {"fn", "f", "func", "worker", "check"},
    "namespace": {"ns"},
    "os": {"fd", "conn", "argv"},
}
BUDGET_S = 60.0                    # the candidate search must stay this fast
PARALLEL = max(2, min(4, os.cpu_count() or 1))   # trials at a time


# -- reading the checkout ------------------------------------------------------------------------

def _code_cells(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            yield "".join(src) if isinstance(src, list) else src


def _docstring_lines(source: str) -> set:
    """Line numbers (1-based) of the module, class and function docstrings of ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def _meaningful(line: str) -> bool:
    s = line.strip()
    return (len(s) >= MIN_LINE and not s.startswith("#")
            and not re.match(r"^(import\s|from\s+\S+\s+import\s)", s))


def _lines_of_python(source: str, skip_docstrings: bool = True) -> set:
    doc = _docstring_lines(source) if skip_docstrings else set()
    return {line.strip() for k, line in enumerate(source.splitlines(), 1) if k not in doc and _meaningful(line)}


def _solution_regions():
    """(lines inside ``# BEGIN SOLUTION`` regions, the other code lines) of the solution notebooks."""
    inside, outside = set(), set()
    for nb in sorted(SOLUTIONS.glob("*.ipynb")):
        for src in _code_cells(nb):
            depth = 0
            for line in src.splitlines():
                if BEGIN.match(line):
                    depth += 1
                    continue
                if END.match(line):
                    depth = max(0, depth - 1)
                    continue
                if _meaningful(line):
                    (inside if depth else outside).add(line.strip())
    return inside, outside


def secret_lines() -> dict:
    """Non-trivial lines no release file may hold, by where they come from.

    Left out as public by construction: the lines of the visible checks (``course_lib/questions``,
    whose helpers the hidden checks share), the solution notebooks' lines outside their solution
    regions (the exercises hold them), and the idioms of the library, lines that two or more of
    its modules (outside the reference answers) have, like ``p, r = comm.size, comm.rank``."""
    public, seen_in = set(), {}
    for path in sorted((REPO / "course_lib" / "questions").glob("*.py")):
        public |= _lines_of_python(path.read_text(encoding="utf-8"), skip_docstrings=False)
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        if "reference" not in path.relative_to(REPO / "course_lib").parts:
            for line in _lines_of_python(path.read_text(encoding="utf-8"), skip_docstrings=False):
                seen_in.setdefault(line, set()).add(path)
    public |= {line for line, paths in seen_in.items() if len(paths) > 1}
    regions, outside = _solution_regions()
    public |= outside
    out = {}
    for path in sorted((REPO / "tests" / "hidden").glob("*.py")) + sorted((REPO / "tests" / "fixtures").rglob("*.py")):
        for line in _lines_of_python(path.read_text(encoding="utf-8")) - public:
            out.setdefault(line, str(path.relative_to(REPO)))
    for line in regions - public:
        out.setdefault(line, "a solution region")
    return out


def solution_functions() -> dict:
    """``{qid: {"name", "required", "first", "lesson"}}`` of every question, from the solutions' defs."""
    from course_lib.reference import QUESTIONS, lesson_of

    defs = {}
    for nb in sorted(SOLUTIONS.glob("*.ipynb")):
        for src in _code_cells(nb):
            try:
                tree = ast.parse(src)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    a = node.args
                    params = [x.arg for x in a.posonlyargs + a.args]
                    defs[node.name] = {"required": len(params) - len(a.defaults), "first": params[0] if params else ""}
    out = {}
    for qid, name in QUESTIONS.items():
        assert name in defs, f"no def {name} in the solution notebooks ({qid})"
        out[qid] = dict(defs[name], name=name, lesson=lesson_of(qid))
    return out


# -- the release ---------------------------------------------------------------------------------

import pytest  # noqa: E402  (the script mode above needs none of it)

pytestmark = pytest.mark.xdist_group("release")  # one process builds the release every test here reads


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from course_lib.release import build

    out = tmp_path_factory.mktemp("release") / "course-release"
    t0 = time.perf_counter()
    build(out)
    print(f"release built in {time.perf_counter() - t0:.1f} s")
    return out


def _file_lines(root: Path):
    """(path, its stripped lines) of every file of the release; a notebook's lines are its cells'."""
    for path in sorted(root.rglob("*")):
        if path.is_dir() or path.suffix in (".gz", ".pyc"):
            continue
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
            text = "\n".join("".join(c.get("source", "")) for c in cells)
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
        yield path, {line.strip() for line in text.splitlines()}


def test_table_agrees_with_the_question_modules():
    """One table says which function answers which question: the one the questions declare."""
    from course_lib.grading import all_questions, load_lesson
    from course_lib.reference import NOTEBOOKS, QUESTIONS

    for lesson in NOTEBOOKS:
        load_lesson(lesson, with_hidden=False)
    declared = {q.qid: q.names[0] for q in all_questions() if q.lesson in NOTEBOOKS}
    assert declared == QUESTIONS
    for name in NOTEBOOKS.values():
        assert (REPO / "exercises" / name).is_file() and (SOLUTIONS / name).is_file()


# That each reference answer passes its question's checks is tested once, on the solution notebooks'
# answers (tests/test_checks.py::test_solution_passes_visible_and_hidden_checks), which are written
# from the references (tests/test_one_source.py).


def test_release_has_no_solutions_tests_or_their_lines(release):
    assert not (release / "solutions").exists() and not (release / "tests").exists()
    for sub in ("notebooks", "exercises", "course_lib", "course_lib/questions", "examples"):
        assert (release / sub).is_dir(), sub
    # lesson 07 launches these with mpiexec: without them its cells fail in the students' copy
    for program in ("collectives.py", "mapreduce_gd.py", "gossip.py"):
        assert (release / "examples" / program).is_file(), program
    for name in ("pyproject.toml", "environment.yml", "README.md", "Makefile"):
        assert (release / name).is_file(), name
    with tarfile.open(release.parent / f"{release.name}.tar.gz") as t:
        names = t.getnames()
    assert f"{release.name}/course_lib/reference/ex04.py" in names and not any("/solutions/" in n for n in names)
    secrets = secret_lines()
    assert len(secrets) > 200, "the secret lines were not found"
    leaks = []
    for path, lines in _file_lines(release):
        leaks += [
            f"{path.relative_to(release)}: {line!r} (from {secrets[line]})" for line in sorted(lines & secrets.keys())
        ]
    leaked = "\n".join(leaks[:30])
    assert not leaks, f"the release contains lines of the hidden checks, fixtures or solutions:\n{leaked}"


def _function_bodies(source: str) -> dict:
    """{ast dump of a function's body without its docstring: name} for every function of ``source``."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]
            if body:
                out[ast.dump(ast.Module(body=body, type_ignores=[]))] = node.name
    return out


def test_release_reference_is_only_stand_ins(release):
    from course_lib.reference import NOTEBOOKS, questions_of
    from course_lib.release import reference_signatures, standin_function

    real = {}
    for lesson in NOTEBOOKS:
        path = release / "course_lib" / "reference" / f"ex{lesson}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert sorted(f.name for f in funcs) == sorted(questions_of(lesson)), path
        others = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ImportFrom))
                  and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                  and ast.unparse(n) != "STANDINS = True"]
        assert not others, f"{path.name}: unexpected top-level code {[ast.dump(n)[:60] for n in others]}"
        assert all(n.module == "course_lib.standin" for n in tree.body if isinstance(n, ast.ImportFrom))
        sigs = reference_signatures(lesson)  # from the checkout's real references
        for f in funcs:
            want = ast.parse(standin_function(questions_of(lesson)[f.name], f.name, *sigs[f.name])).body[0]
            assert ast.dump(f) == ast.dump(want), f"{path.name}: {f.name} is not the generated stand-in"
        reference = REPO / "course_lib" / "reference" / f"ex{lesson}.py"
        real.update(_function_bodies(reference.read_text(encoding="utf-8")))
    copies = []
    for path in sorted((release / "course_lib").rglob("*.py")):
        for dump, name in _function_bodies(path.read_text(encoding="utf-8")).items():
            if dump in real:
                copies.append(f"{path.relative_to(release)}: {name} has the body of the reference {real[dump]}")
    assert not copies, "\n".join(copies)


# The ring allreduce's whole alpha-beta-gamma time, ex02_4's answer, as the library wrote it in
# its cost table: "2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma" (spaces and "p - 1" vary).
RING_TIME = re.compile(r"2\s*\(\s*p\s*-\s*1\s*\)\s*alpha[^\n]*beta[^\n]*gamma")


def test_release_states_no_formula_answer(release):
    """A question whose answer is a formula is not answered by a docstring, a comment or a cost
    table of the library students get: the ring allreduce's time (ex02_4) appears nowhere in it."""
    from course_lib import costs

    assert RING_TIME.search("2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma")  # the pattern finds it
    assert ("allreduce", "ring") not in costs.FORMULAS
    found = [f"{path.relative_to(release)}:{i}" for path in sorted((release / "course_lib").rglob("*.py"))
             for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if RING_TIME.search(text)]
    assert not found, f"the ring allreduce's time (ex02_4's answer) is written in {found}"


# -- (c) every library function tried as every answer ------------------------------------------------

@pytest.mark.sweep  # about a minute on 2 cores: `make test-all`
@pytest.mark.skipif(not hasattr(os, "fork"), reason="tries each candidate in a forked child (POSIX)")
def test_no_library_function_passes_a_question(release, tmp_path):
    spec = {"release": str(release), "questions": solution_functions(),
            "solutions": {p.name[:2]: str(p) for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb")}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(release), MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env.pop("COURSE_EXERCISES", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "candidates", str(tmp_path / "spec.json"),
                           str(tmp_path / "out.json")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    print(f"candidate search: {seconds:.1f} s, {out['candidates']} functions in the release's course_lib "
          f"({out['import_errors'] or 'every module imported'})")
    for qid, r in out["questions"].items():
        print(f"  {qid} {r['name']:24s} tried {r['tried']:4d} candidates ({r['seconds']:5.1f} s of trials, "
              f"slowest {r['slowest'][0]} {r['slowest'][1]} s); the solution's own: {r['control']}")
    passed = {qid: r["passed"] for qid, r in out["questions"].items() if r["passed"]}
    assert not passed, f"library functions of the release pass questions: {passed}"
    assert out["course_lib"].startswith(str(release)), out["course_lib"]
    assert sum(r["tried"] for r in out["questions"].values()) > 500
    vacuous = [qid for qid, r in out["questions"].items() if r["control"] != "passed"]
    if vacuous:
        warnings.warn(f"the solutions themselves do not pass the visible checks of {vacuous} under the release "
                      "library, so no candidate could pass those either", stacklevel=1)
    assert seconds < BUDGET_S * 2, f"the candidate search took {seconds:.0f} s"


def _signature(fn):
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    pos, req, var = [], 0, False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            pos.append(p.name)
            req += p.default is p.empty
        elif p.kind == p.VAR_POSITIONAL:
            var = True
        elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            return None                       # cannot be called with positional arguments alone
    return pos, req, var


def _candidates(root: Path):
    """Every function defined in the release's course_lib: (qualified name, function), one per code object."""
    import importlib
    import pkgutil
    import types

    errors, mods = [], []
    for info in pkgutil.walk_packages([str(root)], "course_lib."):
        try:
            mods.append(importlib.import_module(info.name))
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            errors.append(f"{info.name}: {type(e).__name__}")
    mods.append(importlib.import_module("course_lib"))
    seen, out = set(), []
    for mod in mods:
        for name, obj in sorted(vars(mod).items()):
            items = []
            if isinstance(obj, types.FunctionType) and obj.__module__ == mod.__name__:
                items.append((f"{mod.__name__}.{name}", obj))
            elif isinstance(obj, type) and obj.__module__ == mod.__name__:
                for k, v in sorted(vars(obj).items()):
                    if isinstance(v, (staticmethod, classmethod)):
                        items.append((f"{mod.__name__}.{name}.{k}", getattr(obj, k)))
            for qual, fn in items:
                code = getattr(getattr(fn, "__func__", fn), "__code__", None)
                if code is not None and id(code) not in seen:
                    seen.add(id(code))
                    out.append((qual, fn))
    return out, errors


def _applies(sig, spec) -> bool:
    """A candidate with as many required positional parameters as the question's function, and not
    obviously meant for something else: its first parameter is a communicator (a cluster, a function,
    a notebook namespace, a file descriptor) exactly when the question's function's is."""
    pos, req, var = sig
    if req != spec["required"]:
        return False
    first = pos[0] if pos else ""
    kind = next((k for k, names in FIRST_KINDS.items() if first in names), None)
    wanted = next((k for k, names in FIRST_KINDS.items() if spec["first"] in names), None)
    return kind == wanted


def _trial(qid, name, fn, timeout, inputs=()):
    """Start the visible checks of ``qid`` on ``fn`` in a forked child (its own process group).

    ``inputs``: arguments the checks gave the solution's function (recorded); a candidate that
    raises on one of them fails those checks, and is not run through them (they start clusters).
    Returns (pid, the read end of a pipe that will carry the status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                             # the child
        os.close(r)
        status = "crashed"
        try:
            os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import copy

            from course_lib.grading import run_question

            for args, kwargs in inputs:
                try:
                    fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
                except Exception:  # noqa: BLE001
                    status = "failed (raises on the checks' inputs)"
                    break
            else:
                status = run_question(qid, {name: fn}, hidden=False, timeout=timeout).status
        except BaseException as e:  # noqa: BLE001
            status = f"raised {type(e).__name__}"
        finally:
            os.write(w, status.encode()[:200])
            os._exit(0)
    os.close(w)
    return pid, r


def _finish(pid, fd, done: bool) -> str:
    """The child's status (killing it first if it ran out of time), and its leftover workers killed."""
    data = os.read(fd, 256).decode() if done else ""
    os.close(fd)
    if not done:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    os.waitpid(pid, 0)
    try:
        os.killpg(pid, signal.SIGKILL)                       # workers it left behind
    except OSError:
        pass
    return data or ("hung" if not done else "crashed")


def _run_jobs(jobs, parallel):
    """jobs: [(key, qid, name, fn, timeout, limit, inputs)] -> ({key: status}, {key: seconds}),
    ``parallel`` at a time."""
    import select

    results, seconds, running, queue = {}, {}, {}, list(jobs)
    while queue or running:
        while queue and len(running) < parallel:
            key, qid, name, fn, timeout, limit, inputs = queue.pop(0)
            pid, fd = _trial(qid, name, fn, timeout, inputs)
            running[fd] = (pid, key, time.monotonic(), limit)
        ready, _, _ = select.select(list(running), [], [], 0.1)
        now = time.monotonic()
        for fd in list(running):
            pid, key, start, limit = running[fd]
            if fd in ready or now - start > limit:
                del running[fd]
                results[key] = _finish(pid, fd, fd in ready)
                seconds[key] = time.monotonic() - start
    return results, seconds


def _recording(fn, folder: Path):
    """``fn``, writing the arguments of each call to ``folder`` first (from worker processes too)."""
    import functools

    folder = str(folder)

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        import uuid

        import cloudpickle

        stamp = f"{time.monotonic_ns()}-{uuid.uuid4().hex}.pkl"
        try:
            with open(os.path.join(folder, stamp), "wb") as fh:
                cloudpickle.dump((args, kwargs), fh)
        except Exception:  # noqa: BLE001 - a call that cannot be recorded is only not replayed
            pass
        result = fn(*args, **kwargs)
        try:   # what the solution returned, for the recorded-results candidates' first look
            os.makedirs(os.path.join(folder, "results"), exist_ok=True)
            with open(os.path.join(folder, "results", stamp), "wb") as fh:
                cloudpickle.dump(result, fh)
        except Exception:  # noqa: BLE001
            pass
        return result

    return recorded


def _recorded(folder: Path, most: int = 4) -> list:
    import pickle

    out = []
    for path in sorted(folder.glob("*.pkl"))[:most]:
        try:
            out.append(pickle.loads(path.read_bytes()))
        except Exception:  # noqa: BLE001
            pass
    return out


def _solution_namespace(path: str) -> dict:
    """A solution notebook's imports and definitions, executed as a notebook would (no demos, no checks)."""
    ns = {"__name__": "__main__"}
    for src in _code_cells(Path(path)):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))]
        if keep and len(keep) == len(tree.body):
            exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)
    return ns


def _same(a, b) -> bool:
    """A candidate's return equals the solution's (numpy arrays by value, else ==; errors: not equal)."""
    import numpy as np

    try:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            a, b = np.asarray(a), np.asarray(b)
            return a.shape == b.shape and a.dtype.kind == b.dtype.kind and bool(np.allclose(a, b, equal_nan=True))
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _recorded_values(release: Path, lessons_of_q: list) -> list:
    """The values a release's lesson recordings (course_lib/recorded/NN.pkl) hold, and the items of
    its dicts, lists and tuples one level down: what a student could copy out of them."""
    import pickle

    from course_lib.replay import unpack

    blobs = {}
    for number in lessons_of_q:
        path = release / "course_lib" / "recorded" / f"{number}.pkl"
        if not path.exists():
            continue
        for cell in pickle.loads(path.read_bytes()).values():
            for blob in cell["values"].values():
                try:
                    value = unpack(blob)
                except Exception:  # noqa: BLE001
                    continue
                items = [value]
                if isinstance(value, dict):
                    items += list(value.values())
                elif isinstance(value, (list, tuple)):
                    items += list(value)
                for item in items:
                    try:
                        blobs.setdefault(pickle.dumps(item), item)
                    except Exception:  # noqa: BLE001
                        pass
    return list(blobs.values())


def _recorded_candidates(values: list, q: dict, results: list) -> list:
    """Functions of the question's arity that return a recorded value (or look their first argument
    up in a recorded dict), kept only if they return what the solution returned on every recorded
    call of the visible checks (``results``: (args, kwargs, result)); a candidate that fails that
    cannot pass the checks, which compare returns."""
    names = [q["first"] or "a0"] + [f"a{i}" for i in range(1, q["required"])]
    params = ", ".join(names[: q["required"]])
    out = []
    for k, v in enumerate(values):
        ns = {"_v": v, "_copy": __import__("copy")}
        exec(f"def constant({params}):\n    return _copy.deepcopy(_v)\n", ns)
        fns = [(f"recorded value {k} ({type(v).__name__})", ns["constant"])]
        if isinstance(v, dict) and q["required"]:
            exec(f"def lookup({params}):\n    return _copy.deepcopy(_v[{(q['first'] or 'a0')}])\n", ns)
            fns.append((f"lookup in recorded dict {k}", ns["lookup"]))
        for label, fn in fns:
            ok = bool(results)
            for args, kwargs, result in results:
                try:
                    got = fn(*args, **kwargs)
                except Exception:  # noqa: BLE001
                    ok = False
                if not (ok and _same(got, result)):
                    ok = False
                    break
            if ok:
                out.append((label, fn))
    return out


def _control_results(folder: Path) -> list:
    """(args, kwargs, result) of the solution's recorded calls (results without replayable args get
    placeholder args: only constants can match them)."""
    import pickle

    out = []
    for path in sorted((folder / "results").glob("*.pkl")):
        try:
            result = pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001
            continue
        call = folder / path.name
        try:
            args, kwargs = pickle.loads(call.read_bytes())
        except Exception:  # noqa: BLE001
            args, kwargs = None, None
        out.append((args, kwargs, result))
    return out


def recorded_main(spec_path, out_path):
    """Child process: the values in the release's lesson recordings, tried as every answer."""
    spec = json.loads(Path(spec_path).read_text())
    release = Path(spec["release"])
    sys.path.insert(0, str(release))
    from course_lib.grading import get_question, load_lesson

    for lesson in sorted({q["lesson"] for q in spec["questions"].values()}):
        load_lesson(lesson, with_hidden=False)
    records = Path(out_path).parent / "inputs"
    controls = []
    for qid, q in spec["questions"].items():
        ns = _solution_namespace(spec["solutions"][q["lesson"]])
        (records / qid).mkdir(parents=True, exist_ok=True)
        limit = get_question(qid).timeout
        controls.append((qid, qid, q["name"], _recording(ns[q["name"]], records / qid), limit, limit + 10, ()))
    control_status, _ = _run_jobs(controls, 2)
    jobs, per_q = [], {}
    for qid, q in spec["questions"].items():
        results = _control_results(records / qid)
        for k, (args, _, result) in enumerate(results):
            if args is None:   # a communicator's call: only a constant can match, so give it any arguments
                results[k] = ((None,) * q["required"], {}, result)
        values = _recorded_values(release, spec["lessons_of"][qid])
        cands = _recorded_candidates(values, q, results)
        per_q[qid] = {"values": len(values), "calls": len(results), "survivors": len(cands), "passed": [],
                      "control": control_status[qid]}
        timeout = get_question(qid).timeout
        jobs += [((qid, label), qid, q["name"], fn, timeout, timeout + 5, ()) for label, fn in cands]
    results, _ = _run_jobs(jobs, PARALLEL)
    for (qid, label), status in results.items():
        if status == "passed":
            per_q[qid]["passed"].append(label)
    Path(out_path).write_text(json.dumps({"questions": per_q}, indent=1))
    return 0


def candidates_main(spec_path, out_path):
    """The child process of (c): the release's course_lib first on sys.path, every candidate tried."""
    spec = json.loads(Path(spec_path).read_text())
    release = spec["release"]
    sys.path.insert(0, release)
    import course_lib
    from course_lib.grading import get_question, load_lesson

    root = Path(course_lib.__file__).resolve().parent
    assert str(root).startswith(str(Path(release).resolve())), f"imported {root}, not the release's course_lib"
    for lesson in sorted({q["lesson"] for q in spec["questions"].values()}):
        load_lesson(lesson, with_hidden=False)
    t_start = time.perf_counter()
    cands, errors = _candidates(root)
    sigs = [(qual, fn, _signature(fn)) for qual, fn in cands]
    # The transport algorithms behind the communicator's collective methods (comm.allgather(x,
    # algorithm="recursive_doubling") runs course_lib.collectives.allgather.recursive_doubling) are
    # the MPI interface the course gives students, not answers: not tried.
    from course_lib.collectives import ALGORITHMS

    exempt = {id(f.__code__) for table in ALGORITHMS.values() for f in table.values()}
    # What a candidate may import lazily is imported once here, not in every child.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401

    # Control: the solution's own function passes (else the checks cannot tell a candidate either).
    # It also records what the checks give it, for the candidates' first look (see _trial).
    records = Path(out_path).parent / "inputs"
    controls = []
    for qid, q in spec["questions"].items():
        ns = _solution_namespace(spec["solutions"][q["lesson"]])
        limit = get_question(qid).timeout
        (records / qid).mkdir(parents=True, exist_ok=True)
        controls.append((qid, qid, q["name"], _recording(ns[q["name"]], records / qid), limit, limit + 10, ()))
    t0 = time.perf_counter()
    control_status, control_time = _run_jobs(controls, 2)
    control_s = time.perf_counter() - t0

    jobs, per_q = [], {}
    for qid, q in spec["questions"].items():
        # three times what the solution needs, at least 2 s (a cluster run is slow on a busy machine)
        timeout = max(2.0, 3 * control_time[qid])
        # checks slow enough to matter: a first look on the recorded inputs (not for communicators,
        # whose calls cannot be replayed outside their cluster)
        slow = control_time[qid] > 0.3 and q["first"] not in FIRST_KINDS["communicator"]
        inputs = _recorded(records / qid) if slow else []
        per_q[qid] = {"name": q["name"], "tried": 0, "passed": [], "control": control_status[qid],
                      "seconds": 0.0, "slowest": ["", 0.0], "first_look": len(inputs)}
        for k, (_qualname, fn, sig) in enumerate(sigs):
            if sig is None or not _applies(sig, q):
                continue
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if id(code) in exempt:
                continue
            per_q[qid]["tried"] += 1
            jobs.append(((qid, k), qid, q["name"], fn, timeout, timeout + 3, inputs))
    t0 = time.perf_counter()
    results, seconds = _run_jobs(jobs, PARALLEL)
    total = time.perf_counter() - t0
    for (qid, k), status in results.items():
        per_q[qid]["seconds"] = round(per_q[qid]["seconds"] + seconds[(qid, k)], 2)
        if seconds[(qid, k)] > per_q[qid]["slowest"][1]:
            per_q[qid]["slowest"] = [sigs[k][0], round(seconds[(qid, k)], 2)]
        if status == "passed":
            per_q[qid]["passed"].append(sigs[k][0])
    Path(out_path).write_text(json.dumps({
        "course_lib": str(root), "candidates": len(cands), "import_errors": errors, "questions": per_q,
        "control_seconds": round(control_s, 1), "search_seconds": round(total, 1),
        "total_seconds": round(time.perf_counter() - t_start, 1)}, indent=1))
    return 0


# -- (d) the release works on its own ----------------------------------------------------------------

def _run_in(release: Path, code: str, env_extra=None, timeout=180):
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    env.pop("COURSE_EXERCISES", None)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=release, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_release_imports_without_make_and_says_what_to_solve(release):
    out = _run_in(release, """
        import pathlib, course_lib, networkx as nx
        import course_lib.gossip, course_lib.ps, course_lib.async_ps, course_lib.mapreduce
        import course_lib.model_parallel, course_lib.collectives.sync_batchnorm, course_lib.costs, course_lib.questions
        from course_lib.reference.ex04 import metropolis_weights
        print(pathlib.Path(course_lib.__file__).resolve())
        for call in (lambda: metropolis_weights(nx.cycle_graph(4)),
                     lambda: course_lib.gossip.metropolis_hastings(nx.cycle_graph(4))):
            try:
                call()
            except NotImplementedError as e:
                print("NIE", e)
    """)
    lines = out.splitlines()
    assert lines[0].startswith(str(release.resolve())), lines[0]
    want = ("NIE metropolis_weights is what exercise ex04_1 asks you to write, and this release of the course "
            "leaves it out: solve ex04_1 in exercises/04_gossip.ipynb, then run this cell again; this part of "
            "the lesson then runs on your code.")
    assert len(lines) == 3 and all(line.startswith(want) for line in lines[1:]), lines


@pytest.mark.slow
def test_stand_ins_run_the_students_answer_in_workers(release, tmp_path):
    solved = tmp_path / "solved"
    shutil.copytree(release, solved, ignore=shutil.ignore_patterns("__pycache__"))
    nb_path = solved / "exercises" / "04_gossip.ipynb"
    shutil.copy(SOLUTIONS / "04_gossip.ipynb", nb_path)           # a student who solved lesson 04
    code = """
        import numpy as np, course_lib.gossip as gs
        if __name__ == "__main__":
            G, x0 = gs.ring(5), np.arange(5.0)
            W = gs.metropolis_hastings(G)                            # the student's ex04_1
            run = gs.run_gossip(G, x0, steps=6)                      # the student's ex04_3, in the workers
            want = np.linalg.matrix_power(W, 6) @ x0
            print(float(np.abs(run.traj[-1] - want).max()), float(W[0, 1]), gs.spectrum(W).r)
    """
    for method in ("fork", "spawn", "forkserver"):
        err, w01, r = map(float, _run_in(solved, code, {"COURSE_START_METHOD": method}).split())
        assert err < 1e-12 and abs(w01 - 1 / 3) < 1e-15, method
    # The stand-in runs what the notebook says now: an answer edited (and saved) is used at once.
    nb = json.loads(nb_path.read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if src.startswith("def mixing_rate("):
            cell["source"] = "def mixing_rate(W):\n    return 0.125\n"
    nb_path.write_text(json.dumps(nb))
    out = _run_in(solved, """
        import course_lib.gossip as gs
        print(gs.spectrum(gs.metropolis_hastings(gs.ring(6))).r)
    """)
    assert float(out) == 0.125
    # Where the library looks up many keys at once, the student's one-key ring_lookup runs per key.
    shutil.copy(SOLUTIONS / "05_parameter_server_internals.ipynb", solved / "exercises")
    out = _run_in(solved, """
        import numpy as np
        from course_lib.ps import HashRing
        ring = HashRing(range(3), n_keys=500, vnodes=4)
        keys = np.arange(500)
        i = np.searchsorted(ring.points, keys)
        print(bool((ring.lookup(keys) == ring.owners[np.where(i == len(ring.points), 0, i)]).all()),
              ring.lookup(7) == ring.lookup(np.array([7]))[0])
    """)
    assert out.split() == ["True", "True"]
    # A stand-in brings along what the student's def uses: lesson 06's row-parallel layer calls the
    # notebook's own ring_allreduce helper.
    shutil.copy(SOLUTIONS / "06_model_and_pipeline_parallel.ipynb", solved / "exercises")
    out = _run_in(solved, """
        import numpy as np
        import course_lib as cl, course_lib.model_parallel as mp
        if __name__ == "__main__":
            params = mp.init_mlp(5, 7, 3, seed=0)
            X, T = mp.make_data(6, 5, 3, seed=1)
            with cl.Cluster(3, start_method="spawn") as c:
                res = c.run(mp.tp_mlp_step, params, X, T)
            print(max(float(np.abs(r["Y"] - mp.forward(params, X)["Y"]).max()) for r in res))
    """)
    assert float(out) < 1e-12
    # The unsolved exercise of another lesson still says what to solve, from worker processes too.
    out = _run_in(solved, """
        import numpy as np
        from course_lib import Cluster, WorkerError
        from course_lib.reference.ex02 import ring_allreduce
        def reduce(comm):
            return ring_allreduce(comm, np.ones(3))
        if __name__ == "__main__":
            with Cluster(2, start_method="spawn") as c:
                try:
                    c.run(reduce)
                except WorkerError as e:
                    print("ring_allreduce is what exercise ex02_1 asks you to write" in str(e))
    """)
    assert out.split() == ["True"]


def _notebook(path: Path, cells):
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                           "source": src} for src in cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_stand_in_takes_the_def_and_what_it_uses(tmp_path, monkeypatch):
    """The extraction itself, in this process: magics, helpers and constants, nothing that runs code."""
    import numpy as np

    from course_lib import standin
    from course_lib.mapreduce import SpeedupModel

    monkeypatch.setenv(standin.ENV, str(tmp_path))
    monkeypatch.setattr(standin, "RECHECK_S", 0.0)
    monkeypatch.setattr(standin, "_cache", {})
    monkeypatch.setattr(standin, "_found", {})
    nb = tmp_path / "04_gossip.ipynb"
    _notebook(
        nb,
        [
            "%matplotlib inline\nimport numpy as np\nSCALE = 2.0\n",
            "def _helper(x):\n    return x * SCALE\n",
            "W = mixing_rate(np.eye(2))   # runs the student's code: never executed by a stand-in\n",
            "def mixing_rate(W):\n    ev = 0.25\n    return float(_helper(ev))\n",
            "def gossip_step(comm, x, weights)\n    return x\n",  # not valid Python yet
            "def metropolis_weights(G):\n    import course_lib.gossip as gs\n    return gs.metropolis_hastings(G)\n",
        ],
    )
    assert standin.call("ex04_2", "mixing_rate", (np.eye(3),), ("W",)) == 0.5
    with pytest.raises(NotImplementedError, match="gossip_step is what exercise ex04_3 asks.*Cells 4 of 04_gossip"):
        standin.call("ex04_3", "gossip_step", (None, 1.0, {}), ("comm", "x", "weights"))
    import networkx as nx
    monkeypatch.setattr("course_lib.gossip.mixing.metropolis_weights",
                        lambda G: standin.call("ex04_1", "metropolis_weights", (G,), ("G",)))
    with pytest.raises(NotImplementedError, match="calls the library's metropolis_weights"):
        standin.call("ex04_1", "metropolis_weights", (nx.path_graph(3),), ("G",))
    time.sleep(0.01)
    _notebook(nb, ["def mixing_rate(W):\n    raise NotImplementedError('ex04_2: The rate')\n"])
    with pytest.raises(NotImplementedError, match=r"^mixing_rate is what exercise ex04_2 .*save it after editing"):
        standin.call("ex04_2", "mixing_rate", (np.eye(3),), ("W",))
    # one value where the question has one (float(p)), many where the library draws a curve
    _notebook(tmp_path / "01_mapreduce_gd.ipynb",
              ["def comm_time(p, n_params, latency, bandwidth):\n"
               "    return 2 * latency + (float(p) * 8 * n_params + 8 * (n_params + 1)) / bandwidth\n"])
    monkeypatch.setattr("course_lib.mapreduce.cost.comm_time",
                        lambda *a: standin.call("ex01_4", "comm_time", a, ("p", "n_params", "latency", "bandwidth")))
    model = SpeedupModel(t_compute=1.0, latency=1e-3, bandwidth=1e6, n_params=10)
    got = model.communication(np.array([1, 2, 4]))
    assert got.shape == (3,) and np.allclose(got, [2e-3 + (8 * 10 * p + 88) / 1e6 for p in (1, 2, 4)])


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("candidates", "recorded"):
        # No candidate may start MPI: MPI_Init in a child that then ends with os._exit leaves
        # MPICH's shared-memory segment behind in /dev/shm. (No answer needs MPI.)
        sys.modules["mpi4py"] = None
        if sys.argv[1] == "recorded":
            sys.exit(recorded_main(sys.argv[2], sys.argv[3]))
        sys.exit(candidates_main(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python tests/test_release.py candidates SPEC.json OUT.json")


def test_without_an_exercise_notebook_the_stand_in_uses_mains_function(tmp_path, monkeypatch):
    """The grader's sandbox runs a submission's cells in its kernel's __main__ and has no
    exercises folder: the lesson's library code then runs on the function defined there."""
    import sys
    import types

    from course_lib import standin

    monkeypatch.setenv(standin.ENV, str(tmp_path / "nowhere"))
    monkeypatch.setattr(standin, "_found", {})
    main = types.ModuleType("__main__")
    exec("def mixing_rate(W):\n    return 0.25\n", main.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert standin.call("ex04_2", "mixing_rate", (None,), ("W",)) == 0.25
    # a name __main__ merely imported, or nothing at all, is not an answer
    monkeypatch.setattr(standin, "_found", {})
    main.mixing_rate = len
    with pytest.raises(NotImplementedError, match="mixing_rate is what exercise ex04_2 asks"):
        standin.call("ex04_2", "mixing_rate", (None,), ("W",))
