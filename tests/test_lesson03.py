"""Lesson 03: what the notebook says about its own run holds on the run's numbers."""
from __future__ import annotations

import pytest

from common import NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "03_async_parameter_server.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]



def test_one_process_is_serial_sgd_and_the_verdicts_are_the_runs(ran):
    for name, (l_serial, one, free, _) in ran.values["hog"].items():
        assert one.loss == l_serial, name                     # same samples, same order: the same SGD
        faster = "faster" if free.wall_time < one.wall_time else "slower"
        assert (f"on this run, {name}: two lock-free processes were {faster} than one "
                f"({one.wall_time / free.wall_time:.2f}x)") in ran.printed
        assert "exactly" in ran.printed.split(f"on this run, {name}:")[1].splitlines()[0]


def test_two_lock_free_processes_split_the_work_and_beat_one_on_the_sparse_problem(ran):
    """The text: on two free cores two processes take about half the time (measured alone, in the
    timing phase of make test); the margin allows a noisy machine: faster, not twice as fast."""
    _, one, free, _ = ran.values["hog"]["sparse (5 of 2000)"]
    assert sum(len(s) for s in free.samples) == one.n_updates == 20000
    assert free.wall_time < one.wall_time


def test_sparse_updates_collide_less_than_dense_ones_and_the_lock_removes_collisions(ran):
    from course_lib.async_ps import collisions

    problems, hog = ran.values["problems"], ran.values["hog"]
    sparse, dense = "sparse (5 of 2000)", "dense (50 of 50)"
    assert collisions(hog[sparse][2], problems[sparse]) < collisions(hog[dense][2], problems[dense])
    for name in hog:
        assert collisions(hog[name][3], problems[name]) == 0
        assert hog[name][2].loss < 1.5 * hog[name][0]                # "reach the serial loss"
