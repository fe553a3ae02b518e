"""Lesson 06: instructor-only checks (more worker counts, uneven shards, offsets, a longer pipeline,
in-graph replicas on 1, 2 and 4 workers)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.model_parallel import backward, forward, init_mlp, make_data
from course_lib.questions.ex06 import (
    check_column_forward,
    check_in_graph,
    check_measured,
    check_measured_real,
    check_predicted,
    check_row_backward,
    check_row_forward,
)
from course_lib.reference.ex06 import measured_bubble, predicted_bubble
from course_lib.runtime.trace import Event, Timeline


def network(d_hidden, seed=0, d_in=5, d_out=3, batch=6):
    params = init_mlp(d_in, d_hidden, d_out, seed=seed)
    X, T = make_data(batch, d_in, d_out, seed=seed + 1)
    cache = forward(params, X)
    return params, X, T, cache


@hidden_check("ex06_1", case="other worker counts, hidden width not a multiple of p")
def more_workers(ns):
    f = ns["column_parallel_forward"]
    for p, gather, d_hidden in ((1, True, 7), (4, True, 10), (4, False, 10)):    # 10 over 4: 3, 3, 2, 2
        params, X, _, cache = network(d_hidden, seed=p)
        check_column_forward(f, p, gather, params, X, cache["A"])


@hidden_check("ex06_2", case="other worker counts, hidden width not a multiple of p")
def more_workers_forward(ns):
    f = ns["row_parallel_forward"]
    for p, d_hidden in ((1, 7), (2, 7), (4, 10)):
        params, X, _, cache = network(d_hidden, seed=10 + p)
        check_row_forward(f, p, params, cache["A"], cache["Y"])


@hidden_check("ex06_3", case="other worker counts, hidden width not a multiple of p")
def more_workers_backward(ns):
    f = ns["row_parallel_backward"]
    for p, d_hidden in ((2, 7), (4, 10)):
        params, X, T, cache = network(d_hidden, seed=20 + p)
        g = backward(params, cache, T)
        dY = (cache["Y"] - T) / X.shape[0]
        check_row_backward(f, p, params, cache["A"], dY, g["W2"], g["b2"], dY @ params["W2"].T)


@hidden_check("ex06_4", case="other stage and micro-batch counts")
def more_shapes(ns):
    check_predicted(
        ns["predicted_bubble"], [(p, m, predicted_bubble(p, m)) for p in (1, 2, 5, 8) for m in (1, 3, 16, 64)]
    )


@hidden_check("ex06_5", case="timelines not starting at zero, a real pipeline run")
def offsets_and_a_longer_pipeline(ns):
    f = ns["measured_bubble"]
    check_measured(f, 4, 8, predicted_bubble(4, 8), offset=2.5)
    check_measured(f, 2, 1, predicted_bubble(2, 1), offset=0.7)
    # the same real timeline the student's function was given, judged by the reference: exact, whatever the load
    got, events = check_measured_real(f, 4, 6, predicted_bubble(4, 6))
    want = measured_bubble(Timeline(Event(*e) for e in events), 4)
    assert abs(got - want) <= 1e-9, (
        f"on a real 4-stage GPipe run with m=6, measured_bubble gave {got:.6f}; the idle fraction of that run's "
        f"compute events is {want:.6f}.")


@hidden_check("ex06_6", case="other replica counts, batch not a multiple of p")
def other_replica_counts_and_uneven_shards(ns):
    f = ns["in_graph_data_parallel"]
    for p, batch, d_hidden in ((2, 5, 4), (4, 10, 6), (1, 3, 2)):     # shards 3+2, 3+3+2+2, one replica
        params, X, T, cache = network(d_hidden, seed=30 + p, d_in=3, d_out=2, batch=batch)
        g = backward(params, cache, T)
        grad = np.concatenate([g[k].ravel() for k in ("W1", "b1", "W2", "b2")])
        check_in_graph(f, p, params, X, T, grad)
