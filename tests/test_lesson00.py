"""Lesson 00: what the notebook says about its own run is stated through course_lib.claims and
checked by tests/test_claims.py (facts hold; each verdict is the sentence its numbers support).
This file keeps what no sentence states: the notebook runs headless, without errors, within the
budget."""
from __future__ import annotations

import pytest

from common import LOADED_BUDGET_S, NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "00_cluster_in_your_laptop.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_runs_headless_without_errors_within_the_budget(ran):
    assert ran.errors == []
    assert ran.seconds < LOADED_BUDGET_S, f"lesson 00 took {ran.seconds:.0f} s (budget {LOADED_BUDGET_S:g} s)"
