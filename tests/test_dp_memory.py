"""Lesson 08's memory anatomy: bytes measured in worker processes against ZeRO's formula."""
import numpy as np
import pytest

import course_lib as cl
from course_lib.data_parallel import memory as mem
from course_lib.model_parallel.mlp import init_deep

WIDTHS = [12, 40, 24, 3]


@pytest.fixture(scope="module")
def anatomy():
    with cl.Cluster(2) as cluster:
        return mem.measure_memory(cluster, init_deep(WIDTHS, seed=0), batches=(8, 16, 48))


def test_each_category_holds_its_bytes_per_parameter_on_every_rank(anatomy):
    n = sum(a * b + b for a, b in zip(WIDTHS[:-1], WIDTHS[1:]))
    assert [s.rank for s in anatomy.states] == [0, 1]
    for state in anatomy.states:
        assert state.n_params == n
        assert state.measured == {"fp16 parameters": 2 * n, "fp16 gradients": 2 * n,
                                  "fp32 master weights": 4 * n, "Adam m": 4 * n, "Adam v": 4 * n}
        assert state.measured == state.formula and state.bytes_per_param == 16.0


def test_the_worker_really_trained_a_step_before_it_was_measured():
    """The state is not an empty shell: Adam has taken its step and its moments are non-zero."""
    with cl.Cluster(2) as cluster:
        res = cluster.run(lambda comm: _one_step_state(comm))
    for t, m_norm in res:
        assert t == 1 and m_norm > 0


def _one_step_state(comm):
    from course_lib.data_parallel.mixed_precision import MixedPrecisionState
    state = MixedPrecisionState.from_layers(init_deep(WIDTHS, seed=0), lr=1e-3)
    rng = np.random.default_rng(comm.rank)
    state.forward_backward(rng.normal(size=(8, 12)), rng.normal(size=(8, 3)), 1024.0, 16)
    state.apply(comm.allreduce(state.grads16), 1024.0)
    return state.adam.t, float(np.linalg.norm(state.adam.m))


def test_activations_are_the_input_and_every_layer_output_and_grow_linearly(anatomy):
    for a in anatomy.activations:
        assert a.kept == tuple((a.batch, w) for w in WIDTHS)
        assert a.measured == a.formula == a.batch * sum(WIDTHS) * 2
    per_row = [a.measured / a.batch for a in anatomy.activations]
    assert per_row == [per_row[0]] * len(per_row)


def test_plot_draws_both_panels(anatomy):
    import matplotlib
    matplotlib.use("Agg")
    fig = mem.plot_memory(anatomy)
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 3
