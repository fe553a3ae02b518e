"""Lesson 08: the notebook's Markdown states the numbers
that its claims check.

What the notebook says about its own run (bytes, counts and equalities exactly; the DDP step
times as verdicts read from the run) is stated through course_lib.claims and checked by
tests/test_claims.py::test_every_claim_of_the_lesson_holds_on_its_own_run[08_data_parallelism_in_practice].
"""
from __future__ import annotations

import pytest

from common import NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "08_data_parallelism_in_practice.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_the_text_states_the_numbers_the_claims_check(ran):
    """The Markdown's 16 bytes per parameter and 11 steps between overflows are the claims'
    ("2 + 2 + 12 = 16", "growth_interval + 1 = 11"), which hold on the run."""
    assert "2 + 2 + 12 = **16 bytes per parameter**" in ran.markdown
    assert "1 in 11 steps" in ran.markdown and "`growth_interval + 1` = 11 steps" in ran.markdown
