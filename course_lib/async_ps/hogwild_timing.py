"""Timing Hogwild! fairly: each update's time span, the collisions they reveal, and variants
run in turns.

A run of lesson 03 takes about 0.1 s, shorter than the spells in which a core runs slower
(another program, or another tenant of a virtual machine's physical core), so a single
run compares spells as much as variants. :func:`time_hogwild_variants` spreads the runs of
every variant over the same spells and keeps the fastest of each, as timeit does.
"""
from __future__ import annotations

import time

import numpy as np

from course_lib import validate
from course_lib.reference.ex03 import hogwild_worker  # question ex03_3

from .hogwild import HogwildResult, fastest_run, run_hogwild
from .settings import HogwildSettings
from .sgd_problems import SparseProblem


def timed_worker(w, idx, val, y, order, lr, lock=None):
    """:func:`hogwild_worker` (or the locked loop), one sample at a time, recording each update's time span.

    Returns ``{"n": count, "spans": (count, 2) array of perf_counter (read, written)}``, from
    which :func:`collisions` counts the updates that overlapped a conflicting one.
    """
    spans = np.empty((len(order), 2))
    clock = time.perf_counter
    for k, i in enumerate(order):
        one = (i,)
        if lock is None:
            spans[k, 0] = clock()
            hogwild_worker(w, idx, val, y, one, lr)
            spans[k, 1] = clock()
        else:
            with lock:
                spans[k, 0] = clock()
                hogwild_worker(w, idx, val, y, one, lr)
                spans[k, 1] = clock()
    return {"n": len(order), "spans": spans}


def _overlapping(spans_a, spans_b):
    """For each span [read, written) of ``spans_a``, the range ``lo:hi`` of the spans of
    ``spans_b`` that overlap it in time (``spans_b`` are disjoint and in order, so they form a range)."""
    lo = np.searchsorted(spans_b[:, 1], spans_a[:, 0], side="right")
    hi = np.searchsorted(spans_b[:, 0], spans_a[:, 1], side="left")
    return lo, hi


def _spans(result: HogwildResult):
    if result.spans is None:
        raise ValueError("run_hogwild(..., worker=timed_worker) records the spans this needs")
    return result.spans


def time_overlap(result: HogwildResult) -> float:
    """Fraction of updates whose read-modify-write overlapped in time with an update of another
    worker, whatever coordinates the two touched (needs a run with ``worker=timed_worker``).

    It measures how much the workers really ran at the same moment: 0 when they took turns (a
    lock, or one core shared), up to 1 when every update ran beside another. An update can
    collide (:func:`collisions`) only if it overlaps, so ``collisions <= time_overlap``, with
    equality when every two samples share a coordinate (rho = 1). With ``apart=True`` the
    workers touch private copies, but they still ran at the same moment: the overlap counts."""
    spans = _spans(result)
    hit = 0
    for a, spans_a in enumerate(spans):
        overlaps = np.zeros(len(spans_a), bool)
        for b, spans_b in enumerate(spans):
            if a != b and len(spans_b):
                lo, hi = _overlapping(spans_a, spans_b)
                overlaps |= hi > lo
        hit += int(overlaps.sum())
    return hit / max(1, sum(len(s) for s in spans))


def collisions(result: HogwildResult, problem: SparseProblem) -> float:
    """Fraction of updates whose read-modify-write overlapped in time with an update of
    another worker on a shared coordinate (needs a run with ``worker=timed_worker``).

    Such an update may have read a coordinate that the other was about to change, or had its
    write overwritten: the lost or mixed updates that Hogwild!'s analysis bounds through rho.
    """
    spans = _spans(result)
    if result.apart:
        return 0.0  # private copies of w: no coordinate is shared
    hit = 0
    for a, (spans_a, samples_a) in enumerate(zip(spans, result.samples)):
        clash = np.zeros(len(spans_a), bool)
        for b, (spans_b, samples_b) in enumerate(zip(spans, result.samples)):
            if a == b or len(spans_b) == 0:
                continue
            lo, hi = _overlapping(spans_a, spans_b)
            for k in np.flatnonzero(hi > lo):
                if clash[k]:
                    continue
                mine = problem.idx[samples_a[k]]
                for m in range(lo[k], hi[k]):
                    if np.intersect1d(mine, problem.idx[samples_b[m]], assume_unique=True).size:
                        clash[k] = True
                        break
        hit += int(clash.sum())
    return hit / max(1, sum(len(s) for s in spans))


VARIANTS = {"1 process": {"n_workers": 1}, "lock-free x2": {"n_workers": 2},
            "locked x2": {"n_workers": 2, "lock": True}, "share nothing x2": {"n_workers": 2, "apart": True}}


def time_hogwild_variants(problem: SparseProblem, settings: HogwildSettings | None = None, *, repeats: int = 5,
                          variants: dict = VARIANTS, **overrides) -> dict[str, HogwildResult]:
    """Each of ``variants`` (label -> fields of :class:`HogwildSettings` that differ from
    ``settings``, itself overridden by the keywords), run ``repeats`` times in turns (one run of
    each, then again), each returned as its fastest run.

    Why in turns: the speed of a core drifts over a second or so (another program, or on a
    virtual machine another tenant on the same physical core; measured here: the same serial
    loop took 0.07 s or 0.14 s for seconds at a time, and 0.14 s while another process kept
    the second core busy). Variants timed one after the other can land in different spells
    and compare the spells; in turns, each has its runs spread over the same spells, and the
    fastest of each is a fair comparison.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"need repeats >= 1, got {repeats!r}")
    base = validate.settings_from(HogwildSettings, settings, overrides)
    each = {label: validate.settings_from(HogwildSettings, base, changes) for label, changes in variants.items()}
    runs = {label: [] for label in variants}
    for _ in range(repeats):
        for label, variant in each.items():
            runs[label].append(run_hogwild(problem, variant))
    return {label: fastest_run(results) for label, results in runs.items()}
