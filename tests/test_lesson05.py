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


def _cells():
    import nbformat

    return nbformat.read(NOTEBOOK, as_version=4).cells


def _first(text, needle):
    at = text.find(needle)
    assert at >= 0, f"{needle!r} is not in the lesson"
    return at


def test_the_sections_build_in_order():
    """Tasks and dependencies before consistency; the chain defined before a server dies and before the join."""
    markdown = "\n".join(c.source for c in _cells() if c.cell_type == "markdown")
    headings = [line for line in markdown.splitlines() if line.startswith("## ")]
    numbered = [h for h in headings if h[3].isdigit()]
    assert [int(h[3]) for h in numbered] == list(range(1, len(numbered) + 1))
    assert _first(markdown, "## 3. Asynchronous tasks") < _first(markdown, "## 4. Consistency")
    chain_defined = _first(markdown, "form the\nrange's **chain**")
    assert chain_defined < _first(markdown, "chain") + 200 and chain_defined < _first(markdown, "## 6. A server dies")
    assert _first(markdown, "## 6. A server dies") < _first(markdown, "**A server joins.**")


def test_every_term_is_defined_before_it_is_used():
    """SSP and its invariant, ps-lite, KKT and soft(.) are defined where they first appear in the lesson
    (Markdown or code), not later."""
    text = "\n".join(c.source for c in _cells())
    for term, definition in [("SSP", "**stale synchronous parallel (SSP)**"),
                             ("SSP invariant", "The **SSP invariant** is the"),
                             ("ps-lite", "**ps-lite**, the open-source implementation"),
                             ("KKT", "*KKT* filter (the one"),
                             ("soft(", r"**soft-thresholding operator**")]:
        first_use = _first(text, term)
        assert _first(text, definition) <= first_use + len(definition), term
    assert r"\mathrm{soft}(x, t) = \mathrm{sign}(x)\,\max(|x| - t,\ 0)" in text
    assert "Karush-Kuhn-Tucker" in text and "Ho et al. (NIPS 2013)" in text


def test_li_et_al_is_cited_by_its_sections():
    """OSDI 2014: 3.2 range push and pull, 3.3 user-defined functions, 3.4 asynchronous tasks and
    dependency, 3.5 flexible consistency, 3.6 filters, 4.1 vector clock, 4.2 messages, 4.3 consistent
    hashing, 4.4 replication, 4.5 server management, 4.6 worker management."""
    markdown = "\n".join(c.source for c in _cells() if c.cell_type == "markdown")
    for cited, subject in [("section 3.4, asynchronous tasks and dependency", "A push or a pull is a *task*"),
                           ("section 3.5, flexible consistency", "*consistency model*"),
                           ("section 3.6, user-defined filters", "*Significantly modified*"),
                           ("section 4.1", "**vector clock**"),
                           ("section 4.5, server management", "two phases while training"),
                           ("section 4.6, worker management", "**A worker dies**"),
                           ("section 4.4, replication and consistency", "## 6. A server dies")]:
        assert abs(_first(markdown, cited) - _first(markdown, subject)) < 400, cited
    assert "section 3.2):" not in markdown and "2014, section 4.3) let a new server" not in markdown


def test_the_source_notes_are_named_not_seeds():
    text = "\n".join(c.source for c in _cells() if c.cell_type == "markdown").lower()
    assert "seed" not in text and "the course's source notes ([readme](../readme.md#source-notes))" in text
