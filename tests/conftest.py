"""Shared pytest hooks and fixtures.

Exercises: one marker per question id (``pytest -m ex00_1``), and ``--notebooks DIR`` to say
which notebooks the per-question tests grade (default: ``solutions/`` when it exists, else
``exercises/``; students run ``pytest -m ex00_1 --notebooks exercises``).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

# nbformat imports jsonschema, whose format checker imports rfc3987_syntax when it is installed
# (JupyterLab's jupyter-events brings it), and that module builds 38 parsers when imported: about
# 1.3 s in every test process. The tests validate no IRI, so it is left out of the test processes
# (jsonschema skips a format whose module does not import); kernels and servers are not affected.
sys.modules.setdefault("rfc3987_syntax", None)

from common import ExecutedNotebook, execute_notebook  # noqa: E402 - after the line above

#: mpi4py's own unittest files, run on a Cluster by tests/test_mpi4py_contract.py, not by pytest.
collect_ignore = ["mpi4py_suite"]


@pytest.fixture(scope="session")
def student_release(tmp_path_factory):
    """(a student release without recordings, a folder holding the solutions as a student's
    exercises), built once per test process. The lessons run there (``executed_notebook``), and
    each run's recording is written into it by the release tests (tests/test_release_lessons.py)."""
    import shutil

    from course_lib.release import build

    from common import SOLUTIONS

    root = build(tmp_path_factory.mktemp("release") / "course", archive=False)
    solved = tmp_path_factory.mktemp("solved")
    for path in SOLUTIONS.glob("*.ipynb"):     # a copy: the run must not see edits made meanwhile
        shutil.copy(path, solved / path.name)
    return root, solved


@pytest.fixture(scope="session")
def executed_notebook(student_release):
    """``executed_notebook(path, start_method="default")``: the notebook executed headless once
    per test process, shared by every test that checks it. A lesson notebook runs as a student
    who has solved every exercise runs it: in the student release, its stand-ins running the
    solutions' answers (``common.execute_as_student``), which is also the lesson's recording; any
    other notebook runs with this checkout's library. Tests of one notebook carry
    ``pytest.mark.xdist_group(<notebook stem>)`` so that, under ``pytest -n``, one process runs
    them all and the notebook executes once."""
    from course_lib import lessons

    from common import NOTEBOOKS, execute_as_student

    by_notebook = {lesson.notebook: lesson for lesson in lessons.LESSONS}
    runs: dict[tuple[Path, str], ExecutedNotebook] = {}

    def get(path: Path, start_method: str = "default") -> ExecutedNotebook:
        key = (Path(path), start_method)
        if key not in runs:
            if key[0].parent == NOTEBOOKS and key[0].name in by_notebook:
                release, solved = student_release
                runs[key] = execute_as_student(release, by_notebook[key[0].name], solved, start_method)
            else:
                runs[key] = execute_notebook(*key)
        return runs[key]

    return get


@pytest.fixture(scope="module")
def ran(executed_notebook, request) -> ExecutedNotebook:
    """The notebook named by the test module's ``NOTEBOOK``, executed once (tests/test_lessonNN.py)."""
    return executed_notebook(request.module.NOTEBOOK)


@pytest.fixture(autouse=True)
def _note_the_children_alive_before_the_test():
    """What a test may leave behind is judged against the processes alive when it began: a
    cluster that a module fixture keeps open is not an orphan of the test (under pytest-xdist a
    file's tests interleave with its module fixtures' lifetimes)."""
    import runtime_checks

    runtime_checks.ALIVE_BEFORE_TEST = runtime_checks.children_now()
    yield


@pytest.fixture(scope="module")
def cluster5():
    """Five workers, started once per test module that asks for them."""
    import course_lib as cl

    with cl.Cluster(5) as cluster:
        yield cluster


@pytest.fixture(scope="module", params=["fork", "spawn", "forkserver"])
def cluster3(request):
    """Three workers per start method, started once per test module, and nothing left behind; a run
    may take 20 s (what the waits of a rank that left hung until, before it was reported)."""
    import course_lib as cl

    import runtime_checks

    with cl.Cluster(3, start_method=request.param, timeout=20) as cluster:
        yield cluster
    runtime_checks.assert_clean()


def pytest_addoption(parser):
    parser.addoption("--notebooks", default=None,
                     help="folder of NN_name.ipynb notebooks graded by the per-question tests "
                          "(default: solutions/, else exercises/)")
    parser.addoption("--lesson", default=None, metavar="NN",
                     help="only one lesson's tests: its library and notebook test files (the manifest's "
                          "`tests`), its notebook's run and claims, and its questions' checks and fixtures "
                          "(`make test LESSON=04`)")


# Files whose tests are parametrized over lessons or questions: under --lesson, their tests of that
# lesson only (read from the test's id: the notebook stem "04_gossip", the question "ex04_2", "[04]").
# The release's lessons are left out: its fixture executes all nine lessons first.
_PER_LESSON_FILES = {"test_notebooks.py", "test_claims.py", "test_checks.py", "test_grading.py",
                     "test_graded_alone.py", "test_core_counts.py", "test_feedback_details.py"}


def _belongs_to_lesson(item, number: str) -> bool:
    from course_lib import lessons

    if item.path.name in lessons.lesson(number).tests:
        return True
    if item.path.name not in _PER_LESSON_FILES or "[" not in item.nodeid:
        return False
    params = item.nodeid[item.nodeid.index("["):]
    return re.search(rf"(?<![0-9])(ex)?{number}(_|\]|-)", params) is not None


def _select_lesson(config, items) -> None:
    number = config.getoption("lesson")
    if not number:
        return
    keep = [item for item in items if _belongs_to_lesson(item, number)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


# `make test-fast` leaves out what is marked slow: tests that run notebooks, the grader (sandboxed
# or in-process over every answer fixture), real mpiexec jobs or 64 workers. These fixtures and
# files make a test slow wherever it is.
_SLOW_FIXTURES = {"executed_notebook", "batch", "lesson_grades", "transcripts"}
_SLOW_FILES = {"test_grading.py", "test_checks.py", "test_mpi.py"}


# Tests that read the grader's batch (test_grading.py) run in one process, which grades it once.
_BATCH_FIXTURES = {"batch", "lesson_grades"}


# Tests that compare measured time with a model carry @pytest.mark.timing where they are defined:
# `make test` runs them alone, after the parallel tests. The notebooks are not among them: what
# their text says about their own timings is a verdict read from the run (course_lib.claims), true
# on a busy machine as on a quiet one, and their time budget scales with the load measured during
# the run (tests/common.py, loaded_budget).


def _notebook_of(item) -> str | None:
    """The stem of the lesson notebook a test executes or reads, if any."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if item.originalname == "test_lesson_notebook_executes":
        return Path(params["path"]).stem
    if "ran" in getattr(item, "fixturenames", ()):
        return Path(item.module.NOTEBOOK).stem
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    _select_lesson(config, items)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if _SLOW_FIXTURES & fixtures or item.path.name in _SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if _BATCH_FIXTURES & fixtures:
            item.add_marker(pytest.mark.xdist_group("grading"))
        notebook = _notebook_of(item)
        if notebook:  # under -n, one process executes the notebook once for all the tests that read it
            item.add_marker(pytest.mark.xdist_group(notebook))
        elif not item.get_closest_marker("xdist_group"):
            _group_by_module_fixture(item)


def _group_by_module_fixture(item) -> None:
    """Tests that share a module-scoped fixture (a cluster per start method, a module's training
    runs) run in one test process, which builds the fixture once: spread over the processes, each
    would build it again (about 30 s of worker time in the whole suite)."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info else None
        if defs and defs[-1].scope == "module":
            item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}:{name}"))
            return


def pytest_configure(config):
    try:
        from course_lib.grading import all_questions

        questions = all_questions()
    except Exception:  # noqa: BLE001 - a broken question module must not hide every other test
        questions = []
    for q in questions:
        config.addinivalue_line("markers", f"{q.qid}: exercise question {q.qid}, {q.title}")
