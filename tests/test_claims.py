"""Claims as data (course_lib/claims.py): what each lesson says about its own run is checked on
that run by one generic test per notebook; the API itself is tested on records made here.

Facts must hold on any machine; a verdict (a sentence about timings, which depend on the machine's
load) must be the sentence its own recorded numbers support.
"""
from __future__ import annotations

import io
from contextlib import redirect_stdout

import numpy as np
import pytest

from course_lib import claims, lessons
from course_lib.claims import at_most, between, claim, close, equal, less, verdict

from common import NOTEBOOKS

LESSON_PATHS = [NOTEBOOKS / lesson.notebook for lesson in lessons.LESSONS]


def _recorded(monkeypatch, fn, *args, **numbers) -> tuple[object, dict, str]:
    """Call ``claim``/``verdict`` outside IPython; (its return value, the record it shows, the text)."""
    shown = []
    monkeypatch.setattr(claims, "_show", lambda text, record: shown.append((text, record)))
    result = fn(*args, **numbers)
    (text, record), = shown
    return result, record, text


def test_a_fact_is_shown_with_its_verdict_and_its_own_numbers(monkeypatch):
    holds, record, text = _recorded(monkeypatch, claim, "{sent} bytes = 2(p-1)/p n = {formula}",
                                    equal(np.int64(192), 192), sent=np.int64(192), formula=192)
    assert holds and text == "\u2713 192 bytes = 2(p-1)/p n = 192" and claims.problems(record) == []
    holds, record, text = _recorded(monkeypatch, claim, "{a} < {b}", less(3, 2), a=3, b=2)
    assert not holds and text.startswith("\u2717 does not hold on this run: 3 < 2")
    assert claims.problems(record) == ["the fact does not hold on this run"]


def test_a_verdict_prints_the_sentence_its_numbers_support(monkeypatch):
    for t_free, expected in ((0.08, "faster (0.08 s against 0.10 s)"), (0.12, "slower (0.12 s against 0.10 s)")):
        _, record, text = _recorded(monkeypatch, verdict, less(t_free, 0.10), "faster ({a:.2f} s against {b:.2f} s)",
                                    "slower ({a:.2f} s against {b:.2f} s)", a=t_free, b=0.10)
        assert text == expected and claims.problems(record) == []


def test_a_record_that_disagrees_with_its_numbers_is_found(monkeypatch):
    shown = []
    monkeypatch.setattr(claims, "_show", lambda text, record: shown.append(record))
    verdict(less(1.0, 2.0), "a {x}", "b {x}", x=1)
    claim("{x} is one", equal(1, 1), x=1)
    forged_verdict = dict(shown[0], text="b 1")                     # the other sentence than the numbers give
    assert "support 'a 1'" in claims.problems(forged_verdict)[0]
    forged_numbers = dict(shown[0], check={"op": "<", "args": [3.0, 2.0], "rel": 0.0})
    assert any("recomputes to False" in p for p in claims.problems(forged_numbers))
    forged_claim = dict(shown[1], numbers={"x": 2})
    assert any("numbers give '2 is one'" in p for p in claims.problems(forged_claim))


def test_comparisons_and_bad_input():
    assert at_most(2, 2).holds() and not less(2, 2).holds()
    assert close(1.0, 1.05, rel=0.05).holds() and not close(1.0, 1.2, rel=0.05).holds()
    assert between(0.5, 0, 1).holds() and not between(1.5, 0, 1).holds()
    with pytest.raises(TypeError, match="real number"):
        less("3", 2)
    with pytest.raises(ValueError, match="NaN"):
        less(float("nan"), 2)
    with pytest.raises(TypeError, match="Compare"):
        verdict(True, "a", "b")
    with pytest.raises(TypeError, match="Compare .* or a bool"):
        claim("x", 3)


def test_outside_jupyter_a_claim_is_printed():
    out = io.StringIO()
    with redirect_stdout(out):
        assert claim("all {n} equal", np.bool_(True), n=3)
    assert out.getvalue() == "\u2713 all 3 equal\n"


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=pytest.mark.xdist_group(p.stem))
                                  for p in LESSON_PATHS])
def test_every_claim_of_the_lesson_holds_on_its_own_run(path, executed_notebook):
    ran = executed_notebook(path)
    recorded = claims.records(ran.notebook)
    assert recorded, f"{path.name} states no claim through course_lib.claims"
    wrong = {r["text"]: claims.problems(r) for r in recorded if claims.problems(r)}
    assert not wrong, f"{path.name}: {wrong}"
