"""Lesson 01: what the notebook says about its own run is stated through course_lib.claims and
checked by tests/test_claims.py: exact results (iterates, words, re-execution, checkpoints) as
facts that must hold; timings (speedup, latency, incast, the straggler) as verdicts, each the
sentence its own numbers support. This file keeps what no sentence states: the notebook runs
headless, without errors, within the budget. (tests/test_core_counts.py runs it at 1 and 16 cores.)
"""
from __future__ import annotations

import pytest

from common import LOADED_BUDGET_S, NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "01_mapreduce_gd.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_runs_headless_within_the_budget(ran):
    assert not ran.errors, ran.errors
    assert ran.seconds < LOADED_BUDGET_S, \
        f"lesson 01 took {ran.seconds:.0f} s (budget under load {LOADED_BUDGET_S:g} s)"
