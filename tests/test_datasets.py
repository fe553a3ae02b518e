"""The shared least-squares data (course_lib.datasets): pinned outputs and statistical properties.

The visible checks and the notebooks quote numbers computed from this data, so the arrays
of the calls the lessons make are pinned here. X and w_true come from the random generator
alone (plus an exact division and a sort), so their bytes are pinned; y = X w_true + noise
goes through a BLAS product whose summation order may differ between machines, so y is
pinned to 1e-12 instead.
"""
import hashlib

import numpy as np
import pytest

from course_lib import async_ps, gossip, mapreduce
from course_lib.datasets import contiguous_shards, make_least_squares, rounded_shards


def fingerprint(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


# name: (kwargs of make_least_squares, X and w_true fingerprints, y[0], y[-1], y.sum())
PINNED = {
    "lesson 01 notebook": (dict(n=20_003, d=20, noise=0.5, seed=0), "a5f4c7eab1b4cc91", "e02fc9f78cbc8e77",
                           0.5139354599176427, -4.560941521299932, -1068.5219387452496),
    "lesson 01, k = 3 outputs": (dict(n=301, d=5, k=3, seed=2), "f3366d52b090adfb", "6e49d2690e33c21f",
                                 -1.4245475135478052, 0.45563636298549604, -106.33409056390715),
    "lesson 03 notebook, shifted shards": (dict(n=3000, d=20, seed=0, n_shards=3, shard_shift=1.0),
                                           "556eb44675b2fc70", "b526bb221762d12c",
                                           -3.5285011097422645, -8.452442208862642, 398.7897319907785),
    "lesson 04 notebook, heterogeneous nodes": (dict(n=4000, d=20, seed=0, unit_rows=True, shard_shift=1.0,
                                                     shard_ranges=rounded_shards(4000, 16)),
                                                "0779f442ce855624", "23e189e5a0433554",
                                                -1.5830452740214527, -0.5494065311773523, 126.80601748760363),
    "lesson 04, sorted rows": (dict(n=480, d=6, seed=1, unit_rows=True, sort_by_first_feature=True),
                               "76433a980639f18c", "3ee78cdc6d2447ca",
                               0.49896809081202503, 0.5554439346741056, 51.76070866489134),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_lessons_data_is_pinned(name):
    kwargs, x_print, w_print, y_first, y_last, y_sum = PINNED[name]
    X, y, w_true = make_least_squares(**kwargs)
    assert fingerprint(X) == x_print and fingerprint(w_true) == w_print
    scale = np.abs(y).max()
    assert np.allclose([y.ravel()[0], y.ravel()[-1]], [y_first, y_last], rtol=0, atol=1e-12 * scale)
    assert abs(y.sum() - y_sum) <= 1e-12 * scale * y.size


def test_every_lesson_uses_the_same_maker():
    assert mapreduce.make_least_squares is make_least_squares
    assert async_ps.make_least_squares is make_least_squares
    node_problem = gossip.make_least_squares(103, 4, 5, noise=0.2, iid=False, seed=3, heterogeneity=0.5)
    X, y, _ = make_least_squares(103, 4, noise=0.2, seed=3, unit_rows=True, sort_by_first_feature=True,
                                 shard_shift=0.5, shard_ranges=rounded_shards(103, 5))
    assert np.array_equal(node_problem.X, X) and np.array_equal(node_problem.y, y)
    assert node_problem.shards == rounded_shards(103, 5)


def test_shapes_and_keyword_only_options():
    X, y, w_true = make_least_squares(50, 4, k=3)
    assert X.shape == (50, 4) and y.shape == (50, 3) and w_true.shape == (4, 3)
    with pytest.raises(TypeError):
        make_least_squares(50, 4, 3)  # k, noise or seed? Keyword-only, so never guessed
    for bad in ((0, 3), (5, 0), (2.5, 3)):
        with pytest.raises(ValueError):
            make_least_squares(*bad)


def test_noise_level_is_the_residual_standard_deviation():
    for noise in (0.0, 0.1, 2.0):
        X, y, w_true = make_least_squares(20_000, 5, noise=noise, seed=1)
        residual = y - X @ w_true
        assert abs(residual.std() - noise) <= 0.02 * noise + 1e-12
        assert abs(residual.mean()) <= 4 * noise / np.sqrt(len(y)) + 1e-12


def test_unit_rows_have_unit_expected_norm():
    X, _, _ = make_least_squares(5000, 40, seed=2, unit_rows=True)
    assert abs(np.mean(np.sum(X * X, axis=1)) - 1.0) < 0.02
    X_plain, _, _ = make_least_squares(5000, 40, seed=2)
    assert np.array_equal(X, X_plain / np.sqrt(40))


def test_shard_shift_gives_each_shard_its_own_truth():
    n, d, shift = 6000, 4, 1.5
    X0, y0, w0 = make_least_squares(n, d, noise=0.01, seed=4, n_shards=3)
    X, y, w_true = make_least_squares(n, d, noise=0.01, seed=4, n_shards=3, shard_shift=shift)
    # The shift is drawn after the noise: X, w_true and the noise are those of the unshifted data.
    assert np.array_equal(X, X0) and np.array_equal(w_true, w0)
    optima = []
    for start, stop in contiguous_shards(n, 3):
        w_shard = np.linalg.lstsq(X[start:stop], y[start:stop], rcond=None)[0]
        w_plain = np.linalg.lstsq(X0[start:stop], y0[start:stop], rcond=None)[0]
        assert np.linalg.norm(w_plain - w_true) < 0.01                  # unshifted: every shard finds w_true
        assert 0.3 * shift * np.sqrt(d) < np.linalg.norm(w_shard - w_true) < 3 * shift * np.sqrt(d)
        optima.append(w_shard)
    assert min(np.linalg.norm(a - b) for a in optima for b in optima if a is not b) > 0.3 * shift


def test_sorted_rows_make_shards_see_different_inputs():
    n, m = 4000, 4
    X_iid, y_iid, _ = make_least_squares(n, 3, seed=5)
    X, y, _ = make_least_squares(n, 3, seed=5, sort_by_first_feature=True)
    order = np.argsort(X_iid[:, 0], kind="stable")
    assert np.array_equal(X, X_iid[order]) and np.array_equal(y, y_iid[order])   # the same rows, reordered
    iid_means = [X_iid[a:b, 0].mean() for a, b in contiguous_shards(n, m)]
    sorted_means = [X[a:b, 0].mean() for a, b in contiguous_shards(n, m)]
    assert max(np.abs(iid_means)) < 0.15                                         # every shard sees N(0, 1)
    assert np.all(np.diff(sorted_means) > 0.5)                                   # each shard its own range


@pytest.mark.parametrize("n,m", [(10, 3), (103, 5), (7, 7), (100, 4), (3, 5)])
def test_shard_rules_cover_the_rows(n, m):
    assert contiguous_shards(n, m) == [(int(s[0]), int(s[-1]) + 1) if len(s) else (n, n)
                                       for s in np.array_split(np.arange(n), m)]
    for shards in (contiguous_shards(n, m), rounded_shards(n, m)):
        assert shards[0][0] == 0 and shards[-1][1] == n and len(shards) == m
        assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
        sizes = [b - a for a, b in shards]
        assert max(sizes) - min(sizes) <= 1


def test_shard_ranges_are_checked():
    with pytest.raises(ValueError, match="not both"):
        make_least_squares(10, 2, n_shards=2, shard_shift=1.0, shard_ranges=[(0, 10)])
    with pytest.raises(ValueError, match="within rows"):
        make_least_squares(10, 2, shard_shift=1.0, shard_ranges=[(0, 11)])
