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


def _sources(kind):
    import nbformat

    return "\n".join(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == kind)


def test_the_source_notes_are_named_not_seeds():
    text = _sources("markdown")
    assert "the seeds" not in text.lower() and "Seed 003" not in text and "The seed (003)" not in text
    assert "The course's source notes\n([README](../README.md#source-notes))" in text


def test_the_figures_are_drawn_to_be_read():
    """04_6: the average model in a panel of its own (its ratio to the server), not dashed under the server's
    curve; 04_7: a run with emulated compute, labelled so, over whole iterations; 04_9: a log axis with
    labels between the decades; the widget says when a torus is not one."""
    code = _sources("code")
    assert 'axes[1].plot(it, average_over_server[name]' in code and 'ls="--", lw=1.8, zorder=3)' not in code
    assert "compute_seconds=EMULATED_GRADIENT" in code and "(emulated compute:" in code
    assert "ax.set_xlim(first - margin, last + margin)" in code
    assert "mticker.LogLocator(base=10, subs=(1.0, 1.5, 2.0" in code
    assert "gs.torus_note(n)" in code
