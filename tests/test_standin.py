"""The stand-in names its exercise on every failure path (course_lib/standin.py).

In the student release a library function that needs an answer runs the student's own function
from the exercise notebook. Whatever goes wrong on the way, the student reads which exercise is
concerned: no notebook at all, a notebook that is not JSON, a definition that raises when run, an
answer still holding its stub, an answer that raises (the error keeps its type and gains a note).
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from course_lib import standin


@pytest.fixture
def exercises(tmp_path, monkeypatch):
    monkeypatch.setenv(standin.ENV, str(tmp_path))
    monkeypatch.setattr(standin, "RECHECK_S", 0.0)
    monkeypatch.setattr(standin, "_cache", {})
    monkeypatch.setattr(standin, "_found", {})
    return tmp_path


def _write(folder, cells, name="04_gossip.ipynb"):
    (folder / name).write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": c}
                  for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def _call(qid="ex04_2", name="mixing_rate"):
    return standin.call(qid, name, (np.eye(2),), ("W",))


def test_no_exercise_notebook_names_the_exercise_and_where_it_looked(exercises):
    with pytest.raises(NotImplementedError, match=r"mixing_rate is what exercise ex04_2 .*No exercise notebook"):
        _call()


def test_a_stub_with_no_notebook_found_still_names_the_exercise(exercises, monkeypatch):
    """Where the function comes from __main__ (the grader's kernel) and still raises its stub, the
    message says what to solve (it used to fail with AttributeError on the missing path)."""
    import types

    main = types.ModuleType("__main__")
    exec("def mixing_rate(W):\n    raise NotImplementedError('ex04_2: The rate')\n", main.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(NotImplementedError, match=r"^mixing_rate is what exercise ex04_2 .*No exercise notebook"):
        _call()


def test_a_notebook_that_is_not_json_names_the_exercise(exercises):
    (exercises / "04_gossip.ipynb").write_text("{ not json")
    with pytest.raises(NotImplementedError, match=r"mixing_rate is what exercise ex04_2 .*Could not read"):
        _call()
    assert standin.state("ex04_2") == "not written"


def test_a_definition_that_raises_names_the_exercise(exercises):
    _write(exercises, ["SCALE = 1 / 0\n", "def mixing_rate(W):\n    return SCALE\n"])
    with pytest.raises(standin.ExerciseCodeError, match=r"mixing_rate \(exercise ex04_2\) could not be defined"):
        _call()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_an_answer_that_raises_keeps_its_type_and_gains_a_note_naming_the_exercise(exercises):
    _write(exercises, ["def mixing_rate(W):\n    raise ValueError('bad W')\n"])
    with pytest.raises(ValueError, match="bad W") as info:
        _call()
    assert any("exercise ex04_2" in note for note in info.value.__notes__)


def test_state_tells_written_from_stub(exercises):
    _write(exercises, ["def mixing_rate(W):\n    raise NotImplementedError('ex04_2: The rate')\n",
                       "def metropolis_weights(G):\n    return G\n"])
    assert standin.state("ex04_2") == "not written"
    assert standin.state("ex04_1") == "written"
    assert standin.state("ex04_3") == "not written"      # no def at all
    assert standin.exercise_file("ex04_1").endswith("04_gossip.ipynb")


def test_elementwise_uses_a_whole_array_answer_only_when_it_agrees_per_element(exercises):
    calls = []

    def vectorised(points, owners, key):
        calls.append(np.ndim(key))
        i = np.searchsorted(points, key)
        return np.asarray(owners)[np.where(i == len(points), 0, i)]

    def wrong_on_arrays(points, owners, key):      # a scalar answer that "works" on arrays, wrongly
        return np.zeros_like(key) if np.ndim(key) else int(owners[int(np.searchsorted(points, key)) % len(points)])

    points, owners, keys = np.array([10, 20, 30]), np.array([0, 1, 2]), np.arange(40)
    want = np.array([0] * 11 + [1] * 10 + [2] * 10 + [0] * 9)
    got = standin._elementwise(vectorised, (points, owners, keys), {}, 2)
    assert np.array_equal(got, want) and calls.count(1) == 1, "one call on the whole array"
    got = standin._elementwise(wrong_on_arrays, (points, owners, keys), {}, 2)
    assert np.array_equal(got, want), "an answer that disagrees per element is called per element"
