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


def test_the_ring_figure_follows_the_chunks(ran):
    """Each panel differs from the one before; the reduce-scatter ends with each rank holding one
    complete chunk, the allgather with everyone holding everything (the printed counts)."""
    held = ran.values["ring_held"]
    assert held.shape == (7, 4, 12)
    assert all((held[k] != held[k + 1]).any() for k in range(6))
    assert ran.values["complete"] == [[0] * 4] * 3 + [[0] * 4] + [[0] * 4] * 2 + [[1] * 4]
    for r in range(4):
        assert (held[3, r, 3 * r:3 * r + 3] == 0b1111).all()           # chunk r complete after round 3
    assert "ranks holding the whole sum after each round: [0, 0, 0, 0, 0, 0, 4]" in ran.printed


def test_the_bytes_table_shows_the_busiest_rank_and_what_the_text_says_of_it(ran):
    v = ran.values
    rows = {alg: (total, busiest, msgs) for alg, total, busiest, msgs in v["rows"]}
    for total, busiest, _ in rows.values():
        assert total / 4 <= busiest <= total                             # 4 ranks: at least the mean
    assert rows["ring"][0] == rows["reduce_bcast"][0] == 2 * 3 * 1001 * 4  # "for the same total"
    assert rows["ring"][1] < rows["reduce_bcast"][1]                      # the ring's busiest sends less
    assert v["busiest"] == {a: b for a, (_, b, _) in rows.items()}


def test_alltoall_bruck_against_pairwise_as_printed(ran):
    a2a = ran.values["a2a"]
    assert a2a["pairwise"][:3] == ([3] * 4, [3 * 64] * 4, True)          # p - 1 messages, each item once
    assert a2a["bruck"][:3] == ([2] * 4, [4 * 64] * 4, True)             # ceil(lg 4) rounds; slots 1,3 then 2,3
    for alg in a2a:
        assert a2a[alg][3] == [a2a[alg][1], a2a[alg][0]]                 # the cost rows' formula, exactly
    assert "Bruck: 2 messages instead of 3, 256 bytes instead of 192 per rank" in ran.printed


# -- section 10: in-network aggregation (SHARP) -----------------------------------------------------
def test_the_switch_moves_n_bytes_each_way_per_host_link_as_printed(ran):
    v = ran.values
    n_bytes = 4 * v["N"]
    chunks = -(-n_bytes // (64 * 1024))
    for p in v["HOSTS"]:
        assert v["link"][("sharp", p)] == [(n_bytes, n_bytes, chunks, chunks)] * p    # once up, once down
        for alg in v["HOST_ALGS"]:          # the hosts' own allreduces: more on some link from p = 4 on
            assert (max(max(up, down) for up, down, _, _ in v["link"][(alg, p)]) > n_bytes) == (p > 2)
    assert v["sharp_matches"] and v["exact"]
    assert (f"SHARP: every host link carried n = {n_bytes} bytes up and the same down, in {chunks} messages each "
            "way, at p = 2, 4, 8 (as the formula: True)") in ran.printed
    assert "every result equals the single-process sum, exactly (integer-valued floats): True" in ran.printed


def test_the_busiest_link_ratios_are_the_formulas(ran):
    v = ran.values
    busiest = {alg: max(max(up, down) for up, down, _, _ in v["link"][(alg, 8)]) for alg in ["sharp", *v["HOST_ALGS"]]}
    n_bytes = 4 * v["N"]
    assert busiest["sharp"] == n_bytes
    assert abs(busiest["ring"] - 2 * 7 / 8 * n_bytes) <= 8                # 2(p-1)/p n, ragged chunks
    assert busiest["recursive_doubling"] == busiest["reduce_bcast"] == 3 * n_bytes   # lg p n
    ratios = (busiest["ring"] / n_bytes, busiest["recursive_doubling"] / n_bytes, busiest["reduce_bcast"] / n_bytes)
    assert (f"at p = 8 the busiest link carries {ratios[0]:.2f}x more bytes with the ring, {ratios[1]:.2f}x more "
            f"with recursive doubling and {ratios[2]:.2f}x more with the binomial tree than with the switch"
            ) in ran.printed


def test_latency_steps_follow_the_formulas(ran):
    """time / latency on a latency-only network: 2 for the switch at every p, 2(p-1) for the ring."""
    v = ran.values
    formula = {"sharp": lambda p: 2, "ring": lambda p: 2 * (p - 1), "recursive_doubling": lambda p: p.bit_length() - 1,
               "reduce_bcast": lambda p: 2 * (p.bit_length() - 1)}
    for (alg, p), measured in v["steps"].items():
        want = formula[alg](p)
        assert want - 0.1 <= measured <= want * 1.3 + 0.6, (alg, p, measured)   # Python's time only adds
    assert v["steps"][("sharp", 8)] < v["steps"][("reduce_bcast", 8)] < v["steps"][("ring", 8)]
    assert "the formulas say 2, 14 and 6" in ran.printed


def test_the_switch_is_fastest_at_8_hosts_and_its_time_barely_grows(ran):
    v = ran.values
    s = v["seconds"]
    assert v["fastest8"] == "sharp"
    assert s[("sharp", 8)] < 0.75 * s[("ring", 8)]               # model: 62 ms against 134 ms
    assert s[("sharp", 8)] / s[("sharp", 2)] < 1.6 < s[("ring", 8)] / s[("ring", 2)]
    assert 0.8 < min(v["ratio_sw"].values()) and max(v["ratio_sw"].values()) < 2.0
    assert "fastest: sharp" in ran.printed
    slots = v["slots"]                                            # the window covers a chunk's round trip
    model = v["model_sw"]
    c_beta = 64 * 1024 * model.beta
    assert (slots - 1) * c_beta >= 2 * model.alpha + 2 * c_beta and slots * 64 < 1024    # less than the vector
    assert f"the switch has {slots} slots of 64 kB = {slots * 64} kB of memory for a 1024 kB vector" in ran.printed


def test_float32_sums_are_the_switchs_order_and_every_host_gets_the_same_bits(ran):
    v = ran.values
    assert v["same_bits"] and v["replayed"]
    assert v["worst_err"] <= 1.0                                    # within (p-1) u sum|x|
    assert v["differ_rank"] == int((v["switch32"] != v["rank_order32"]).sum())
    assert v["report"].peak_slots_in_use <= v["report"].slots
    assert "every host got the same bits: True; replaying the switch's order gives them exactly: True" in ran.printed


def test_the_tree_beats_its_model_only_where_a_round_is_partial(ran):
    """"with p = 3 or 6 the tree can beat its model: ... their latencies overlap"; "The cell below
    prints measured / model for this run"; the ring's dots sit on or above its line."""
    v = ran.values
    ratio = v["ratio_by_p"]
    for alg in ("ring", "reduce_bcast"):
        line = f"{alg:>12}: measured / model " + ", ".join(f"p={p}: {ratio[(alg, p)]:.2f}" for p in v["PS"])
        assert line in ran.printed
    assert min(ratio[("reduce_bcast", p)] for p in (3, 6)) < 1.0          # "can beat its model"
    assert min(ratio[("ring", p)] for p in v["PS"]) > 0.95                # the ring pays the Pipes on top
    overlap = max(ratio[("reduce_bcast", p)] for p in (3, 6)) < min(ratio[("reduce_bcast", p)] for p in (2, 4))
    assert v["tree_overlaps"] == overlap
    assert ("yes, the overlapped latencies" in ran.printed) == overlap
