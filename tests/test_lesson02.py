"""Lesson 02: what the notebook says about its own run is stated through course_lib.claims and
checked by tests/test_claims.py: counts of bytes and messages, exact sums and SyncBatchNorm's
agreement with one device as facts that must hold; timings on the emulated network as verdicts,
each the sentence its own numbers support. This file keeps what no sentence states: the notebook
runs headless, without errors, within the budget."""
from __future__ import annotations

import pytest

from common import LOADED_BUDGET_S, NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "02_collectives.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_runs_headless_without_errors_within_the_budget(ran):
    assert ran.errors == []
    assert ran.seconds < LOADED_BUDGET_S, f"lesson 02 took {ran.seconds:.0f} s (budget {LOADED_BUDGET_S:g} s)"
