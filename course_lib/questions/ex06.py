"""Lesson 06 checks: tensor-parallel layers and the pipeline bubble.

Each check runs your function in real worker processes (a small Cluster) and compares
with the single-process network of :mod:`course_lib.model_parallel.mlp`.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from course_lib.grading import question
from course_lib.model_parallel import (allgather_bytes, allreduce_bytes, bubble_formula, pipeline_step,
                                       backward, forward, init_deep, init_mlp, make_data, shard_mlp)

TOL = 1e-10


def _cluster(p):
    from course_lib import Cluster
    return Cluster(p, timeout=30.0)


def _net(d_in=5, d_hidden=7, d_out=3, batch=6, seed=0):
    params = init_mlp(d_in, d_hidden, d_out, seed=seed)
    X, T = make_data(batch, d_in, d_out, seed=seed + 1)
    cache = forward(params, X)
    return params, X, T, cache, backward(params, cache, T)


def _col_worker(comm, f, params, X, gather):
    s = shard_mlp(params, comm.size, comm.rank)
    out = f(comm, X, s["W1"], s["b1"], gather)
    return np.asarray(out), s["cols"]


def _row_fwd_worker(comm, f, params, A):
    s = shard_mlp(params, comm.size, comm.rank)
    a, b = s["cols"]
    return np.asarray(f(comm, A[:, a:b], s["W2"], s["b2"]))


def _row_bwd_worker(comm, f, params, A, dY):
    s = shard_mlp(params, comm.size, comm.rank)
    a, b = s["cols"]
    out = f(comm, A[:, a:b], s["W2"], dY)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise AssertionError("row_parallel_backward must return a tuple (dW2_shard, db2, dA_shard)")
    return tuple(np.asarray(x) for x in out), s["cols"]


def _close(got, want, what):
    got = np.asarray(got)
    if got.shape != np.shape(want):
        raise AssertionError(f"{what}: shape {got.shape}, expected {np.shape(want)}")
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not err <= TOL:
        raise AssertionError(f"{what}: differs from the single-process network by {err:.3g}")


def check_column_forward(f, p, gather, d_hidden=7):
    params, X, T, cache, _ = _net(d_hidden=d_hidden)
    with _cluster(p) as cluster:
        res = cluster.run(_col_worker, f, params, X, gather)
    for r, (out, (a, b)) in enumerate(res):
        if gather:
            _close(out, cache["A"], f"rank {r} of {p}, gather=True: the full activation tanh(X W1 + b1)")
        else:
            _close(out, cache["A"][:, a:b], f"rank {r} of {p}, gather=False: columns {a}:{b} of tanh(X W1 + b1)")
    want = allgather_bytes(p, cache["A"].size) if gather else 0
    if res.stats.total_bytes != want:
        raise AssertionError(f"with p={p}, gather={gather} your workers sent {res.stats.total_bytes} bytes; "
                             f"expected {want} (" + ("one ring allgather of the shards)" if gather
                                                     else "no communication: every hidden unit is local)"))


def check_row_forward(f, p, d_hidden=7):
    params, X, T, cache, _ = _net(d_hidden=d_hidden)
    with _cluster(p) as cluster:
        res = cluster.run(_row_fwd_worker, f, params, cache["A"])
    for r, Y in enumerate(res):
        _close(Y, cache["Y"], f"rank {r} of {p}: Y = A W2 + b2 (every rank needs the whole Y; "
                              "is each partial product summed over the workers, and b2 added once?)")
    want = allreduce_bytes(p, cache["Y"].size)
    if res.stats.total_bytes != want:
        raise AssertionError(f"with p={p} your workers sent {res.stats.total_bytes} bytes; one ring "
                             f"allreduce of Y sends {want}")


def check_row_backward(f, p, d_hidden=7):
    params, X, T, cache, g = _net(d_hidden=d_hidden)
    dY = (cache["Y"] - T) / X.shape[0]
    dA = dY @ params["W2"].T
    with _cluster(p) as cluster:
        res = cluster.run(_row_bwd_worker, f, params, cache["A"], dY)
    for r, ((dW2, db2, dA_r), (a, b)) in enumerate(res):
        _close(dW2, g["W2"][a:b], f"rank {r} of {p}: dW2_shard (rows {a}:{b} of A^T dY)")
        _close(db2, g["b2"], f"rank {r} of {p}: db2 (sum of dY over the batch)")
        _close(dA_r, dA[:, a:b], f"rank {r} of {p}: dA_shard (columns {a}:{b} of dY W2^T)")
    if res.stats.total_bytes != 0:
        raise AssertionError(f"your workers sent {res.stats.total_bytes} bytes; the row-parallel backward "
                             "needs none, because dY is already the same on every worker")


@question("ex06_1", points=2, title="Column-parallel forward",
          names=("column_parallel_forward",), timeout=60)
def ex06_1(ns):
    """column_parallel_forward(comm, X, W1_shard, b1_shard, gather): this worker's hidden units,
    or all of them (ring_allgather) when gather is True."""
    f = ns["column_parallel_forward"]
    check_column_forward(f, 2, gather=False)
    check_column_forward(f, 3, gather=True)


@question("ex06_2", points=2, title="Row-parallel forward",
          names=("row_parallel_forward",), timeout=60)
def ex06_2(ns):
    """row_parallel_forward(comm, A_shard, W2_shard, b2): the whole output Y on every worker."""
    f = ns["row_parallel_forward"]
    check_row_forward(f, 3)


@question("ex06_3", points=2, title="Row-parallel backward",
          names=("row_parallel_backward",), timeout=60)
def ex06_3(ns):
    """row_parallel_backward(comm, A_shard, W2_shard, dY) -> (dW2_shard, db2, dA_shard)."""
    f = ns["row_parallel_backward"]
    check_row_backward(f, 3)


def check_predicted(f, cases):
    for p, m in cases:
        got = f(p, m)
        want = bubble_formula(p, m)
        if isinstance(got, Fraction):
            ok = got == want
        else:
            ok = abs(float(got) - float(want)) <= 1e-12
        if not ok:
            raise AssertionError(f"predicted_bubble({p}, {m}) = {got}, expected {float(want):.6g}: "
                                 "the fraction of stage-time slots that are idle in the GPipe schedule")


@question("ex06_4", points=1, title="Bubble fraction, predicted",
          names=("predicted_bubble",), timeout=20)
def ex06_4(ns):
    """predicted_bubble(p, m): idle fraction of a p-stage pipeline with m micro-batches."""
    check_predicted(ns["predicted_bubble"], [(1, 4), (2, 1), (4, 4), (4, 8), (3, 5)])


def synthetic_timeline(p, m, t=1.0, offset=0.0, extra=True):
    """An ideal GPipe timeline (compute events only, plus some send/recv noise)."""
    from course_lib.trace import Event
    from course_lib.model_parallel import simulate
    sim = simulate("gpipe", p, m)
    ev = [Event(s, "compute", offset + a * t, offset + b * t, f"{op}{i}") for s, op, i, a, b in sim["events"]]
    if extra:
        ev += [Event(s, "recv", offset + 0.1 * t, offset + 0.3 * t, "recv", (s + 1) % p, 64) for s in range(p)]
    return ev


def check_measured(f, p, m, offset=0.0):
    got = float(f(synthetic_timeline(p, m, 0.5, offset), p))
    want = float(bubble_formula(p, m))
    if abs(got - want) > 1e-9:
        raise AssertionError(f"on an ideal GPipe timeline with p={p}, m={m} (first compute at t={offset}) "
                             f"your measured_bubble gives {got:.6g}, expected {want:.6g}; use only the "
                             "'compute' events, span = last end - first start, and p stages")


def check_measured_real(f, p, m):
    layers = init_deep([4] + [6] * (p - 1) + [2], seed=3)
    X, T = make_data(8, 4, 2, seed=4)
    with _cluster(p) as cluster:
        res = cluster.run(pipeline_step, layers, X, T, m, "gpipe", t_f=0.05, t_b=0.05)
    got = float(f(res.timeline, p))
    want = float(bubble_formula(p, m))
    if not abs(got - want) <= 0.2 * want:
        raise AssertionError(f"on a real {p}-stage run with m={m} your measured_bubble gives {got:.4g}; "
                             f"the formula says {want:.4g} (within 20% expected)")


@question("ex06_5", points=2, title="Bubble fraction, measured",
          names=("measured_bubble",), timeout=60)
def ex06_5(ns):
    """measured_bubble(timeline, p): idle fraction of the compute events of a run."""
    f = ns["measured_bubble"]
    check_measured(f, 3, 4)
    check_measured_real(f, 3, 4)
