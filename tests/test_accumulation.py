"""Gradient accumulation and activation checkpointing (course_lib.data_parallel.accumulation)
against single-process baselines: the same gradient and update, the bytes and the memory held."""
import numpy as np
import pytest

import course_lib as cl
from course_lib.data_parallel import accumulation as acc
from course_lib.model_parallel import mlp

WIDTHS = (12, 20, 20, 20, 20, 20, 20, 20, 4)       # 8 layers
LAYERS32 = [(W.astype(np.float32), b.astype(np.float32)) for W, b in mlp.init_deep(WIDTHS, seed=0)]


def _data(rows, seed=1):
    X, T = mlp.make_data(rows, WIDTHS[0], WIDTHS[-1], seed=seed)
    return X.astype(np.float32), T.astype(np.float32)


def test_without_checkpoints_it_is_the_plain_backward_and_holds_every_activation():
    X, T = _data(16)
    loss, g, ledger, recomputed = acc.forward_backward(LAYERS32, X, T, 16)
    ref_loss, ref = mlp.deep_forward_backward(LAYERS32, X, T, 16)
    np.testing.assert_allclose(g, np.concatenate([a.ravel() for dW, db in ref for a in (dW, db)]), rtol=1e-5,
                               atol=1e-7)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert ledger.peak == 16 * sum(WIDTHS) * 4 and recomputed == 0 and ledger.held == X.nbytes


@pytest.mark.parametrize("segment", [1, 2, 3, 4, 7])
def test_checkpointing_gives_the_same_gradient_bit_for_bit_and_holds_less(segment):
    X, T = _data(16)
    _, full, full_ledger, _ = acc.forward_backward(LAYERS32, X, T, 16)
    loss, g, ledger, recomputed = acc.forward_backward(LAYERS32, X, T, 16, segment)
    assert np.array_equal(g, full)
    kept = acc.checkpoint_layers(len(LAYERS32), segment)
    assert recomputed == len(LAYERS32) + 1 - len(kept)      # every dropped activation once
    # held at most: the checkpoints plus one segment's recomputed outputs
    assert ledger.peak <= 16 * 4 * (sum(WIDTHS[i] for i in kept) + segment * max(WIDTHS))
    if segment > 1:
        assert ledger.peak < full_ledger.peak


def test_checkpoint_layers_are_segment_starts_and_the_last_segment():
    assert acc.checkpoint_layers(13, 4) == [0, 4, 8, 12, 13]
    assert acc.checkpoint_layers(8, 3) == [0, 3, 6, 7, 8]
    assert acc.checkpoint_layers(5, 1) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError):
        acc.checkpoint_layers(5, 0)


def test_measured_checkpointing_on_workers_reports_the_same_gradients():
    X, T = _data(32)
    with cl.Cluster(2) as cluster:
        res = acc.measure_checkpointing(cluster, LAYERS32, X, T, [None, 3], repeats=2)
    for rank in res:
        plain, ckpt = rank
        assert np.array_equal(plain.grad, ckpt.grad) and len(plain.seconds) == 2
        assert ckpt.peak_bytes < plain.peak_bytes and ckpt.recomputed > 0 == plain.recomputed


@pytest.mark.parametrize("k", [1, 3])
def test_accumulating_k_micro_batches_is_one_big_batch_with_one_allreduce(k):
    n, m = 2, 4
    X, T = _data(n * k * m, seed=2)
    with cl.Cluster(n) as cluster:
        ranks = acc.run_accumulation(cluster, LAYERS32, X, T, m, k, steps=3)
    serial = acc.serial_sgd(LAYERS32, X, T, steps=3)
    psi = serial.size
    for r in ranks:
        np.testing.assert_allclose(r.weights, serial, atol=1e-6)
        assert r.peak_activation_bytes == m * sum(WIDTHS) * 4            # one micro-batch, whatever k
    # one ring allreduce of Psi float32 per step: 2 (N-1) Psi x 4 bytes in all ranks, whatever k
    assert sum(r.bytes_per_step for r in ranks) == 2 * (n - 1) * psi * 4


def test_accumulation_refuses_a_batch_that_is_not_n_k_m_rows():
    X, T = _data(10)
    with cl.Cluster(2) as cluster, pytest.raises(Exception, match="N k m"):
        acc.run_accumulation(cluster, LAYERS32, X, T, 4, 2)
