"""Lesson 08's mixed precision: the loss-scaling rule, and fp16 data-parallel training on real
workers against an fp32 single process, fp16's smallest subnormal and the allreduce's bytes."""
import numpy as np
import pytest

import course_lib as cl
from course_lib.data_parallel import mixed_precision as mpx
from course_lib.model_parallel.mlp import deep_forward_backward

STEPS, LR, TARGET_SCALE = 120, 1e-3, 1e-3


def test_update_scale_halves_and_skips_on_overflow_and_doubles_after_n_clean_steps():
    assert mpx.update_scale(1024.0, 2, True, 3) == mpx.ScaleUpdate(512.0, 0, True)
    assert mpx.update_scale(1024.0, 0, False, 3) == mpx.ScaleUpdate(1024.0, 1, False)
    assert mpx.update_scale(1024.0, 1, False, 3) == mpx.ScaleUpdate(1024.0, 2, False)
    assert mpx.update_scale(1024.0, 2, False, 3) == mpx.ScaleUpdate(2048.0, 0, False)


def test_scaler_follows_the_rule_over_a_sequence_with_pytorch_defaults():
    s = mpx.DynamicLossScaler(growth_interval=2)
    assert mpx.DynamicLossScaler().scale == 2.0 ** 16 and mpx.DynamicLossScaler().growth_interval == 2000
    seen = []
    for overflow in [False, False, False, True, False, True, False, False]:
        seen.append((s.update(overflow), s.scale, s.clean_steps))
    S = 2.0 ** 16
    assert seen == [(False, S, 1), (False, 2 * S, 0), (False, 2 * S, 1), (True, S, 0),
                    (False, S, 1), (True, S / 2, 0), (False, S / 2, 1), (False, S, 0)]


def test_an_overflowing_gradient_leaves_the_weights_and_adam_untouched():
    layers, _, _ = mpx.small_target_problem(8, [4, 5, 1], TARGET_SCALE)
    state = mpx.MixedPrecisionState.from_layers(layers, lr=1e-2)
    before = state.master.copy()
    g = np.ones(state.master.size, np.float16)
    g[3] = np.inf
    assert state.apply(g, 2.0) is True
    assert np.array_equal(state.master, before) and state.adam.t == 0
    assert state.apply(np.ones_like(g), 2.0) is False and state.adam.t == 1


@pytest.fixture(scope="module")
def runs():
    layers, X, T = mpx.small_target_problem(128, [16, 16, 16, 1], TARGET_SCALE)
    with cl.Cluster(2) as cluster:
        out = {
            "none": mpx.train_data_parallel(cluster, layers, X, T, STEPS, LR, label="none"),
            "dynamic": mpx.train_data_parallel(cluster, layers, X, T, STEPS, LR,
                                               scaler=mpx.DynamicLossScaler(growth_interval=5)),
            "fp32": mpx.train_data_parallel(cluster, layers, X, T, STEPS, LR, precision="fp32"),
        }
    out["serial"] = mpx.train_fp32_serial(layers, X, T, STEPS, LR)
    out["problem"] = (layers, X, T)
    return out


def test_fp16_with_dynamic_scaling_trains_like_fp32_in_one_process(runs):
    dyn, serial = runs["dynamic"].losses, runs["serial"]
    assert serial[-1] < 0.3 * serial[0]
    np.testing.assert_allclose(dyn, serial, rtol=0.05)
    np.testing.assert_allclose(runs["fp32"].losses, serial, rtol=1e-4)  # fp32 data parallel = one process


def test_the_scaler_grew_until_overflow_then_skipped_and_halved(runs):
    dyn = runs["dynamic"]
    assert dyn.scales[0] == 2.0 ** 16 and dyn.scales.max() > 2.0 ** 20
    skips = np.flatnonzero(dyn.skipped)
    assert len(skips) >= 1
    for k in skips[skips < STEPS - 1]:
        assert dyn.scales[k + 1] == dyn.scales[k] / 2


def test_without_scaling_the_hidden_gradients_underflow_and_training_stalls(runs):
    none, serial = runs["none"], runs["serial"]
    assert none.zero_fraction.mean() > 0.5 and runs["dynamic"].zero_fraction.mean() < 0.01
    assert none.losses[-1] > 2 * serial[-1]
    assert not none.skipped.any() and np.all(none.scales == 1.0)


def test_underflow_fraction_matches_fp16_smallest_subnormal_on_the_exact_gradient(runs):
    """Step 0 (same weights everywhere): the fraction of zero fp16 entries is the fraction of the
    float64 gradient below half of fp16's smallest subnormal (which rounds to 0), per shard."""
    layers, X, T = runs["problem"]
    fractions = []
    for shard in np.array_split(np.arange(len(X)), 2):
        _, grads = deep_forward_backward(layers, X[shard], T[shard], batch_total=len(X))
        g = np.concatenate([a.ravel() for dW, db in grads for a in (dW, db)])
        fractions.append(np.mean(np.abs(g) < mpx.FP16_SMALLEST_SUBNORMAL / 2))
    assert abs(runs["none"].zero_fraction[0] - np.mean(fractions)) < 0.02


def test_the_fp16_allreduce_moves_half_the_bytes_of_the_fp32_one(runs):
    fp16, fp32 = runs["dynamic"], runs["fp32"]
    assert np.all(fp16.allreduce_bytes == fp16.allreduce_bytes[0])
    assert fp16.allreduce_bytes[0] * 2 == fp32.allreduce_bytes[0]
    # p = 2: each rank sends its n fp16 values once (2 bytes each)
    assert fp16.allreduce_bytes[0] == 2 * 2 * fp16.n_params
    assert fp16.total_bytes == STEPS * fp16.allreduce_bytes[0]


def test_fp16_moves_half_the_bytes_at_n_5_even_where_the_default_would_switch_algorithm():
    """20,000 parameters: fp32's 80 KB are above the default allreduce's 64 KiB switch and fp16's
    40 KB below it, so by default the two would run different algorithms (at N = 5, recursive
    doubling's 10 n items against the ring's 8 n: 62.5 %). Both run the ring: exactly half, and
    each is the ring's 2 (N-1) n x itemsize over all ranks."""
    layers, X, T = mpx.small_target_problem(20, [99, 200, 1], TARGET_SCALE)
    n_params = sum(W.size + b.size for W, b in layers)
    assert 32 * 1024 < 2 * n_params < 64 * 1024 <= 4 * n_params
    with cl.Cluster(5) as cluster:
        fp16 = mpx.train_data_parallel(cluster, layers, X, T, 1, LR, scaler=mpx.DynamicLossScaler())
        fp32 = mpx.train_data_parallel(cluster, layers, X, T, 1, LR, precision="fp32")
        default16 = mpx.train_data_parallel(cluster, layers, X, T, 1, LR, scaler=mpx.DynamicLossScaler(),
                                            algorithm=None)
    assert fp16.allreduce_bytes[0] == 2 * 4 * n_params * 2
    assert fp32.allreduce_bytes[0] == 2 * 4 * n_params * 4
    # what the default did: recursive doubling on the fp16 payload, more than the ring's bytes
    assert default16.allreduce_bytes[0] / fp32.allreduce_bytes[0] == pytest.approx(0.625)


def test_bf16_round_is_round_to_nearest_even_on_8_significant_bits():
    """Against the float64 arithmetic: frexp's mantissa in [0.5, 1) times 2^8, rounded half to
    even (np.round), for normal float32 values of every magnitude fp32 has, ties included."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20_000) * np.exp2(rng.integers(-110, 110, 20_000))).astype(np.float32)
    ties = np.float32(1 + 2.0 ** -8) * np.float32([1, -3, 2.0 ** -100])   # exactly halfway between two bf16
    x = np.concatenate([x, ties, np.float32([1 + 3 * 2.0 ** -8])])
    m, e = np.frexp(x.astype(np.float64))
    reference = np.ldexp(np.round(m * 2 ** 8), e - 8)
    assert np.array_equal(mpx.bf16_round(x).astype(np.float64), reference)
    assert mpx.bf16_round(np.float32([1 + 2.0 ** -8]))[0] == 1.0                   # tie to the even neighbour
    assert mpx.bf16_round(np.float32([1 + 3 * 2.0 ** -8]))[0] == 1 + 2.0 ** -6     # and up to the even one
    assert np.array_equal(mpx.bf16_decode(mpx.bf16_encode(x)), mpx.bf16_round(x))
    assert mpx.bf16_encode(x).dtype == np.uint16


def test_bf16_has_fp32s_range_where_fp16_flushes_to_zero():
    g = np.float32([1e-9, 3e-20, 1e-37, -2e-8])
    assert np.all(g.astype(np.float16)[:3] == 0)
    assert np.all(mpx.bf16_round(g) != 0)
    assert np.all(np.abs(mpx.bf16_round(g) / g - 1) <= 2.0 ** -8)   # unit roundoff of 8 significant bits
    assert mpx.bf16_round(np.float32([np.nan]))[0] != mpx.bf16_round(np.float32([np.nan]))[0]


def test_bf16_without_loss_scaling_trains_like_fp32_and_moves_fp16s_bytes(runs):
    """No scaler: nothing underflows (fp16 without scaling loses most entries), the loss follows
    the single-process fp32 baseline, and the bf16 wire form is 2 bytes an element."""
    layers, X, T = runs["problem"]
    with cl.Cluster(2) as cluster:
        bf16 = mpx.train_data_parallel(cluster, layers, X, T, STEPS, LR, precision="bf16")
    assert bf16.zero_fraction.max() == 0 and runs["none"].zero_fraction.mean() > 0.5
    assert not bf16.skipped.any()
    np.testing.assert_allclose(bf16.losses, runs["serial"], rtol=0.03)
    assert np.array_equal(bf16.allreduce_bytes, runs["dynamic"].allreduce_bytes)


def test_the_bf16_ring_sum_is_the_serial_bf16_sum_of_the_same_values():
    """Two ranks: a ring allreduce adds the two contributions once, in float32, rounded to bf16."""
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal(1000).astype(np.float32) * 1e-12 for _ in range(2)]

    def worker(comm, parts):
        return mpx.bf16_decode(comm.allreduce(mpx.bf16_encode(parts[comm.rank]), op=mpx.BF16_SUM,
                                              algorithm="ring"))

    with cl.Cluster(2) as cluster:
        res = list(cluster.run(worker, parts))
    expected = mpx.bf16_round(mpx.bf16_round(parts[0]) + mpx.bf16_round(parts[1]))
    for r in res:
        assert np.array_equal(r, expected)
