"""Lesson 02: what the notebook says about its own run holds on the run's numbers.

The notebook is executed headless once (shared with tests/test_notebooks.py); its variables
are read back and each sentence of its text that describes them is checked here.
"""
from __future__ import annotations

import numpy as np
import pytest

from common import NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "02_collectives.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


@pytest.fixture(scope="module")
def ran(executed_notebook):
    return executed_notebook(NOTEBOOK)


def test_syncbn_forward_is_the_single_device_one_and_per_worker_is_not(ran):
    v = ran.values
    assert np.abs(v["y_sync"] - v["y_single"]).max() < 1e-9
    assert np.abs(v["y_local"] - v["y_single"]).max() > 0.5      # "visibly different"
    means = [r[2][0] for r in v["res"]]
    assert max(means) - min(means) > 1.0                           # non-iid shards: far apart


def test_the_shortcut_loses_every_digit_and_the_merge_does_not(ran):
    v = ran.values
    assert v["offsets"][8] == pytest.approx(1e4)
    assert v["err_naive"][8] > 1.0                                 # off by more than 100 %
    assert max(v["err_m2"]) < 1e-4                                 # at every offset up to 1e5
    assert "the shortcut's variance is off by" in ran.printed


def test_syncbn_backward_equals_one_device_and_finite_differences(ran):
    v = ran.values
    assert np.abs(v["dx_sync"] - v["dx_one"]).max() < 1e-9
    assert np.abs(v["dx_local"] - v["dx_one"]).max() > 0.5         # plain data parallelism is wrong
    assert v["fd_err"] < 1e-6
    for _, gw, gb in v["back"]:
        assert np.allclose(gw, v["one"].grad_weight, atol=1e-12) and np.allclose(gb, v["one"].grad_bias, atol=1e-12)


def test_the_backward_costs_one_allreduce_of_two_sums_per_feature(ran):
    v = ran.values
    assert v["backward_msgs"] == [2, 2, 2, 2]                     # recursive doubling, 4 ranks: lg 4
    assert v["backward_bytes"] == [2 * 2 * 3 * 8] * 4              # 2 messages x (2 x 3 float64)
    assert "2 messages, each the 2 x 3 float64 sums = 48 bytes" in ran.printed
