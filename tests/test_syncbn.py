"""SyncBatchNorm: merged (count, mean, M2) equal the single-device statistics."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib as cl
from course_lib.collectives import ALGORITHMS
from course_lib.collectives.sim import simulate
from course_lib.collectives.sync_batchnorm import (
    MERGE,
    SyncBatchNorm,
    batch_norm,
    local_stats,
    merge_all,
    merge_stats,
    naive_stats,
)


def _shards(seed=0, p=4, d=3, noniid=True):
    rng = np.random.default_rng(seed)
    # non-iid: every worker gets a different slice of the distribution (sorted by feature 0)
    x = rng.standard_normal((p * 16 + 5, d)) * [1.0, 3.0, 0.5] + [2.0, -1.0, 10.0]
    if noniid:
        x = x[np.argsort(x[:, 0])]
    return x, np.array_split(x, p)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 20), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_merge_equals_whole_batch(sizes, seed):
    if sum(sizes) == 0:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sum(sizes), 2)) * 5 + 3
    parts = np.split(x, np.cumsum(sizes)[:-1])
    n, mean, m2 = merge_all([local_stats(s) for s in parts])
    assert n == len(x)
    assert np.allclose(mean, x.mean(0), atol=1e-12, rtol=1e-12)
    assert np.allclose(m2 / n, x.var(0), atol=1e-12, rtol=1e-10)


def test_merge_is_associative_enough_for_any_tree():
    x, shards = _shards()
    s = [local_stats(a) for a in shards]
    left = merge_stats(merge_stats(merge_stats(s[0], s[1]), s[2]), s[3])
    tree = merge_stats(merge_stats(s[0], s[1]), merge_stats(s[2], s[3]))
    for a, b in zip(left[1:], tree[1:]):
        assert np.allclose(a, b, rtol=1e-13)


@pytest.mark.parametrize("alg", ["recursive_doubling", "reduce_bcast"])
def test_sim_allreduce_with_merge_op(alg):
    x, shards = _shards(p=6)
    res, _, _ = simulate(6, lambda t: ALGORITHMS["allreduce"][alg](t, local_stats(shards[t.rank]), MERGE))
    for n, mean, m2 in res:
        assert n == len(x)
        assert np.allclose(mean, x.mean(0), atol=1e-12) and np.allclose(m2 / n, x.var(0), atol=1e-12)


def test_per_worker_statistics_differ_on_non_iid_shards():
    x, shards = _shards(noniid=True)
    gap = max(np.abs(s.mean(0) - x.mean(0))[0] for s in shards)
    assert gap > 0.5                                    # a worker's mean is far from the batch's
    _, iid = _shards(noniid=False)
    gap_iid = max(np.abs(s.mean(0) - x.mean(0))[0] for s in iid)
    assert gap_iid < gap / 2


def test_naive_variance_loses_precision_in_float32():
    rng = np.random.default_rng(3)
    x = (1e4 + rng.standard_normal((4096, 1))).astype(np.float32)     # mean 1e4, variance 1
    true = x.astype(np.float64).var(0)
    _, naive = naive_stats(x, np.float32)
    n, _, m2 = local_stats(x)
    assert abs(naive[0] - true[0]) > 0.1 * true[0]                      # E[x^2]-E[x]^2: no digit left
    assert abs(m2[0] / n - true[0]) < 1e-3 * true[0]                    # two-pass M2: fine


def _syncbn_body(comm, shards):
    bn = SyncBatchNorm(shards[0].shape[1])
    y = bn(shards[comm.rank], comm)
    return y, bn.running_mean, bn.running_var


def test_syncbn_equals_single_device_batch_norm():
    x, shards = _shards(p=4)
    single = SyncBatchNorm(3)
    y_single = single(x)
    ref = batch_norm(x, x.mean(0), x.var(0))
    assert np.allclose(y_single, ref, atol=1e-12)
    with cl.Cluster(4) as c:
        res = c.run(_syncbn_body, shards)
    y = np.concatenate([r[0] for r in res])
    assert np.max(np.abs(y - y_single)) < 1e-6
    for _, rm, rv in res:
        assert np.allclose(rm, single.running_mean, atol=1e-12)
        assert np.allclose(rv, single.running_var, atol=1e-12)
    # per-worker batch norm (what plain data parallelism does) is visibly different
    local = np.concatenate([batch_norm(s, s.mean(0), s.var(0)) for s in shards])
    assert np.max(np.abs(local - y_single)) > 0.5


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4])
def test_local_stats_are_exact_in_float32_on_2d_batches(offset):
    """Mean within one float32 step of the float64 truth at offsets up to 1e4; the variance to
    1e-6 on one device, to 1e-4 merged from four float32 summaries (each shard's mean is
    stored to half a step, 5e-4 at 1e4, and the merge squares the difference of two means)."""
    rng = np.random.default_rng(11)
    x = (offset + rng.standard_normal((4096, 5)) * [1, 2, 0.5, 3, 1]).astype(np.float32)
    truth = x.astype(np.float64)
    ulp = np.spacing(np.float32(max(offset, 1.0)))
    for parts in (1, 4):     # one device, and four workers merged
        n, mean, m2 = merge_all([local_stats(s) for s in np.array_split(x, parts)])
        assert mean.dtype == np.float32 and n == len(x)
        assert np.all(np.abs(mean - truth.mean(0)) <= ulp), (mean - truth.mean(0), ulp)
        assert np.allclose(m2 / n, truth.var(0), rtol=1e-6 if parts == 1 else 1e-4, atol=0)


def _numeric_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        old = x[idx]
        x[idx] = old + h
        up = f(x)
        x[idx] = old - h
        down = f(x)
        x[idx] = old
        g[idx] = (up - down) / (2 * h)
    return g


def test_backward_matches_finite_differences():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 3)) * [1, 3, 0.2] + [0, 4, -1]
    c = rng.standard_normal((9, 3))                     # L = sum(c * y): dL/dy = c
    bn = SyncBatchNorm(3)
    bn.weight, bn.bias = np.array([1.5, -0.5, 2.0]), np.array([0.1, 0.2, -0.3])

    def loss_x(z):
        return float((c * SyncBatchNorm.forward(_copy(bn), z)).sum())

    bn.forward(x)
    dx = bn.backward(c)
    assert np.allclose(dx, _numeric_grad(loss_x, x.copy()), atol=1e-7)
    xhat = (x - x.mean(0)) / np.sqrt(x.var(0) + bn.eps)
    assert np.allclose(bn.grad_bias, c.sum(0)) and np.allclose(bn.grad_weight, (c * xhat).sum(0))
    # dL/dx sums to zero per feature: shifting every row of a feature changes nothing
    assert np.allclose(dx.sum(0), 0, atol=1e-12)


def _copy(bn):
    other = SyncBatchNorm(len(bn.weight), bn.eps, bn.momentum)
    other.weight, other.bias = bn.weight.copy(), bn.bias.copy()
    return other


def _forward_backward(comm, shards, grads, weight, bias):
    bn = SyncBatchNorm(shards[0].shape[1])
    bn.weight, bn.bias = weight, bias
    bn(shards[comm.rank], comm)
    return bn.backward(grads[comm.rank], comm), bn.grad_weight, bn.grad_bias


def test_distributed_backward_equals_one_device_on_the_whole_batch():
    x, shards = _shards(p=4)
    rng = np.random.default_rng(8)
    dy = rng.standard_normal(x.shape)
    weight, bias = np.array([1.5, -0.5, 2.0]), np.array([0.1, 0.2, -0.3])
    single = _copy(SyncBatchNorm(3))
    single.weight, single.bias = weight, bias
    single(x)
    dx_single = single.backward(dy)
    with cl.Cluster(4) as c:
        res = c.run(_forward_backward, shards, np.array_split(dy, 4), weight, bias)
    assert np.allclose(np.concatenate([r[0] for r in res]), dx_single, atol=1e-12)
    for _, gw, gb in res:
        assert np.allclose(gw, single.grad_weight, atol=1e-12) and np.allclose(gb, single.grad_bias, atol=1e-12)
    # the backward's traffic: one allreduce of 2 x 3 float64 sums, by recursive doubling on
    # 4 ranks: 2 messages out of each rank, each carrying the 48-byte vector
    with cl.Cluster(4) as c:
        fwd = c.run(_forward_only, shards, weight, bias)
        both = c.run(_forward_backward, shards, np.array_split(dy, 4), weight, bias)
    for r in range(4):
        assert both.stats.messages_sent(r) - fwd.stats.messages_sent(r) == 2
        assert both.stats.bytes_sent(r) - fwd.stats.bytes_sent(r) == 2 * 6 * 8
    # per-worker backward (plain data parallelism) differs from the whole batch's
    local = np.concatenate([_local_dx(s, g, weight) for s, g in zip(shards, np.array_split(dy, 4))])
    assert np.max(np.abs(local - dx_single)) > 0.1


def _forward_only(comm, shards, weight, bias):
    bn = SyncBatchNorm(shards[0].shape[1])
    bn.weight, bn.bias = weight, bias
    return bn(shards[comm.rank], comm)


def _local_dx(x, dy, weight):
    bn = SyncBatchNorm(x.shape[1])
    bn.weight = weight
    bn(x)
    return bn.backward(dy)
