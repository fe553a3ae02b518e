"""Lesson 08: what the notebook says about its own run holds on the run's numbers.

The notebook is executed headless once (shared with tests/test_notebooks.py); its variables
are read back and each sentence of its text that describes them is checked here: bytes,
counts and equalities exactly, timing only as ratios within the same run, with margins.
"""
from __future__ import annotations

import numpy as np
import pytest

from course_lib.data_parallel import memory as mem
from course_lib.data_parallel import mixed_precision as mpx
from course_lib.data_parallel import zero

from common import LOADED_BUDGET_S, NOTEBOOKS, line

NOTEBOOK = NOTEBOOKS / "08_data_parallelism_in_practice.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_runs_headless_within_the_budget(ran):
    assert ran.seconds < LOADED_BUDGET_S, (
        f"lesson 08 took {ran.seconds:.0f} s (budget under load {LOADED_BUDGET_S:g} s)")


# -- memory anatomy and mixed precision ------------------------------------------------------
def test_memmp_every_worker_holds_16_bytes_per_parameter_exactly_as_the_formula(ran):
    v = ran.values
    anatomy = v["memmp_anatomy"]
    assert len(anatomy.states) == 2 and {s.rank for s in anatomy.states} == {0, 1}
    n = sum(a * b + b for a, b in zip(v["memmp_widths"][:-1], v["memmp_widths"][1:]))
    for s in anatomy.states:
        assert s.n_params == n
        for cat, per_param in mem.BYTES_PER_PARAM.items():
            assert s.measured[cat] == per_param * n, cat
    assert v["memmp_state_exact"] and v["memmp_bytes_per_param"] == 16.0
    assert "every worker holds 16.0 bytes per parameter, exactly the formula in every category" in ran.printed
    assert "2 + 2 + 12 = **16 bytes per parameter**" in ran.markdown


def test_memmp_activations_are_linear_in_batch_and_match_the_formula(ran):
    v = ran.values
    acts = v["memmp_acts"]
    widths = v["memmp_widths"]
    assert len(acts) >= 4
    for a in acts:
        assert a.measured == a.formula == a.batch * sum(widths) * 2
        assert a.kept == tuple((a.batch, w) for w in widths)  # the input and every layer's output
    assert v["memmp_acts_exact"] and v["memmp_linear"]
    assert v["memmp_bytes_per_sample"] == 2 * sum(widths)
    state_total = v["memmp_state"].total
    assert abs(v["memmp_crossover_batch"] - state_total / (2 * sum(widths))) < 1e-9
    # the crossover lies inside the measured range, where the figure shows it
    assert acts[0].measured < state_total < acts[-1].measured
    text = line(ran, "on this run, the activations are")
    assert (f"{v['memmp_bytes_per_sample']:.0f} bytes per sample" in text and "exactly linear in B" in text
            and "equal to the formula at every B" in text
            and f"from B = {v['memmp_crossover_batch']:.0f}" in text)


def test_memmp_hidden_gradients_are_below_fp16_subnormal_and_underflow_without_scaling(ran):
    v = ran.values
    medians = np.asarray(v["memmp_layer_grad_median"])
    assert medians[:-1].max() < mpx.FP16_SMALLEST_SUBNORMAL < medians[-1]
    assert v["memmp_hidden_below"] and v["memmp_last_vs_hidden"] > 1000
    # measured zeros against numpy's direct count on the exact gradient
    assert abs(v["memmp_zero_first"] - v["memmp_exact_below"]) < 0.03
    assert v["memmp_zero_mean"] > 0.9 and v["memmp_zero_scaled"] < 0.01
    assert v["memmp_hidden_frozen"] and v["memmp_hidden_moved"] == 0.0
    assert f"{v['memmp_zero_first']:.1%} of the fp16 gradient entries are 0" in ran.printed
    assert "only the last layer" in line(ran, "on this run, without scaling the hidden layers")


def test_memmp_unscaled_stalls_scaled_follows_fp32(ran):
    v = ran.values
    serial = v["memmp_serial"]
    assert v["memmp_final_serial"] < 0.2 * serial[0]
    assert v["memmp_stall_ratio"] > 2.0
    # the unscaled loss stopped moving over the last quarter of the run
    tail = v["memmp_unscaled"].losses[-len(serial) // 4:]
    assert tail.max() / tail.min() < 1.01
    assert v["memmp_scaled_vs_serial"] < 0.05
    np.testing.assert_allclose(v["memmp_scaled"].losses, serial, rtol=0.05)
    assert v["memmp_fp32_vs_serial"] < 1e-4  # fp32 data parallel = one process
    assert v["memmp_early_rise"] > 1.0
    text = line(ran, "on this run, fp32 on one process")
    assert f"{v['memmp_stall_ratio']:.1f}x higher" in text and f"within {v['memmp_scaled_vs_serial']:.1%}" in text


def test_memmp_scale_grew_then_overflowed_every_interval_plus_one_steps(ran):
    v = ran.values
    run = v["memmp_scaled"]
    assert run.scales[0] == 2.0 ** 16 and v["memmp_max_scale_log2"] > 16
    skips = np.flatnonzero(run.skipped)
    assert v["memmp_n_skipped"] == len(skips) >= 2 and v["memmp_first_skip"] == skips[0]
    for k in skips[skips < len(run.scales) - 1]:
        assert run.scales[k + 1] == run.scales[k] / 2
    assert v["memmp_skip_gaps"] == [11]  # growth_interval 10, then the overflowing step
    assert "1 in 11 steps" in ran.markdown and "`growth_interval + 1` = 11 steps" in ran.markdown
    assert f"S grew from 2^16 to 2^{v['memmp_max_scale_log2']:.0f}" in ran.printed


def test_memmp_fp16_allreduce_moves_half_the_bytes_of_fp32(ran):
    v = ran.values
    fp16, fp32 = v["memmp_scaled"], v["memmp_fp32_dp"]
    assert v["memmp_bytes_fp16"] == 2 * 2 * fp16.n_params  # p = 2: each rank sends n fp16 values
    assert v["memmp_bytes_fp32"] == 2 * 4 * fp32.n_params
    assert np.all(fp16.allreduce_bytes == v["memmp_bytes_fp16"])
    assert fp16.total_bytes == len(fp16.losses) * v["memmp_bytes_fp16"]
    assert v["memmp_bytes_ratio"] == 2.0
    assert "2.00x fewer in fp16" in ran.printed


# -- DDP: buckets overlapped with backward -------------------------------------------------
def test_buckets_are_filled_in_reverse_under_the_cap(ran):
    v = ran.values
    plan = v["ddp_plan"]
    assert [q for b in plan.buckets for q in b.params] == list(range(2 * len(v["ddp_layers"])))[::-1]
    assert all(b.nbytes <= plan.cap_bytes or len(b.params) == 1 for b in plan.buckets)
    assert "bucket 0: b12 W12 b11" in ran.printed
    assert f"one 256 x 256 layer (emulated): backward {1e3 * v['ddp_layer_compute']:.1f} ms" in ran.printed
    assert v["ddp_layer_comm"] > v["ddp_layer_compute"]          # "a little longer to allreduce"
    assert v["ddp_layer_comm"] < 2 * v["ddp_layer_compute"]


def test_both_runs_equal_serial_training(ran):
    v = ran.values
    assert v["ddp_err"][True] < 1e-6 and v["ddp_err"][False] < 1e-6
    assert np.abs(v["ddp_serial"]).max() > 0.1      # the bound is small against the weights
    assert f"overlapped {v['ddp_err'][True]:.1e}" in ran.printed


def test_traffic_is_a_ring_allreduce_per_bucket(ran):
    v = ran.values
    assert v["ddp_traffic_ok"]
    n, plan = v["ddp_N"], v["ddp_plan"]
    for o in (False, True):
        assert list(v["ddp_msgs"][o]) == [2 * (n - 1) * len(plan)] * n
        assert v["ddp_bytes"][o].sum() == 2 * (n - 1) * sum(b.nbytes for b in plan.buckets)
    assert "traffic as the formula in both runs: True" in ran.printed


def test_buckets_start_in_order_on_every_rank(ran):
    v = ran.values
    assert v["ddp_order_ok"]
    assert all(order == list(range(len(v["ddp_plan"]))) for order in v["ddp_started"])
    assert "at every step: True" in ran.printed


def test_communication_overlaps_backward_only_when_overlapped(ran):
    v = ran.values
    assert v["ddp_busy"][True] > 0.2 and v["ddp_busy"][False] == 0.0
    assert f"overlapped {v['ddp_busy'][True]:.0%}, not overlapped 0%" in ran.printed


def test_overlap_shortens_the_step_as_the_model_says(ran):
    c = ran.values["ddp_cmp"]
    assert c.ratio < 0.9                    # measured 0.71-0.79 on 2 cores
    assert c.model_ratio < 0.75
    assert abs(c.ratio - c.model_ratio) < 0.2
    assert f"took {c.ratio:.2f}x the non-overlapped one" in ran.printed
    assert f"the model says {c.model_ratio:.2f}x" in ran.printed


def test_the_best_cap_lies_between_too_small_and_too_large(ran):
    v = ran.values
    caps = v["ddp_caps"]
    assert 0 < v["ddp_best"] < len(caps) - 1 and 0 < v["ddp_model_best"] < len(caps) - 1
    assert v["ddp_small_vs_best"] > 1.3     # latency per message (model: 1.71x; measured 1.75x)
    assert v["ddp_large_vs_best"] > 1.05    # no overlap (model: 1.28x; measured 1.17-1.19x)
    assert v["ddp_nbuckets"][0] == 26 and v["ddp_nbuckets"][-1] == 1
    assert 1.0 <= v["ddp_vs_model"].min() and v["ddp_vs_model"].max() < 1.8
    assert f"the best cap was {caps[v['ddp_best']]:,} bytes" in ran.printed


# -- ZeRO and gradient compression --------------------------------------------------------
def test_zero_stages_equal_plain_dp_bit_for_bit(ran):
    v = ran.values
    assert v["zero_all_equal"] and all(v["zero_same"].values())
    assert v["zero_grouping_diff"][2] == 0.0
    assert "bit for bit: True" in ran.printed and "bit for bit: False" not in ran.printed


def test_zero_memory_equals_the_formulas(ran):
    v = ran.values
    assert v["zero_state_matches"]
    psi = v["zero_psi"]
    for (n, label), run in v["zero_runs"].items():
        if label == "DP by layer":
            continue
        stage = 0 if label == "DP" else label
        for report in run.memory:
            assert report.state_bytes == zero.zero_bytes_per_param(stage, n) * psi
            assert report.transient_bytes == (2 * v["zero_biggest_layer"] if stage >= 2 else 0)
    assert np.isclose(v["zero_saving_4"], 16 / v["zero_peak_per_param"][4, 3])
    assert f"{v['zero_saving_4']:.1f}x less than plain DP's 16" in ran.printed


def test_zero_bytes_equal_the_formulas_and_stage3_is_1_5x(ran):
    v = ran.values
    assert v["zero_bytes_match"]
    assert v["zero_stage1_ratio"][4] == 1.0 and v["zero_stage3_ratio"][4] == 1.5
    assert "stages 1-2 send 1.00x the bytes of DP and stage 3 1.50x" in ran.printed


def test_error_feedback_verdict_holds_on_the_run(ran):
    v = ran.values
    assert v["ec_plain_progress"] < 0.3                      # "top-k without memory creeps"
    assert v["ec_ef_gain"] >= 10 and v["ec_verdict"] == "error feedback matters here"
    assert v["ec_final"]["dense"] < v["ec_final"]["topk_ef"] < v["ec_final"]["topk"]   # follows dense at a distance
    assert f"ends {v['ec_ef_gain']:.1f}x closer" in ran.printed


def test_topk_bytes_are_the_formula(ran):
    v = ran.values
    cfg = v["ec_cfg"]
    assert v["ec_bytes_ratio"] == cfg.dim / (4 * cfg.k)
    assert v["ec_measured"] == v["ec_model"]
