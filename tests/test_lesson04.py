"""Lesson 04: what the claims API cannot say about the notebook's run.

Every sentence the notebook prints about its own run (the closed forms, runs equal bit for bit
to their single-process references, errors under their bounds, counted messages and bytes, and
the emulated network's timings) is stated through course_lib.claims and checked on that run by
tests/test_claims.py (``-k 04_gossip``): facts must hold, timing verdicts must be the sentence
their own numbers give. What is left here: the Markdown and figure text (the time budget: tests/test_notebooks.py).
"""
from __future__ import annotations

import pytest

from common import NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "04_gossip.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_the_text_claims_nothing_the_run_does_not_show(ran):
    text = ran.markdown
    assert "their curves coincide" not in text                 # they differ by up to 7 %
    assert "stays put" not in text                              # it falls to 0.70 first
    assert "stays constant on expanders" not in text and "stays roughly constant" not in text
    assert "with $1/(1 - r)$" not in text                       # the star and the ring say otherwise
    assert "keeps\nup with the synchronous server" not in text and "keeps up with the synchronous" not in text
    assert "What this run does **not** show is D-PSGD beating the server in time" not in text
    assert "D-PSGD beating the\nserver in time, the question in the title of Lian et al., needs a network" in text


def test_the_emulated_figure_says_emulated(ran):
    """The figure's title says the network is emulated (the figure is saved as lesson04_emulated_network.png)."""
    source = "\n".join(c.source for c in ran.notebook.cells if c.cell_type == "code")
    assert 'fig.suptitle(f"Emulated network' in source and 'show(fig, "emulated_network")' in source
