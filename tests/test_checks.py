"""The checks of every question, run in this process (no sandbox): right, strict and fair.

For each question: the solution passes its visible and hidden checks, the exercise stub scores 0
as "not implemented", every wrong answer in ``tests/fixtures/wrong_answers`` fails its question
(and touches no other), every answer in ``tests/fixtures/correct_alternatives`` passes. A
notebook's namespace is built by executing its definition cells in order (imports, ``def`` and
``class`` cells; no demos, no ``check()`` calls), once per lesson; a fixture re-executes only the
cell that holds its region. ``pytest -m ex00_1 tests/test_checks.py`` runs one question.

The sandboxed grader (``tests/test_grading.py``) grades the same fixtures end to end.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from course_lib.grading import all_questions, load_lesson, run_question
from course_lib.grading.regions import BEGIN_RE, lesson_of_path, replace_region_in_notebook
from course_lib.grading.registry import DEFAULT_HIDDEN_DIR, GENERIC_PROPERTY, get_question
from course_lib.reference import QUESTIONS as REFERENCE_QUESTIONS

from common import EXERCISES, FIXTURES, REPO, SOLUTIONS, expected_points, fixture_header

QUESTIONS_DIR = REPO / "course_lib" / "questions"
WRONG = sorted((FIXTURES / "wrong_answers").glob("ex[0-9][0-9]_*__*.py"))
CORRECT = sorted((FIXTURES / "correct_alternatives").glob("ex[0-9][0-9]_*__*.py"))
# COURSE_TEST_LESSONS=00,01 limits this file to some lessons (default: every solution notebook).
_ONLY = [s.strip() for s in os.environ.get("COURSE_TEST_LESSONS", "").split(",") if s.strip()]
LESSONS = sorted(lesson_of_path(p) for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb") if not _ONLY or p.name[:2] in _ONLY)
WRONG = [p for p in WRONG if p.name[2:4] in LESSONS]
CORRECT = [p for p in CORRECT if p.name[2:4] in LESSONS]

#: Functions that compute what a question asks for: none may be defined or imported by a
#: visible-check module (they ship to students). Question names, then the library's own copies.
ANSWER_NAMES = {
    "sum_shard", "fit_latency_bandwidth", "ring_pass",
    "full_gradient", "map_gradient", "reduce_update", "comm_time", "speedup_table",
    "ring_allreduce", "rd_allgather", "merge_stats", "ring_allreduce_time",
    "apply_update", "staleness_aware_lr", "hogwild_worker", "expected_wait",
    "metropolis_weights", "mixing_rate", "gossip_step", "iterations_to_reach",
    "ring_lookup", "may_read", "significantly_modified", "merge_clocks",
    "column_parallel_forward", "row_parallel_forward", "row_parallel_backward", "predicted_bubble",
    "measured_bubble",
    # library implementations of the same answers
    "metropolis_hastings", "expected_backup_wait", "bubble_formula", "iterations_to_eps", "spectrum",
    "serial_sparse_sgd", "timed_worker", "locked_worker", "harmonic", "merge_all", "local_stats",
    "gossip_reference", "neighbor_weights", "_expected_mh", "reference_gradient", "reference_comm_time",
    "gradient", "map_shard", "reduce_results", "gd_update", "simulate", "tp_mlp_step",
    "column_parallel_backward", "ring_lambda2", "star_lambda2", "arc_of", "ssp_violations", "_coalesce",
    "words_per_iteration", "bytes_per_iteration", "_round_robin",
} | set(REFERENCE_QUESTIONS.values())   # and every answer the reference table names, 00 to the last lesson


def _qparam(qid):
    return pytest.param(qid, marks=getattr(pytest.mark, qid), id=qid)


def _fparam(path):
    qid = path.name.split("__")[0]
    return pytest.param(path, marks=getattr(pytest.mark, qid), id=path.stem)


QIDS = [q.qid for q in all_questions() if q.lesson in LESSONS]


# -- namespaces ------------------------------------------------------------------------------

def _calls_check(tree) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "check"
               for n in ast.walk(tree))


def definition_cell(source: str) -> bool:
    """A cell to execute: only imports and definitions at top level, no ``check()`` call."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    return bool(tree.body) and all(isinstance(s, kinds) for s in tree.body) and not _calls_check(tree)


def execute(ns: dict, source: str, where: str) -> None:
    exec(compile(source, where, "exec"), ns)


class Lesson:
    """One lesson's solution notebook, its executed namespace and the solution's results."""

    def __init__(self, lesson: str):
        self.lesson = lesson
        self.path = next(SOLUTIONS.glob(f"{lesson}_*.ipynb"))
        self.nb = nbformat.read(self.path, as_version=4)
        self.questions = {q.qid: q for q in load_lesson(lesson, hidden_dir=DEFAULT_HIDDEN_DIR, with_hidden=True)}
        self.ns = self.namespace(self.nb, self.path.name)
        self.results = {}

    @staticmethod
    def namespace(nb, name) -> dict:
        ns = {"__name__": "__main__"}
        for k, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and definition_cell(cell.source):
                execute(ns, cell.source, f"<{name} cell {k}>")
        return ns

    def with_body(self, qid: str, body: str) -> dict:
        """The solution's namespace with the region of ``qid`` replaced by ``body``."""
        nb = replace_region_in_notebook(self.nb, qid, body)
        ns = dict(self.ns)
        cells = [k for k, c in enumerate(self.nb.cells) if c.cell_type == "code"
                 and any((m := BEGIN_RE.match(line)) and m.group("qid") == qid for line in c.source.splitlines())]
        for k in cells:
            execute(ns, nb.cells[k].source, f"<{qid} fixture, cell {k}>")
        return ns

    def solution_result(self, qid: str):
        if qid not in self.results:
            q = self.questions[qid]
            self.results[qid] = run_question(q, self.ns, hidden=True, timeout=q.timeout)
        return self.results[qid]


_LESSONS: dict = {}


def lesson(lesson_id: str) -> Lesson:
    if lesson_id not in _LESSONS:
        _LESSONS[lesson_id] = Lesson(lesson_id)
    return _LESSONS[lesson_id]


def changed_names(before: dict, after: dict) -> set:
    return {k for k in after if not k.startswith("__") and (k not in before or after[k] is not before[k])}


def describe(res) -> str:
    return f"{res.qid}: {res.status}, {res.points}/{res.max_points} points, {res.elapsed:.2f} s: {res.message}"


# -- every question --------------------------------------------------------------------------

@pytest.mark.parametrize("qid", [_qparam(q) for q in QIDS])
def test_solution_passes_visible_and_hidden_checks(qid):
    res = lesson(qid[2:4]).solution_result(qid)
    assert res.status == "passed", describe(res) + "\n" + res.traceback


@pytest.mark.parametrize("qid", [_qparam(q) for q in QIDS])
def test_exercise_stub_is_not_implemented(qid):
    les = lesson(qid[2:4])
    if not hasattr(les, "stub_ns"):
        ex = nbformat.read(EXERCISES / les.path.name, as_version=4)
        les.stub_ns = Lesson.namespace(ex, les.path.name)
    q = les.questions[qid]
    res = run_question(q, les.stub_ns, hidden=True, timeout=q.timeout)
    assert res.status == "not_implemented" and res.points == 0, describe(res)


def _fixture_expectations(path: Path, qid: str, full: bool):
    les = lesson(qid[2:4])
    want = {k: q.points for k, q in les.questions.items()}
    if not full:
        want[qid] = 0.0
    got = expected_points(path)
    assert got == want, f"{path.name}: its '# expect:' header should list every question of lesson {qid[2:4]}: {want}"
    return les


@pytest.mark.parametrize("path", [_fparam(p) for p in WRONG])
def test_wrong_answer_fails_its_question_only(path):
    qid = path.name.split("__")[0]
    les = _fixture_expectations(path, qid, full=False)
    q = les.questions[qid]
    ns = les.with_body(qid, path.read_text())
    assert changed_names(les.ns, ns) <= set(q.names), "the fixture changes other names than its question's"
    res = run_question(q, ns, hidden=True, timeout=q.timeout)
    assert res.points == 0 and res.status != "passed", describe(res)
    assert res.message and "does not have the form" not in res.message and "no hint" not in res.message, describe(res)
    for spec in fixture_header(path).get("expect-message", []):   # "# expect-message: ex06_1 ~ wrong axis"
        want_qid, _, needle = (s.strip() for s in spec.partition("~"))
        assert want_qid == qid and needle.lower() in res.message.lower(), (
            f"{path.name}: {needle!r} not in {describe(res)}")
    for k in les.questions:            # the others are untouched: their functions are the solution's
        if k != qid:
            assert les.solution_result(k).passed, describe(les.solution_result(k))


@pytest.mark.parametrize("path", [_fparam(p) for p in CORRECT])
def test_correct_alternative_passes(path):
    qid = path.name.split("__")[0]
    les = _fixture_expectations(path, qid, full=True)
    q = les.questions[qid]
    ns = les.with_body(qid, path.read_text())
    assert changed_names(les.ns, ns) <= set(q.names)
    res = run_question(q, ns, hidden=True, timeout=q.timeout)
    assert res.status == "passed", describe(res) + "\n" + res.traceback


@pytest.mark.parametrize("qid", [_qparam(q) for q in QIDS])
def test_every_question_has_fixtures(qid):
    wrong = [p.name for p in WRONG if p.name.startswith(qid + "__")]
    right = [p.name for p in CORRECT if p.name.startswith(qid + "__")]
    assert len(wrong) >= 2, f"{qid}: needs two typical wrong answers in tests/fixtures/wrong_answers, has {wrong}"
    assert len(right) >= 1, f"{qid}: needs a correct alternative in tests/fixtures/correct_alternatives"


def test_fixtures_name_known_questions():
    known = {q.qid for q in all_questions()}
    stray = [p.name for p in WRONG + CORRECT if p.name.split("__")[0] not in known]
    assert not stray, stray


@pytest.mark.parametrize("qid", [_qparam(q) for q in QIDS])
def test_time_limit_is_at_most_20_s(qid):
    assert get_question(qid).timeout <= 20


# -- visible checks ship to students: no answer in them ----------------------------------------

def _answer_references(path: Path) -> list:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in ANSWER_NAMES:
            found.append(f"line {node.lineno}: defines {node.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod.startswith("course_lib.reference") or mod == "course_lib" and any(
                    a.name == "reference" for a in node.names):
                found.append(f"line {node.lineno}: imports {mod}")
            found += [f"line {node.lineno}: imports {a.name} from {mod}" for a in node.names if a.name in ANSWER_NAMES]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names
                      if a.name.startswith("course_lib.reference")]
        elif isinstance(node, ast.Attribute) and node.attr in ANSWER_NAMES:
            found.append(f"line {node.lineno}: uses .{node.attr}")
    return found


@pytest.mark.parametrize("path", [p for p in sorted(QUESTIONS_DIR.glob("*.py"))
                                  if not p.name.startswith("ex") or p.name[2:4] in LESSONS], ids=lambda p: p.name)
def test_visible_checks_contain_no_answer(path):
    found = _answer_references(path)
    assert not found, f"{path.name} computes answers: {found}"


def test_the_answer_scan_finds_answers(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from course_lib.reference.ex04 import metropolis_hastings\n"
                   "from course_lib.gossip.mixing import metropolis_hastings as mh\n"
                   "import course_lib.ps.ring as r\nx = r.ring_lookup\n"
                   "def _expected_mh(G):\n    pass\n")
    lines = {int(f.split(":")[0].split()[1]) for f in _answer_references(bad)}
    assert lines == {1, 2, 4, 5}


# -- hidden checks name the kind of case and the property, never the hidden inputs ------------------

HIDDEN_MESSAGE = re.compile(r"^On the grader's own inputs: hidden check \((?P<case>[^()]*(?:\([^()]*\)[^()]*)*)\): "
                            r"(?P<property>.+)$", re.S)


def _numbers(text: str) -> set:
    return set(re.findall(r"\d+(?:\.\d+)?", text))


@pytest.mark.parametrize("qid", [_qparam(q) for q in QIDS])
def test_every_hidden_check_declares_its_case(qid):
    q = lesson(qid[2:4]).questions[qid]
    assert q.hidden, f"{qid} has no hidden check"
    for fn in q.hidden:
        assert getattr(fn, "case", ""), f"{qid}: hidden check {fn.__name__} declares no case"


@pytest.mark.parametrize("path", [_fparam(p) for p in WRONG])
def test_hidden_feedback_gives_away_no_hidden_input(path):
    """A wrong answer run through its question's hidden checks alone: the message names the case and the
    property ("hidden check (<case>): <property>"), and holds no number that the case does not."""
    qid = path.name.split("__")[0]
    les = lesson(qid[2:4])
    q = les.questions[qid]
    only_hidden = dataclasses.replace(q, visible=[], hidden=list(q.hidden))
    res = run_question(only_hidden, les.with_body(qid, path.read_text()), hidden=True, timeout=q.timeout)
    if res.status != "failed":
        pytest.skip(f"the hidden checks end in {res.status} here (their own message: {res.message[:80]!r})")
    m = HIDDEN_MESSAGE.match(res.message)
    assert m, f"{path.name}: a hidden check's message should be 'hidden check (<case>): <property>': {res.message!r}"
    assert m.group("case") in {fn.case for fn in q.hidden}, res.message
    leaked = _numbers(m.group("property")) - _numbers(m.group("case"))
    assert not leaked, f"{path.name}: the hidden check's message carries the numbers {leaked}: {res.message!r}"
    assert not res.traceback, res.traceback
    assert m.group("property") != GENERIC_PROPERTY, (
        f"{path.name}: the hidden check should name the property that failed (a `with hidden_property(...)` "
        f"block around its assertion), not '{GENERIC_PROPERTY}'")


def _merge_cases(text: str):
    """(a, b) -> merged clock, from each 'merging a = ... and b = ... should give ..., got' in ``text``."""
    found = {}
    for m in re.finditer(r"merging a = (\[.*?\]) and b = (\[.*?\]) should give (\[.*?\]), got", text):
        try:
            a, b, want = (ast.literal_eval(g) for g in m.groups())
        except (ValueError, SyntaxError):     # cut short ("...")
            continue
        found[repr((a, b))] = want
    return found


def _lookup_attack(reveal):
    """The attack of issue 29: answer every case seen in earlier feedback from a table, anything else
    wrongly, submit again and learn the case that failed next. ``reveal(exc)`` is the text a failure
    shows. Returns (the table's last answer, the number of cases it learned)."""
    from course_lib.grading.student import LocalCode

    q = lesson("05").questions["ex05_4"]
    table = {}

    def merge_clocks(a, b):
        key = repr(([(int(lo), int(hi), [int(x) for x in v]) for lo, hi, v in a],
                    [(int(lo), int(hi), [int(x) for x in v]) for lo, hi, v in b]))
        return [(lo, hi, np.array(v)) for lo, hi, v in table.get(key, [])]

    for _ in range(40):                             # 11 submissions were enough before
        try:
            for check in list(q.visible) + list(q.hidden):
                check(LocalCode({"merge_clocks": merge_clocks}))
            return True, len(table)
        except AssertionError as exc:
            learned = _merge_cases(reveal(exc))
            if not set(learned) - set(table):
                return False, len(table)
            table.update(learned)
    return False, len(table)


def test_a_lookup_table_of_feedback_does_not_pass_ex05_4():
    passed, learned = _lookup_attack(str)                  # what the student sees
    assert not passed, "a lookup table built from ex05_4's feedback passes its hidden checks"
    # the instructor's detail holds the inputs, as every message did before: it would have passed
    passed_detail, learned_detail = _lookup_attack(lambda exc: getattr(exc, "detail", "") or str(exc))
    assert learned_detail > learned, (learned, learned_detail)
