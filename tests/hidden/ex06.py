"""Lesson 06: instructor-only checks (more worker counts, uneven shards, offsets, a longer pipeline,
in-graph replicas on 1, 2 and 4 workers)."""
import numpy as np

from course_lib.grading import hidden_check
from course_lib.grading.registry import hidden_property
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


#: What part of a tensor-parallel check failed: its values or the bytes its workers sent.
TP_PARTS = (("gathered along the wrong axis", "the activations are gathered along the wrong axis"),
            ("bytes", "the bytes the workers send"), ("yours sent nothing", "the workers send nothing"),
            ("dW2_shard", "the weight gradient"),
            ("db2", "the bias gradient"), ("dA_shard", "the activation gradient"), ("should return", "the values"))


@hidden_check("ex06_1", case="other worker counts, hidden width not a multiple of p")
def more_workers(ns):
    f = ns["column_parallel_forward"]
    with hidden_property("wrong for a single worker", TP_PARTS):
        params, X, _, cache = network(7, seed=1)
        check_column_forward(f, 1, True, params, X, cache["A"])
    # 10 over 4: 3, 3, 2, 2; a batch of 8, so the activations and the weights (with the biases) differ in size
    params, X, _, cache = network(10, seed=4, batch=8)
    with hidden_property("wrong without gather when the hidden width is not a multiple of the number of workers",
                         TP_PARTS):
        check_column_forward(f, 4, False, params, X, cache["A"])
    with hidden_property("wrong with gather when the hidden width is not a multiple of the number of workers",
                         TP_PARTS):
        check_column_forward(f, 4, True, params, X, cache["A"])


@hidden_check("ex06_2", case="other worker counts, hidden width not a multiple of p")
def more_workers_forward(ns):
    f = ns["row_parallel_forward"]
    with hidden_property("wrong for a single worker", TP_PARTS):
        params, X, _, cache = network(7, seed=11)
        check_row_forward(f, 1, params, cache["A"], cache["Y"])
    for p, d_hidden in ((2, 7), (4, 10)):
        with hidden_property("wrong when the hidden width is not a multiple of the number of workers", TP_PARTS):
            params, X, _, cache = network(d_hidden, seed=10 + p)
            check_row_forward(f, p, params, cache["A"], cache["Y"])


@hidden_check("ex06_3", case="other worker counts, hidden width not a multiple of p")
def more_workers_backward(ns):
    f = ns["row_parallel_backward"]
    for p, d_hidden in ((2, 7), (4, 10)):
        with hidden_property("wrong when the hidden width is not a multiple of the number of workers", TP_PARTS):
            params, X, T, cache = network(d_hidden, seed=20 + p)
            g = backward(params, cache, T)
            dY = (cache["Y"] - T) / X.shape[0]
            check_row_backward(f, p, params, cache["A"], dY, g["W2"], g["b2"], dY @ params["W2"].T)


@hidden_check("ex06_4", case="other stage and micro-batch counts, one stage, one micro-batch")
def more_shapes(ns):
    f = ns["predicted_bubble"]
    with hidden_property("wrong for a pipeline of a single stage"):
        check_predicted(f, [(1, m, predicted_bubble(1, m)) for m in (1, 3, 16, 64)])
    with hidden_property("wrong for a single micro-batch"):
        check_predicted(f, [(p, 1, predicted_bubble(p, 1)) for p in (2, 5, 8)])
    with hidden_property("wrong for other numbers of stages and micro-batches"):
        check_predicted(f, [(p, m, predicted_bubble(p, m)) for p in (2, 5, 8) for m in (3, 16, 64)])


@hidden_check("ex06_5", case="a longer pipeline, timelines not starting at zero, a real pipeline run")
def offsets_and_a_longer_pipeline(ns):
    f = ns["measured_bubble"]
    with hidden_property("wrong on the ideal timeline of a longer pipeline"):
        check_measured(f, 4, 8, predicted_bubble(4, 8))
    with hidden_property("wrong when the first compute event does not start at time zero"):
        check_measured(f, 4, 8, predicted_bubble(4, 8), offset=2.5)
    with hidden_property("wrong for a single micro-batch when the first compute event does not start at time zero"):
        check_measured(f, 2, 1, predicted_bubble(2, 1), offset=0.7)
    # the same real timeline the student's function was given, judged by the reference: exact, whatever the load
    with hidden_property("not the idle fraction of the compute events of a real pipeline run"):
        got, events = check_measured_real(f, 4, 6)
        want = measured_bubble(Timeline(Event(*e) for e in events), 4)
        assert abs(got - want) <= 1e-9, (
            f"on a real 4-stage GPipe run with m=6, measured_bubble gave {got:.6f}; the idle fraction of that run's "
            f"compute events is {want:.6f}.")


#: What part of ex06_6's check failed, read from its message.
GRAPH_PARTS = (("should return a list of Node", "not a list of nodes"),
               ("is placed on device", "a node is placed on a device that is not a worker"),
               ("has inputs", "a node reads a node that does not come before it"),
               ("two nodes are named", "two nodes have the same name"),
               ("no node named", "no node is named grad"),
               ("the node 'grad' should hold",
                "the gradient node does not hold the mean-loss gradient of the whole batch"),
               ("ran no node", "some worker runs no replica"),
               ("should go through mp.forward once", "a replica does not work on its own part of the batch only"),
               ("bytes", "other bytes travel than the parameters out and the replicas' gradients back"))


@hidden_check("ex06_6", case="other replica counts, batch not a multiple of p")
def other_replica_counts_and_uneven_shards(ns):
    f = ns["in_graph_data_parallel"]
    uneven = "wrong when the batch size is not a multiple of the number of replicas"
    for p, batch, d_hidden, kind in ((2, 5, 4, uneven), (4, 10, 6, uneven),
                                     (1, 3, 2, "wrong for a single replica")):     # shards 3+2, 3+3+2+2, one replica
        with hidden_property(kind, GRAPH_PARTS):
            params, X, T, cache = network(d_hidden, seed=30 + p, d_in=3, d_out=2, batch=batch)
            g = backward(params, cache, T)
            grad = np.concatenate([g[k].ravel() for k in ("W1", "b1", "W2", "b2")])
            check_in_graph(f, p, params, X, T, grad)
