"""Lesson 05: what the claims API cannot say about the notebook's run.

Every sentence the notebook prints about its own run (counted keys, bytes and messages, the SSP
invariant on every read, the vector clock rebuilt from the push logs, the join, the killed server
and worker, the models equal to their single-process baselines, and the timings on the emulated
network) is stated through course_lib.claims and checked on that run by tests/test_claims.py
(``-k 05_parameter``): facts must hold, timing verdicts must be the sentence their own numbers
give. What is left here: the Markdown (the time budget: tests/test_notebooks.py).
"""
from __future__ import annotations

import pytest

from common import NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "05_parameter_server_internals.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_the_text_states_what_the_runs_measure(ran):
    """A join moves about K/(S+1) keys (not K/S, which is what a leave moves); the KKT filter is not
    said to cost nothing (its final model differs from the unfiltered run's)."""
    assert "K / (S + 1)" in ran.markdown and "about `K / S` keys, where" not in ran.markdown
    assert "cost nothing" not in ran.markdown
