"""Lesson 06: the notebook runs headless within its budget.

What its text says about its own runs (errors against one process, bytes against their formulas,
memory per worker, the pipeline's stashes, and the measured bubble) is stated in the notebook
through course_lib.claims and checked on the run by
tests/test_claims.py::test_every_claim_of_the_lesson_holds_on_its_own_run[06_model_and_pipeline_parallel].
"""
from __future__ import annotations

import pytest

from common import LOADED_BUDGET_S, NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "06_model_and_pipeline_parallel.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_runs_headless_without_errors_within_the_budget(ran):
    assert ran.errors == []
    assert ran.seconds < LOADED_BUDGET_S, f"lesson 06 took {ran.seconds:.0f} s (budget {LOADED_BUDGET_S:g} s)"
