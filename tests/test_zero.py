"""ZeRO stages 1-3 on real processes: the same model as plain data parallel, the memory of the
formulas measured from the arrays each rank holds, the bytes of the formulas counted on the wire."""
import numpy as np
import pytest

import course_lib as cl
from course_lib.data_parallel.model import flatten_layers
from course_lib.data_parallel.zero import (
    PREFETCH_BACKWARD_S,
    PREFETCH_FORWARD_S,
    PREFETCH_LATENCY_S,
    ZeroConfig,
    run_zero,
    run_zero3_prefetch,
    shard_range,
    zero_bytes_per_param,
    zero_bytes_per_step,
    zero_elements_per_rank,
)
from course_lib.data_parallel.zero import prefetch_model as zero3_prefetch_model
from course_lib.model_parallel.mlp import init_deep

CFG = ZeroConfig(steps=4)          # every layer's size is a multiple of 4: shards are equal


@pytest.fixture(scope="module", params=[2, 4])
def runs(request):
    n = request.param
    with cl.Cluster(n) as cluster:
        out = {"dp_whole": run_zero(cluster, 0, CFG), "dp_by_layer": run_zero(cluster, 0, CFG, dp_by_layer=True)}
        out.update({s: run_zero(cluster, s, CFG) for s in (1, 2, 3)})
    return n, out


def test_shard_range_is_array_split():
    for n, p in [(10, 3), (7, 4), (3, 5), (16, 4)]:
        chunks = np.array_split(np.arange(n), p)
        for r in range(p):
            start, stop = shard_range(n, p, r)
            assert np.array_equal(np.arange(start, stop), chunks[r])


def test_every_stage_trains_the_model_of_plain_data_parallel_bit_for_bit(runs):
    n, out = runs
    assert out["dp_whole"].losses[-1] < 0.5 * out["dp_whole"].losses[0]      # it trains
    assert np.array_equal(out[1].master, out["dp_whole"].master)
    assert np.array_equal(out[2].master, out["dp_by_layer"].master)
    assert np.array_equal(out[3].master, out["dp_by_layer"].master)
    for s in (1, 2, 3):
        np.testing.assert_allclose(out[s].losses, out["dp_whole"].losses, rtol=1e-3)
    if n == 2:                                   # two addends: the order of the sum cannot matter
        assert np.array_equal(out["dp_whole"].master, out["dp_by_layer"].master)


def test_state_memory_is_the_formula_exactly_and_the_transient_is_one_layer(runs):
    n, out = runs
    psi = out[1].n_params
    biggest_layer = max(a * b + b for a, b in zip(CFG.widths[:-1], CFG.widths[1:]))
    for stage, run in [(0, out["dp_whole"]), (1, out[1]), (2, out[2]), (3, out[3])]:
        for mem in run.memory:
            assert mem.state_bytes == zero_bytes_per_param(stage, n) * psi
            assert mem.transient_bytes == (2 * biggest_layer if stage >= 2 else 0)
    assert out[3].memory[0].at_peak["gathered params"] == 2 * biggest_layer


def test_bytes_per_step_are_the_formula(runs):
    n, out = runs
    psi = out[1].n_params
    for stage, run in [(0, out["dp_whole"]), (0, out["dp_by_layer"]), (1, out[1]), (2, out[2]), (3, out[3])]:
        assert run.bytes_total == CFG.steps * zero_bytes_per_step(stage, psi, n)
    assert out[3].bytes_total == 1.5 * out["dp_whole"].bytes_total
    layers = len(CFG.widths) - 1                 # stage 3: per layer two allgathers and a reduce-scatter
    assert out[3].messages_total == CFG.steps * 3 * layers * n * (n - 1)


def test_each_rank_sends_the_papers_volume_per_rank(runs):
    """ZeRO section 7 counts per rank: 2 Psi elements (DP, stages 1-2), 3 Psi (stage 3); a ring
    sends exactly (N-1)/N of that per rank on average, fp16: 2 bytes an element."""
    n, out = runs
    psi = out[1].n_params
    for stage, run in [(0, out["dp_whole"]), (1, out[1]), (2, out[2]), (3, out[3])]:
        per_rank = run.bytes_per_rank_per_step
        assert len(per_rank) == n and per_rank.sum() == zero_bytes_per_step(stage, psi, n)
        assert per_rank.mean() == pytest.approx(2 * zero_elements_per_rank(stage, psi, n))
        assert np.all(per_rank < 2 * zero_elements_per_rank(stage, psi, n, exact=False))
    assert zero_elements_per_rank(3, psi, n, exact=False) == 3 * psi
    assert zero_elements_per_rank(1, psi, n, exact=False) == 2 * psi


def test_the_dp_groupings_differ_by_rounding_that_adams_first_step_magnifies():
    """At N = 4 the whole-vector and per-layer allreduces add each element's four fp16 addends in
    different orders. After one Adam step (lr g / (|g| + eps), about lr sign(g)), the weights differ
    by about lr exactly where one grouping's sum was 0 (that weight did not move), and elsewhere
    by far less than lr."""
    cfg = ZeroConfig(steps=1)
    w0 = flatten_layers(init_deep(cfg.widths, cfg.seed), np.float32)
    with cl.Cluster(4) as cluster:
        whole, by_layer = run_zero(cluster, 0, cfg), run_zero(cluster, 0, cfg, dp_by_layer=True)
    diff = np.abs(whole.master - by_layer.master)
    big = diff > cfg.lr / 2
    assert big.any()                                  # the rounding shows
    one_did_not_move = (whole.master == w0) | (by_layer.master == w0)
    assert np.all(one_did_not_move[big])              # and only where a sum was exactly 0
    assert np.all(np.abs(diff[big] - cfg.lr) < 0.01 * cfg.lr)
    assert diff[~big].max() < 0.01 * cfg.lr


def test_bad_stage_is_refused():
    with pytest.raises(ValueError, match="stage"):
        zero_bytes_per_param(4, 2)


@pytest.mark.parametrize("prefetch", [False, True])
def test_stage_3_with_prefetch_is_stage_3_bit_for_bit_and_overlaps_only_when_asked(prefetch):
    """The prefetching step gathers the same shards (direct allgather: N-1 shards per rank, the
    ring's bytes) and reduce-scatters the same gradients: run_zero's stage 3 after one step, bit
    for bit, with the same bytes. Its parameter sends run during a backward layer's compute only
    with prefetch; without it each gather is waited for before its layer computes."""
    from course_lib.data_parallel import overlap

    cfg = ZeroConfig(steps=1)
    with cl.Cluster(4) as cluster:
        reference = run_zero(cluster, 3, cfg)
        run = run_zero3_prefetch(cluster, cfg, prefetch)
    assert np.array_equal(run.master, reference.master)
    assert run.stats.total_bytes == reference.bytes_total
    for rank, (start, backward_end, _) in enumerate(run.spans):
        share = overlap.overlap_fraction(run.timeline, rank, start, backward_end)
        assert (share > 0) == prefetch, (rank, share)


def test_the_prefetch_model_hides_every_gather_but_the_first_when_gathers_are_shorter_than_compute():
    cfg = ZeroConfig(steps=1)
    L = len(cfg.widths) - 1
    compute = L * (PREFETCH_FORWARD_S + PREFETCH_BACKWARD_S)
    without, with_ = zero3_prefetch_model(cfg, 4, False), zero3_prefetch_model(cfg, 4, True)
    assert without > compute + 2 * L * PREFETCH_LATENCY_S
    assert compute + PREFETCH_LATENCY_S < with_ < compute + 1.1 * PREFETCH_LATENCY_S
