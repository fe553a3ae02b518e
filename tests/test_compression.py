"""Top-k sparsification with and without error feedback on real processes."""
import numpy as np
import pytest

import course_lib as cl
from course_lib.data_parallel.compression import (
    CompressionConfig,
    dense_bytes_per_step,
    densify,
    run_compression,
    topk_bytes_per_step,
    topk_sparsify,
)

CFG = CompressionConfig(steps=200)


@pytest.fixture(scope="module")
def runs():
    with cl.Cluster(4) as cluster:
        return {m: run_compression(cluster, m, CFG) for m in ("dense", "topk", "topk_ef")}


def test_topk_keeps_the_largest_entries():
    u = np.array([0.1, -5.0, 2.0, 0.0, 3.0])
    pairs = topk_sparsify(u, 2)
    assert list(pairs["index"]) == [1, 4]
    assert np.array_equal(densify([pairs, pairs], 5), [0, -10.0, 0, 0, 6.0])


def test_error_feedback_converges_where_plain_topk_stalls(runs):
    dense, plain, ef = runs["dense"].suboptimality, runs["topk"].suboptimality, runs["topk_ef"].suboptimality
    assert dense[-1] < 0.02 * dense[0]
    assert plain[-1] > 0.7 * plain[0]            # stalls: under 30% of the way after 200 steps
    assert ef[-1] < 0.1 * plain[-1]              # error feedback: 10x closer to the optimum
    assert ef[-1] < 0.1 * ef[0]


def test_bytes_on_the_wire_are_the_formulas(runs):
    assert runs["dense"].bytes_total == CFG.steps * dense_bytes_per_step(CFG.dim, 4)
    for m in ("topk", "topk_ef"):
        assert runs[m].bytes_total == CFG.steps * topk_bytes_per_step(CFG.k, 4)
    ratio = runs["dense"].bytes_total / runs["topk"].bytes_total
    assert ratio == CFG.dim / (4 * CFG.k)
