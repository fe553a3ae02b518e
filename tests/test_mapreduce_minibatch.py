"""Minibatch SGD on the MapReduce workers (lesson 01, section 7): the same iterates as one process
drawing the same batches, the same words per iteration as the full batch, and the gradient noise
(N - B) / (N - 1) * sigma^2 / B."""
from __future__ import annotations

import numpy as np
import pytest

from course_lib import Cluster, Fault
from course_lib.mapreduce import LeastSquares, make_least_squares, mapreduce_gd, minibatch, sgd_serial
from course_lib.mapreduce.serial import batch_counts, shard_ranges

from runtime_checks import assert_clean


@pytest.fixture(scope="module")
def cluster():
    with Cluster(4, timeout=60) as c:     # a server and 3 workers
        yield c
    assert_clean()


@pytest.fixture(scope="module")
def data():
    X, y, _ = make_least_squares(1001, 6, noise=0.5, seed=3)
    return X, y


def test_the_batches_are_seeded_distinct_sorted_rows():
    a, b = minibatch(1001, 64, 5, seed=1), minibatch(1001, 64, 5, seed=1)
    assert np.array_equal(a, b) and len(np.unique(a)) == 64 and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, minibatch(1001, 64, 6, seed=1))       # another iteration, another batch
    assert sum(batch_counts(a, shard_ranges(1001, 3))) == 64
    with pytest.raises(ValueError):
        minibatch(10, 11, 0)


@pytest.mark.parametrize("reduce", ["sum", "mean", "collect"])
def test_mapreduce_sgd_equals_one_process_sgd(cluster, data, reduce):
    X, y = data
    res = mapreduce_gd(cluster, "least_squares", X, y, iters=30, batch_size=7, batch_seed=2, reduce=reduce)
    w, batch_losses, losses = sgd_serial("least_squares", X, y, 7, iters=30, seed=2)
    np.testing.assert_allclose(res.w, w, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.losses, batch_losses, rtol=0, atol=1e-12)
    # with 7 rows of 1001 over 3 shards, some iterations leave a shard without a row
    assert any(0 in batch_counts(minibatch(1001, 7, t, 2), shard_ranges(1001, 3)) for t in range(30))
    full = mapreduce_gd(cluster, "least_squares", X, y, iters=30, reduce=reduce)
    if reduce != "collect":   # collect sends the batch's rows: fewer words than the full batch's
        assert res.words_per_iteration == full.words_per_iteration
    assert losses[-1] > LeastSquares().loss(X, y, LeastSquares().solution(X, y))


def test_a_killed_worker_is_re_executed_on_the_same_batch(cluster, data):
    X, y = data
    clean = mapreduce_gd(cluster, "least_squares", X, y, iters=8, batch_size=50)
    hurt = mapreduce_gd(cluster, "least_squares", X, y, iters=8, batch_size=50, faults={2: Fault("kill", step=3)})
    assert hurt.reexecuted and np.array_equal(hurt.w, clean.w)


def test_the_noise_of_a_minibatch_gradient_is_the_sampling_formula(data):
    X, y = data
    n, batch = len(X), 40
    w = np.zeros(X.shape[1])
    G, _ = LeastSquares().per_sample(X, y, w)
    grad = G.mean(axis=0)
    sigma2 = float(np.mean(np.sum((G - grad) ** 2, axis=1)))
    predicted = (n - batch) / (n - 1) * sigma2 / batch
    draws = np.array([G[minibatch(n, batch, t)].mean(axis=0) for t in range(2000)])
    measured = float(np.mean(np.sum((draws - grad) ** 2, axis=1)))
    assert measured == pytest.approx(predicted, rel=0.1)
    np.testing.assert_allclose(draws.mean(axis=0), grad, atol=4 * np.sqrt(predicted / 2000))   # unbiased
