"""Lesson 08's model layout and Adam, against plain formulas."""
import numpy as np
import pytest

from course_lib.data_parallel.model import Adam, flatten_layers, layer_ranges, unflatten_layers
from course_lib.model_parallel.mlp import init_deep


def test_flatten_and_unflatten_are_inverse_and_ranges_cover_the_vector():
    layers = init_deep([5, 7, 3, 2], seed=3)
    flat = flatten_layers(layers)
    back = unflatten_layers(flat, layers)
    for (W, b), (W2, b2) in zip(layers, back):
        assert np.array_equal(W, W2) and np.array_equal(b, b2)
    ranges = layer_ranges(layers)
    assert ranges[0][0] == 0 and ranges[-1][1] == flat.size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    W, b = layers[1]
    start, end = ranges[1]
    assert np.array_equal(flat[start:end], np.concatenate([W.ravel(), b]))
    with pytest.raises(ValueError, match="flat vector of"):
        unflatten_layers(flat[:-1], layers)


def reference_adam(w, grads, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """Kingma and Ba (2015), Algorithm 1, in float64."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return w


def test_adam_matches_the_paper_and_holds_8_bytes_of_state_per_parameter():
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=50)
    grads = [rng.normal(size=50) for _ in range(10)]
    w = w0.astype(np.float32)
    opt = Adam(lr=0.01)
    for g in grads:
        opt.step(w, g.astype(np.float32))
    np.testing.assert_allclose(w, reference_adam(w0, grads, lr=0.01), rtol=0, atol=1e-5)
    assert opt.t == 10 and opt.state_bytes() == 8 * 50


def test_adam_on_shards_equals_adam_on_the_whole_vector():
    """What ZeRO relies on: Adam is elementwise, so each rank may update its own slice."""
    rng = np.random.default_rng(1)
    w_whole = rng.normal(size=30).astype(np.float32)
    w_parts = w_whole.copy()
    whole, parts = Adam(lr=0.05), [Adam(lr=0.05) for _ in range(3)]
    for _ in range(5):
        g = rng.normal(size=30).astype(np.float32)
        whole.step(w_whole, g)
        for k, opt in enumerate(parts):
            sl = slice(10 * k, 10 * (k + 1))
            view = w_parts[sl]
            opt.step(view, g[sl])
    assert np.array_equal(w_whole, w_parts)


def test_adam_rejects_a_gradient_of_another_length():
    opt = Adam().init(4)
    with pytest.raises(ValueError, match="moments"):
        opt.step(np.zeros(4, np.float32), np.zeros(5, np.float32))
