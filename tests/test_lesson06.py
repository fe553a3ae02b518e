"""Lesson 06: what the notebook says about its own runs holds on the runs' numbers.

The notebook is executed headless once; its values are read back and each sentence of its text
that describes a run is checked here: errors against one process, bytes against their formulas
exactly, memory per worker, the pipeline's stashes, and (timing, generous margins) the bubble.
"""
from __future__ import annotations

import numpy as np
import pytest

import course_lib.model_parallel as mp

from common import LOADED_BUDGET_S, NOTEBOOKS, line

NOTEBOOK = NOTEBOOKS / "06_model_and_pipeline_parallel.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_runs_headless_without_errors_within_the_budget(ran):
    assert ran.errors == []
    assert ran.seconds < LOADED_BUDGET_S, f"lesson 06 took {ran.seconds:.0f} s (budget {LOADED_BUDGET_S:g} s)"


def test_the_backward_pass_agrees_with_finite_differences(ran):
    assert ran.values["worst"] < 1e-6
    assert "the backward pass agrees with finite differences (to 1e-6)" in ran.printed


def test_every_split_equals_one_process_to_1e_10(ran):
    """Section 1: "Below, every split is checked against one process to 1e-10"."""
    v = ran.values
    errors = [err for _, err, *_ in v["tp_rows"]]
    errors += [err for err, loss_diff, _, _ in v["pipe_checks"].values()]
    errors += [loss_diff for _, loss_diff, _, _ in v["pipe_checks"].values()]
    errors += [row[6] for row in v["table"]]
    errors += [float(np.abs(v["U_par"] - v["U_ser"]).max()), float(np.abs(v["V_par"] - v["V_ser"]).max())]
    errors += [float(v["ig_err"]), float(v["mg_err"])]
    assert max(errors) < 1e-10
    assert len(v["pipe_checks"]) == 6 and len(v["tp_rows"]) == 4 and len(v["table"]) == 4


# ---------------------------------------------------------------- 3. tensor parallelism
def test_tensor_parallel_bytes_are_one_allreduce_of_y_and_one_of_dx(ran):
    v = ran.values
    B, D, n_out, HIDDEN = v["B"], v["D"], v["O"], v["HIDDEN"]
    for p, _, sent, formula, param_bytes in v["tp_rows"]:
        assert sent == formula == (mp.allreduce_bytes(p, B * n_out) + mp.allreduce_bytes(p, B * D) if p > 1 else 0)
        # each worker: 1/p of W1, b1, W2 (the largest block of hidden units), plus all of b2
        block = -(-HIDDEN // p)
        assert param_bytes == (D * block + block + block * n_out + n_out) * 8
        assert param_bytes == max(mp.tp_param_bytes(D, HIDDEN, n_out, p))


def test_allgather_of_the_hidden_layer_costs_more_and_reduce_scatter_half(ran):
    v = ran.values
    B, HIDDEN, n_out = v["B"], v["HIDDEN"], v["O"]
    assert "allgather: every worker has the full A: True" in ran.printed
    gathered, scattered = v["gathered"].stats.total_bytes, v["scattered"].stats.total_bytes
    pair = mp.tp_step_bytes(B, v["D"], n_out, 4)
    assert gathered == 3 * B * HIDDEN * 8 and gathered > pair                      # "more than the pair"
    assert f"the column-row pair sent {pair}: {gathered / pair:.1f}x less" in ran.printed
    assert mp.allreduce_bytes(4, 10) == 2 * 3 * 10 * 8                             # "2 (p-1) n 8 bytes in total"
    assert 2 * scattered == mp.allreduce_bytes(4, B * n_out) and scattered == 3 * B * n_out * 8   # "half the bytes"


# ---------------------------------------------------------------- 4. blocked matrix factorisation
def test_one_worker_refuses_and_four_workers_fit_and_equal_one_process_bit_for_bit(ran):
    v = ran.values
    assert v["refusal"] is not None and "budget" in v["refusal"]
    assert all(r["peak_bytes"] <= v["budget"] < v["full"] for r in v["mf_res"])   # no worker holds all of R
    assert np.array_equal(v["U_par"], v["U_ser"]) and np.array_equal(v["V_par"], v["V_ser"])
    assert "bit for bit: True" in ran.printed
    n_cols, rank = v["V_par"].shape                       # (p and k are reused later in the notebook)
    assert v["mf_res"].stats.total_bytes == v["epochs"] * len(v["mf_res"]) * n_cols * rank * 8 == 25 * 4 * 400 * 8 * 8


# ---------------------------------------------------------------- 5. pipelines
def test_the_schedules_bubble_is_the_formula_and_1f1b_stashes_at_most_p_minus_s(ran):
    for kind in mp.SCHEDULES:
        for p, m in ((4, 6), (4, 16), (8, 32)):
            sim = mp.simulate(kind, p, m, t_f=1, t_b=2)
            assert sim["bubble"] == mp.bubble_formula(p, m)
            want = [m] * p if kind == "gpipe" else [min(m, p - s) for s in range(p)]
            assert list(sim["peak_stash"]) == want
    for (kind, m), (_, _, _, stashed) in ran.values["pipe_checks"].items():
        P = ran.values["P"]
        assert stashed == ([m] * P if kind == "gpipe" else [min(m, P - s) for s in range(P)])


def test_pipeline_bytes_do_not_depend_on_m(ran):
    v = ran.values
    B, widths = v["B"], v["widths"]
    want = sum(2 * B * w * 8 for w in widths[1:-1])
    assert {r.stats.total_bytes for r in v["runs"].values()} == {want}
    assert {c[2] for c in v["pipe_checks"].values()} == {want}
    assert line(ran, "bytes per step in all") == (
        f"bytes per step in all 16 pipeline runs: [{want}]; 2 B (96 + 96 + 64) 8 = {want}")


def test_measured_bubble_follows_the_formula_down_and_the_gap_grows_with_m(ran):
    """Load-proof parts of the text; "close to the formula on a quiet machine" is
    test_model_parallel.py::test_pipeline_measured_bubble_matches_formula (within 20%)."""
    v = ran.values
    gaps, gap_at, P = v["gaps"], v["gap_at"], v["P"]
    measured = {key: mp.measured_bubble(res.timeline, P) for key, res in v["runs"].items()}
    for (kind, m), g in measured.items():
        f = float(mp.bubble_formula(P, m))
        assert gaps[kind, m] == pytest.approx((g - f) / f)
    for kind in mp.SCHEDULES:
        assert abs(measured[kind, 1] - 0.75) < 0.05 * 0.75            # "about 3/4 with one micro-batch"
        assert measured[kind, 16] < measured[kind, 4] < measured[kind, 1]   # "follows the formula down"
    assert gap_at[16] > gap_at[1]                                       # "larger with many micro-batches"
    assert line(ran, "on this run the measured bubble was") == (
        f"on this run the measured bubble was {min(gaps.values()):+.1%} to {max(gaps.values()):+.1%} off the formula; "
        f"mean gap {gap_at[1]:+.1%} with m = 1, {gap_at[16]:+.1%} with m = 16")


# ---------------------------------------------------------------- 7. the three strategies
def test_the_comparison_table_says_what_its_numbers_say(ran):
    v = ran.values
    table, params = v["table"], v["params"]
    dp_server, dp_ring, tp, pp = table
    whole = mp.param_bytes(params)
    assert dp_server[5] == dp_ring[5] == whole                       # a whole copy on every worker
    assert dp_server[4] == dp_ring[4] == 2 * whole                   # all the gradients: 2 (p - 1) x, p = 2
    assert tp[5] == (whole - v["O"] * 8) // 2 + v["O"] * 8           # half, b2 replicated
    assert tp[4] == min(row[4] for row in table) and pp[4] > tp[4]
    assert pp[4] == 2 * v["B"] * v["HIDDEN"] * 8                     # the wide border, both ways
    assert line(ran, "tensor parallel: ") == (
        f"tensor parallel: {tp[5]} parameter bytes per worker = {tp[5] / dp_server[5]:.3f} of data parallel's "
        f"{dp_server[5]}; it sent the fewest bytes: True; the pipeline sent more than it: True; "
        f"largest |err| of the four: {max(row[6] for row in table):.0e}")


# ---------------------------------------------------------------- 8. in-graph and between-graph
def test_in_graph_and_between_graph_compute_the_same_gradient_with_the_same_bytes(ran):
    v = ran.values
    p2, whole = v["p2"], mp.param_bytes(v["params"])
    in_graph = v["in_graph"]
    assert len(in_graph) == p2 + 2 and {n.device for n in in_graph} == set(range(p2))
    assert v["ig"].stats.total_bytes == v["bg"].stats.total_bytes == 2 * (p2 - 1) * whole
    assert "the same bytes both ways, 2 (p - 1) x 166016 parameter bytes: True" in ran.printed
    mg, B, D, n_out = v["mg"], v["B"], v["D"], v["O"]
    assert mg.stats.total_bytes == 3 * (B * D + B * n_out) * 8
    assert np.abs(mg[0]["Y"] - v["cache"]["Y"]).max() < 1e-12
    assert [sorted(r) for r in mg[1:]] == [[f"part{r}/Y"] for r in (1, 2, 3)]   # each worker ran only its part
