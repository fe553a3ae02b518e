"""The question registry.

Every exercise question has an id ``exNN_k`` (lesson ``NN``, question ``k``), a title, points
and checks. Visible checks live in ``course_lib/questions/exNN.py`` (shipped to students);
hidden checks live in ``tests/hidden/exNN.py`` (kept by the instructor). A check is a function
``fn(ns)`` of the student's notebook namespace that raises ``AssertionError("hint")`` when
the answer is wrong.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

QID_RE = re.compile(r"^ex(\d{2})_(\d+)$")

#: Package root of the repository (the folder that holds ``course_lib/``).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Default place of the instructor-only checks.
DEFAULT_HIDDEN_DIR = REPO_ROOT / "tests" / "hidden"


@dataclass
class Question:
    """One exercise question."""

    qid: str
    points: float
    title: str
    names: Sequence[str] = ()          # notebook names the checks need (functions, variables)
    timeout: float = 20.0              # seconds allowed to all its checks when grading (at most 20)
    # earlier questions whose student answers its checks run (its statement says so, and a failure
    # names them): a wrong answer to one of them may cost this question's points too
    builds_on: Sequence[str] = ()
    visible: List[Callable] = field(default_factory=list)
    hidden: List[Callable] = field(default_factory=list)

    @property
    def lesson(self) -> str:
        return lesson_of(self.qid)

    @property
    def statement(self) -> str:
        doc = self.visible[0].__doc__ if self.visible else None
        return (doc or self.title).strip()


#: The most seconds a question's checks (visible and hidden together) may take when grading.
MAX_QUESTION_TIMEOUT = 20.0

_REGISTRY: Dict[str, Question] = {}
_PENDING_HIDDEN: Dict[str, List[Callable]] = {}


def lesson_of(qid: str) -> str:
    """``"ex00_1" -> "00"``; raises ValueError on a malformed id."""
    m = QID_RE.match(qid)
    if not m:
        raise ValueError(f"{qid!r} is not a question id; ids look like 'ex00_1' (lesson 00, question 1)")
    return m.group(1)


def qid_key(qid: str):
    """Sort key: lesson, then question number (ex00_10 after ex00_2)."""
    m = QID_RE.match(qid)
    return (int(m.group(1)), int(m.group(2))) if m else (10**6, 0)


def question(qid: str, points: float = 1, title: str = "", names: Sequence[str] = (), timeout: float = 20.0,
             builds_on: Sequence[str] = ()):
    """Decorator registering a visible check as question ``qid``.

    Several functions may be decorated with the same ``qid``: they all become visible checks
    of that question (the first one carries the points, title and statement).
    """
    lesson_of(qid)
    if not 0 < timeout <= MAX_QUESTION_TIMEOUT:
        raise ValueError(f"{qid}: a question's checks get at most {MAX_QUESTION_TIMEOUT:g} s, not {timeout!r} "
                         "(so that a hanging answer costs little)")

    def deco(fn):
        q = _REGISTRY.get(qid)
        if q is None:
            q = Question(qid=qid, points=points, title=title or qid, names=tuple(names), timeout=timeout,
                         builds_on=tuple(builds_on))
            q.hidden.extend(_PENDING_HIDDEN.pop(qid, []))
            _REGISTRY[qid] = q
        if fn not in q.visible:
            q.visible.append(fn)
        return fn

    return deco


#: What a hidden check's failure says when the check names no property of its own.
GENERIC_PROPERTY = "the answer differs from the expected one"


class HiddenFailure(AssertionError):
    """A hidden check's failure as the student sees it: the kind of case and the property that
    failed, ``"hidden check (<case>): <property>"``, never the hidden inputs or the expected values.

    A hidden check may raise it itself, ``raise HiddenFailure("fails when n is not a multiple of p")``
    (a short phrase that names no input or value), or mark a block with :func:`hidden_property`;
    any other ``AssertionError`` it raises becomes one with :data:`GENERIC_PROPERTY`. ``detail``
    keeps the check's original message (inputs, expected and got) for the instructor; ``case`` is
    the kind of case the check declared."""

    def __init__(self, property: str = GENERIC_PROPERTY, detail: str = "", case: str = ""):
        self.property, self.detail, self.case = property.strip() or GENERIC_PROPERTY, detail, case
        super().__init__(self._text())

    def _text(self) -> str:
        return f"hidden check ({self.case}): {self.property}" if self.case else self.property


#: Failures every kind of case shares, named by what they are whatever the block: (a phrase of the
#: visible check's own message, the property the student reads).
SHARED_FAILURES = (
    ("changed its argument `", "changes one of its arguments in place"),
    ("should do this question's work itself", "calls a course library function that does this question's work"),
)


class hidden_property:
    """``with hidden_property("wrong when the hosts are not sorted by name"):`` in a hidden check: an
    ``AssertionError`` raised in the block fails the check with that phrase as its property (the
    block's own message, with the inputs in it, is kept as the ``detail``).

    Unless the message shows one of the :data:`SHARED_FAILURES` (an argument changed in place, a
    library helper called): then that is the property. ``parts`` names which part of a check
    failed: ``(phrase of the check's message, what to add)`` pairs, the first whose phrase is in
    the message adds ``": <what>"`` to the property."""

    def __init__(self, property: str, parts=()):
        self.property, self.parts = property, tuple(parts)

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None or not issubclass(kind, AssertionError) or isinstance(exc, HiddenFailure):
            return False
        text = str(exc)
        shared = next((phrase for key, phrase in SHARED_FAILURES if key in text), None)
        part = next((what for key, what in self.parts if key in text), None)
        prop = shared or (f"{self.property}: {part}" if part else self.property)
        # a formula question's failure carries the expected value for the instructor in its detail
        raise HiddenFailure(prop, detail=getattr(exc, "detail", "") or text) from None


def named_kinds(phrases: dict, otherwise: str):
    """``within=`` for a visible assert run by a hidden check: an assertion of kind ``k`` fails with
    the property ``phrases[k]`` ("changes its input in place"), any other kind with ``otherwise``."""
    return lambda kind: hidden_property(phrases.get(kind, otherwise))


def _hide_inputs(fn: Callable, case: str, qid: str) -> Callable:
    """``fn`` whose ``AssertionError`` says only ``hidden check (<case>): <property>``."""

    @functools.wraps(fn)
    def hidden(ns):
        try:
            return fn(ns)
        except HiddenFailure as exc:
            raise HiddenFailure(exc.property, detail=exc.detail or str(exc), case=case) from None
        except AssertionError as exc:
            raise HiddenFailure(GENERIC_PROPERTY, detail=getattr(exc, "detail", "") or str(exc), case=case) from None

    hidden.case, hidden.qid = case, qid
    return hidden


def hidden_check(qid: str, case: str = ""):
    """Decorator registering an instructor-only check of question ``qid``.

    ``case`` names the kind of case the check tests, in words that give away no input ("clocks of
    three ranges, not sorted", "n not a multiple of p"). A failure of the check reaches the student
    as ``hidden check (<case>): <property>`` (see :class:`HiddenFailure`); the check's own message,
    which may carry the hidden inputs and the expected answer, stays on the exception as ``detail``.
    """
    lesson_of(qid)
    if not case or not isinstance(case, str):
        raise ValueError(f"@hidden_check({qid!r}) needs case=\"...\": the kind of case it tests, which is all "
                         "a student learns of it when it fails")

    def deco(fn):
        wrapped = _hide_inputs(fn, case, qid)
        q = _REGISTRY.get(qid)
        target = q.hidden if q is not None else _PENDING_HIDDEN.setdefault(qid, [])
        if all(f.__qualname__ != fn.__qualname__ or f.__module__ != fn.__module__ for f in target):
            target.append(wrapped)
        return fn

    return deco


def available_lessons() -> List[str]:
    """Lessons that have a ``course_lib/questions/exNN.py`` module."""
    import course_lib.questions as pkg

    out = []
    for info in pkgutil.iter_modules(pkg.__path__):
        m = re.match(r"^ex(\d{2})$", info.name)
        if m:
            out.append(m.group(1))
    return sorted(out)


def load_lesson(lesson: str, hidden_dir: Optional[Path] = None, with_hidden: bool = False) -> List[Question]:
    """Import the visible (and optionally hidden) checks of a lesson; return its questions in order."""
    try:
        importlib.import_module(f"course_lib.questions.ex{lesson}")
    except ModuleNotFoundError as e:
        if e.name == f"course_lib.questions.ex{lesson}":
            missing = f"course_lib/questions/ex{lesson}.py is missing"
            raise LookupError(f"no questions for lesson {lesson} ({missing})") from None
        raise
    if with_hidden:
        _load_hidden(lesson, Path(hidden_dir) if hidden_dir else DEFAULT_HIDDEN_DIR)
    return sorted((q for q in _REGISTRY.values() if q.lesson == lesson), key=lambda q: qid_key(q.qid))


_LOADED_HIDDEN = set()


def _load_hidden(lesson: str, hidden_dir: Path) -> None:
    path = hidden_dir / f"ex{lesson}.py"
    key = str(path.resolve())
    if key in _LOADED_HIDDEN or not path.exists():
        return
    spec = importlib.util.spec_from_file_location(f"_course_hidden_ex{lesson}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _LOADED_HIDDEN.add(key)


def get_question(qid: str) -> Question:
    """The registered question ``qid`` (imports its lesson's visible checks)."""
    lesson = lesson_of(qid)
    if qid not in _REGISTRY:
        load_lesson(lesson)
    if qid not in _REGISTRY:
        known = ", ".join(q.qid for q in load_lesson(lesson)) or "none"
        raise LookupError(f"unknown question {qid!r}; lesson {lesson} has: {known}")
    return _REGISTRY[qid]


def all_questions() -> List[Question]:
    """Every question of every lesson (visible checks only are imported)."""
    out = []
    for lesson in available_lessons():
        out.extend(load_lesson(lesson))
    return out
