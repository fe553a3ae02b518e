"""Lesson 06, tensor-parallel layers, the pipeline bubble and in-graph replication: visible checks.

ex06_1  column_parallel_forward(comm, X, W1_shard, b1_shard, gather)   this worker's hidden units (or all)
ex06_2  row_parallel_forward(comm, A_shard, W2_shard, b2)              the whole output Y on every worker
ex06_3  row_parallel_backward(comm, A_shard, W2_shard, dY)             (dW2_shard, db2, dA_shard), no traffic
ex06_4  predicted_bubble(p, m)                                         idle fraction of the GPipe schedule
ex06_5  measured_bubble(timeline, p)                                   idle fraction of a run's timeline
ex06_6  in_graph_data_parallel(params, X, T, p)                        one graph of p replicas, in-graph

Each layer runs in real worker processes (a small Cluster); the expected values of the small
network below are written out.
"""
from __future__ import annotations

import re
from fractions import Fraction

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import StudentError, harness
from course_lib.questions import (
    as_array,
    as_number,
    as_sequence,
    assert_no_helper,
    assert_unchanged,
    formula_mismatch,
    num,
    off_by,
    readable,
    shown,
    watch_helpers,
    worst,
)

TOL = 1e-10
CHECK_TIMEOUT = 6.0  # seconds a check's cluster run may take

# ------------------------------------------------------------------------------ the small network
#: Batch of 2, 3 inputs, 5 hidden units, 2 outputs. Hidden units are split over the workers in
#: contiguous ranges, the first ones one longer: on 2 workers columns 0:3 and 3:5, on 3 workers 0:2, 2:4, 4:5.
X = [[1.0, -1.0, 0.5], [0.0, 2.0, -0.5]]
W1 = [[0.5, -0.25, 0.0, 1.0, -1.0], [0.25, 0.5, -0.5, 0.0, 0.75], [-1.0, 0.0, 0.5, 0.25, 0.5]]
B1 = [0.0, 0.1, -0.2, 0.3, 0.0]
#: tanh(X W1 + b1)
A = [[-0.24491866240370913, -0.5716699660851172, 0.5005202111902353, 0.8906373655681185, -0.9051482536448665],
     [0.7615941559557649, 0.8004990217606297, -0.8956928738431645, 0.1732351578346601, 0.8482836399575129]]
#: A hidden activation given to the row-parallel layer, its weights and bias, and an output gradient.
A_IN = [[0.5, -1.0, 0.25, 0.0, 1.0], [1.0, 0.5, -0.5, 2.0, -0.25]]
W2 = [[1.0, 0.0], [0.5, -1.0], [0.0, 2.0], [-0.5, 0.25], [1.0, 1.0]]
B2 = [0.5, -0.25]
DY = [[0.25, -0.5], [1.0, 0.75]]
Y = [[1.5, 2.25], [0.5, -1.5]]                                              # A_IN W2 + b2
DW2 = [[1.125, 0.5], [0.25, 0.875], [-0.4375, -0.5], [2.0, 1.5], [0.0, -0.6875]]   # A_IN^T dY
DB2 = [1.25, 0.25]                                                          # dY summed over the batch
DA = [[0.25, 0.625, -1.0, -0.25, -0.25], [1.0, -0.25, 1.5, -0.3125, 1.75]]  # dY W2^T


def params(W1=W1, b1=B1, W2=W2, b2=B2):
    return {"W1": np.asarray(W1, float), "b1": np.asarray(b1, float), "W2": np.asarray(W2, float),
            "b2": np.asarray(b2, float)}


# ------------------------------------------------------------------------------ the harness
def hidden_ranges(n, p):
    """Contiguous ranges of the n hidden units over p workers, the first n % p ones one longer."""
    sizes = [n // p + (1 if k < n % p else 0) for k in range(p)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def shard(params, p, rank):
    """What worker ``rank`` of p holds: its columns of W1 and b1, its rows of W2, a copy of b2."""
    a, b = hidden_ranges(np.shape(params["W1"])[1], p)[rank]
    return {"W1": np.array(params["W1"])[:, a:b], "b1": np.array(params["b1"])[a:b],
            "W2": np.array(params["W2"])[a:b, :], "b2": np.array(params["b2"]), "cols": (a, b)}


#: The lesson's layer_backward(W, a_in, a_out, d_out, last=True) returns row_parallel_backward's three
#: gradients: ex06_3 refuses an answer that calls it.
LAYER_BACKWARD = [("course_lib.model_parallel.mlp", "layer_backward")]


def _tp_worker(comm, fn, which, params, inputs):
    s = shard(params, comm.size, comm.rank)
    a, b = s["cols"]
    if which == "col":
        names, args = ["X", "W1_shard", "b1_shard"], [np.array(inputs["X"]), s["W1"], s["b1"]]
        extra = [bool(inputs["gather"])]
    elif which == "row_fwd":
        names, args, extra = ["A_shard", "W2_shard", "b2"], [np.array(inputs["A"])[:, a:b], s["W2"], s["b2"]], []
    else:
        names, args = ["A_shard", "W2_shard", "dY"], [np.array(inputs["A"])[:, a:b], s["W2"], np.array(inputs["dY"])]
        extra = []
    before = [x.copy() for x in args]
    import sys

    seen = watch_helpers(LAYER_BACKWARD if which == "row_bwd" else [])
    try:
        out = fn(comm, *args, *extra)
    finally:
        sys.setprofile(None)
    return readable(out), (a, b), names, before, args, (seen[0] if seen else "")


@harness
def run_tp(fn, which, params, inputs, p):
    """Run one tensor-parallel layer (``which``: col, row_fwd, row_bwd) on p workers.

    Returns (per-rank (result, cols, argument names, arguments before, arguments after), total bytes)."""
    from course_lib import Cluster

    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(_tp_worker, fn, which, params, inputs)
        return list(res), int(res.stats.total_bytes)


def _close(got, want, what, name):
    got = as_array(got, f"{what}: {name}", shape=np.shape(want))
    if not np.allclose(got, want, rtol=0, atol=TOL):
        raise AssertionError(f"{what}: {worst(got, want, name)}.")


def _ranks(res, fname):
    for r, (out, cols, names, before, after, used) in enumerate(res):
        assert_no_helper(fname, used, f"on rank {r}")
        assert_unchanged(fname, names, before, after, on=f"on rank {r}")
        yield r, out, tuple(cols)


# ------------------------------------------------------------------------------ ex06_1
#: What numpy says when arrays of different widths are joined along the other axis (np.concatenate,
#: np.vstack, np.stack): the mistake of gathering the activation shards along the batch axis.
JOIN_MISMATCH = re.compile(r"concatenation axis|must have the same shape|must match exactly")


def _wrong_axis(p, A, got_shape=None) -> str:
    """The concept a gather along the wrong axis misses, with the shapes only (never the values)."""
    batch, hidden = A.shape
    got = f"got shape {tuple(got_shape)}" if got_shape is not None else (
        "got a ValueError from joining shards of different widths")
    return (f"with p={p}, gather=True: the activations are gathered along the wrong axis: expected shape "
            f"({batch}, {hidden}) for the full activation tanh(X W1 + b1) (the batch of {batch} by all {hidden} "
            f"hidden units), {got}. Each worker holds the same batch rows but its own hidden units (columns), "
            "so the shards go side by side along the hidden-unit axis (axis=1), not stacked along the batch "
            "axis (axis=0).")


def check_column_forward(f, p, gather, params, X, A):
    A = np.asarray(A, float)
    try:
        res, total = run_tp(f, "col", params, {"X": np.asarray(X, float), "gather": gather}, p)
    except StudentError as exc:
        # The shards are (batch, own width): stacked along the batch axis they only fit when the widths
        # agree, so numpy's own "dimensions ... must match" from inside a gather is this mistake.
        if gather and "ValueError" in exc.kinds and JOIN_MISMATCH.search(exc.message or ""):
            raise AssertionError(_wrong_axis(p, A)) from None
        raise
    for r, out, (a, b) in _ranks(res, "column_parallel_forward"):
        got = np.shape(out) if isinstance(out, np.ndarray) else None
        if gather and got is not None and len(got) == 2 and got != A.shape and np.prod(got) == A.size:
            raise AssertionError(_wrong_axis(p, A, got))
        if gather:
            _close(out, A, f"rank {r} of {p}, gather=True, should return the full activation tanh(X W1 + b1)",
                   "the result")
        else:
            _close(out, A[:, a:b], f"rank {r} of {p}, gather=False, should return its own hidden units, columns "
                                   f"{a}:{b} of tanh(X W1 + b1)", "the result")
    want = (p - 1) * A.size * 8 if gather else 0
    assert total == want, (
        f"with p={p}, gather={gather}, your workers should send {want} bytes ("
        + ("one ring allgather of the shards, axis=1" if gather else "no communication: every hidden unit is local")
        + f"); they sent {total}.")


@question("ex06_1", points=2, title="Column-parallel forward", names=("column_parallel_forward",))
def ex06_1(ns):
    """column_parallel_forward(comm, X, W1_shard, b1_shard, gather): this worker's hidden units,
    or all of them when gather is True, sending what one ring_allgather of the activation shards
    sends (the checks count the bytes; nothing travels without gather)."""
    f = ns["column_parallel_forward"]
    check_column_forward(f, 2, False, params(), X, A)
    check_column_forward(f, 3, True, params(), X, A)


# ------------------------------------------------------------------------------ ex06_2
def check_row_forward(f, p, params, A_in, Y):
    Y = np.asarray(Y, float)
    res, total = run_tp(f, "row_fwd", params, {"A": np.asarray(A_in, float)}, p)
    for r, out, _ in _ranks(res, "row_parallel_forward"):
        _close(out, Y, f"rank {r} of {p} should return the whole Y = A W2 + b2 (the partial products summed over "
                       "the workers, and b2 added once)", "Y")
    # Any pattern that gives every worker Y is accepted (the statement says so): a ring allreduce of the
    # partial products is the cheapest, an allgather then a local sum is right too. Graded: Y everywhere.
    assert p == 1 or total > 0, (f"with p={p}, each worker holds only its rows of W2: the partial products must "
                                 "travel between the workers, yet yours sent nothing.")


@question("ex06_2", points=2, title="Row-parallel forward", names=("row_parallel_forward",))
def ex06_2(ns):
    """row_parallel_forward(comm, A_shard, W2_shard, b2): the whole output Y on every worker (any
    communication pattern; Y on every worker is what is graded)."""
    check_row_forward(ns["row_parallel_forward"], 3, params(), A_IN, Y)


# ------------------------------------------------------------------------------ ex06_3
def check_row_backward(f, p, params, A_in, dY, dW2, db2, dA):
    dW2, db2, dA = (np.asarray(v, float) for v in (dW2, db2, dA))
    res, total = run_tp(f, "row_bwd", params, {"A": np.asarray(A_in, float), "dY": np.asarray(dY, float)}, p)
    for r, out, (a, b) in _ranks(res, "row_parallel_backward"):
        g_w, g_b, g_a = as_sequence(out, 3, f"rank {r}'s result (dW2_shard, db2, dA_shard)", kinds=(tuple, list))
        _close(g_w, dW2[a:b], f"rank {r} of {p}: dW2_shard should be rows {a}:{b} of A^T dY", "dW2_shard")
        _close(g_b, db2, f"rank {r} of {p}: db2 should be dY summed over the batch", "db2")
        _close(g_a, dA[:, a:b], f"rank {r} of {p}: dA_shard should be columns {a}:{b} of dY W2^T", "dA_shard")
    assert total == 0, (f"the row-parallel backward needs no communication (dY is already the same on every "
                        f"worker), but your workers sent {total} bytes.")


@question("ex06_3", points=2, title="Row-parallel backward", names=("row_parallel_backward",))
def ex06_3(ns):
    """row_parallel_backward(comm, A_shard, W2_shard, dY) -> (dW2_shard, db2, dA_shard); the checks
    count the bytes its workers send."""
    check_row_backward(ns["row_parallel_backward"], 3, params(), A_IN, DY, DW2, DB2, DA)


# ------------------------------------------------------------------------------ ex06_4
def check_predicted(f, cases):
    """``cases``: [(p, m, the idle fraction as a Fraction)]."""
    for p, m, want in cases:
        got = f(p, m)
        val = as_number(got, f"predicted_bubble({p}, {m})")
        ok = got == want if isinstance(got, Fraction) else abs(val - float(want)) <= 1e-12
        if ok:
            continue
        call = f"predicted_bubble({p}, {m}) = {num(got)}"
        if want == 0:
            why = "a single stage never waits for another, so its pipeline has no bubble."
        elif want < 1 and abs(val - float(want / (1 - want))) <= 1e-12:
            why = ("it divides the idle slots by the busy ones; the bubble fraction is the idle share of all the "
                   "slots of the schedule.")
        else:
            why = ("the bubble is the share of a stage's slots, over the whole GPipe schedule (filling the pipeline, "
                   "the steady state, draining it), in which the stage is idle: count the schedule's slots and the "
                   "m in which one stage is busy.")
        raise formula_mismatch(f"{call} is {off_by(val, float(want))}: {why}", want)


@question("ex06_4", points=1, title="Bubble fraction, predicted", names=("predicted_bubble",))
def ex06_4(ns):
    """predicted_bubble(p, m): idle fraction of a p-stage pipeline with m micro-batches."""
    check_predicted(ns["predicted_bubble"], [(1, 4, Fraction(0)), (2, 1, Fraction(1, 2)), (4, 4, Fraction(3, 7)),
                                             (4, 8, Fraction(3, 11)), (3, 5, Fraction(2, 7))])


# ------------------------------------------------------------------------------ ex06_5
def gpipe_events(p, m, t=1.0, offset=0.0, extra=True):
    """The ideal GPipe timeline as plain tuples (rank, kind, start, end, label, peer, nbytes).

    Forwards F0..F(m-1), then backwards in reverse order; each op takes t, messages no time.
    With ``extra``, every stage also waits in a recv near the start (not compute)."""
    ev = []
    for s in range(p):
        ev += [(s, "compute", offset + (s + i) * t, offset + (s + i + 1) * t, f"F{i}", -1, 0) for i in range(m)]
        for k in range(m):
            start = (p + m - 1) + k + (p - 1 - s)
            ev.append((s, "compute", offset + start * t, offset + (start + 1) * t, f"B{m - 1 - k}", -1, 0))
        if extra:
            ev.append((s, "recv", offset + 0.1 * t, offset + 0.3 * t, "recv", (s + 1) % p, 64))
    return ev


@harness
def run_measured(fn, events, p):
    """``fn(timeline, p)`` on the Timeline of the given events; returns its result."""
    from course_lib.runtime.trace import Event, Timeline

    return readable(fn(Timeline(Event(*e) for e in events), p))


@harness
def run_measured_real(fn, p, m, t_op=0.05):
    """A real GPipe step on p processes with ops padded to t_op seconds.

    Returns ``(fn(res.timeline, p), events)``: the events as plain tuples, so that a check
    can judge the answer on the very timeline it was given rather than on a fresh run."""
    from course_lib import Cluster
    from course_lib.model_parallel import init_deep, make_data, pipeline_step

    layers = init_deep([4] + [6] * (p - 1) + [2], seed=3)
    X, T = make_data(8, 4, 2, seed=4)
    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(pipeline_step, layers, X, T, m, "gpipe", t_f=t_op, t_b=t_op)
    return readable(fn(res.timeline, p)), [tuple(e) for e in res.timeline]


def check_measured(f, p, m, want, offset=0.0):
    got = as_number(run_measured(f, gpipe_events(p, m, 0.5, offset), p), "measured_bubble's result")
    assert abs(got - float(want)) <= 1e-9, (
        f"on an ideal GPipe timeline with p={p}, m={m} (first compute at t={num(offset)} s, plus some recv events), "
        f"measured_bubble should give {num(float(want))}, got {num(got)}: use only the 'compute' events, the span "
        "from the first one's start to the last one's end, and p stages.")


def check_measured_real(f, p, m):
    """On a real run, the answer is a fraction: at least 0 and below 1.

    Only a range: a real run's idle fraction depends on the machine's load (a fresh-clone suite on
    a busy machine measured 0.264 where the ideal schedule idles 1/3: ops that overrun ``t_op``
    fill some of the waits), and the grade must not. The grader's own check judges the value
    exactly, on the very events it was computed from; this returns them for it."""
    got, events = run_measured_real(f, p, m)
    got = as_number(got, "measured_bubble's result")
    assert 0 <= got < 1, (
        f"on a real {p}-stage GPipe run with m={m}, measured_bubble should be a fraction of the time, at least 0 "
        f"and below 1; got {num(got, 4)}.")
    return got, events


@question("ex06_5", points=2, title="Bubble fraction, measured", names=("measured_bubble",))
def ex06_5(ns):
    """measured_bubble(timeline, p): idle fraction of the compute events of a run."""
    f = ns["measured_bubble"]
    check_measured(f, 3, 4, Fraction(1, 3))
    check_measured_real(f, 3, 4)


# ------------------------------------------------------------------------------ ex06_6
#: A network of 2 inputs, 3 hidden units and 1 output, and a batch of 7 rows: over 3 replicas
#: the shards have 3, 2 and 2 rows (np.array_split), so the replicas' weights differ.
G_PARAMS = {"W1": [[0.5, -1.0, 0.25], [0.75, 0.5, -0.5]], "b1": [0.1, 0.0, -0.2],
            "W2": [[1.0], [-0.5], [0.75]], "b2": [0.25]}
G_X = [[1.0, 0.0], [0.5, -1.0], [-1.0, 2.0], [0.0, 1.0], [2.0, 0.5], [-0.5, -0.5], [1.5, 1.0]]
G_T = [[0.5], [-1.0], [1.0], [0.0], [2.0], [-0.5], [1.0]]
#: The gradient of the mean loss over all 7 rows, flattened as W1, b1, W2, b2 (104 parameter bytes).
G_GRAD = [0.2100058248753578, -0.0556960874883917, 0.13667827073011576, -0.2864616095663601,
          0.03815724027140494, -0.16120491214631777, 0.23137121383932985, -0.08932645679657278,
          0.21267306210020326, -0.1392915184559137, -0.36599415143732394, 0.19534446168477496,
          0.21084920835365775]


def graph_problem(nodes, p: int):
    """What makes ``nodes`` not a graph :func:`run_graph` can run on p workers, or None."""
    from course_lib.model_parallel import Node

    if not isinstance(nodes, (list, tuple)) or not all(isinstance(n, Node) for n in nodes):
        return f"should return a list of Node(name, device, op, inputs), got {shown(nodes)}"
    seen = set()
    for n in nodes:
        if isinstance(n.device, bool) or not isinstance(n.device, (int, np.integer)) or not 0 <= n.device < p:
            return f"node {n.name!r} is placed on device {shown(n.device)}; with p={p} a device is a rank 0..{p - 1}"
        if not isinstance(n.inputs, (tuple, list)) or any(name not in seen for name in n.inputs):
            return (f"node {n.name!r} has inputs {shown(n.inputs)}: inputs must be a tuple of names of nodes "
                    "that come earlier in the list")
        if n.name in seen:
            return f"two nodes are named {n.name!r}"
        seen.add(n.name)
    return None if "grad" in seen else "the graph has no node named 'grad'"


@harness
def run_in_graph(fn, params, X, T, p):
    """Build the graph with ``fn(params, X, T, p)`` (one client), run it with ``run_graph`` on p
    workers, then run the between-graph step ``data_parallel_step(..., "server")`` on the same cluster.

    Returns a dict: ``problem`` (a malformed graph, else None), ``grad`` (the value of the node
    "grad"), ``ran`` (per rank, the names of the nodes it computed, read from the run's timeline)
    and the byte matrices ``bytes`` and ``between`` (what rank i sent to rank j) of the two runs."""
    from course_lib import Cluster
    from course_lib.model_parallel import data_parallel_step

    params = {k: np.asarray(v, float) for k, v in params.items()}
    X, T = np.asarray(X, float), np.asarray(T, float)
    nodes = fn(params, X, T, p)
    problem = graph_problem(nodes, p)
    if problem is not None:
        return {"problem": problem}
    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(_run_graph_counting_rows, list(nodes))
        between = cluster.run(data_parallel_step, params, X, T, "server")
    values = {name: v for per_rank, _ in res for name, v in per_rank.items()}
    ran = [sorted({e.label for e in res.timeline.of(rank=r, kind="compute")}) for r in range(p)]
    return {"problem": None, "grad": readable(values["grad"]), "ran": ran, "rows": [int(n) for _, n in res],
            "bytes": res.stats.bytes.tolist(), "between": between.stats.bytes.tolist()}


def _run_graph_counting_rows(comm, nodes):
    """``run_graph(comm, nodes)`` on this worker, and the number of batch rows its ops passed through
    ``mp.forward`` (the work this worker's replica did)."""
    import course_lib.model_parallel as mp

    rows, real = [], mp.forward

    def counted(params, X, *args, **kwargs):
        rows.append(int(np.shape(X)[0]))
        return real(params, X, *args, **kwargs)

    mp.forward = counted
    try:
        return mp.run_graph(comm, nodes), sum(rows)
    finally:
        mp.forward = real


def _per_rank_traffic(matrix):
    """Each rank's (bytes sent, bytes received), sorted: the same whichever rank plays the ps."""
    m = np.asarray(matrix)
    return sorted(zip(m.sum(axis=1).tolist(), m.sum(axis=0).tolist()))


def check_in_graph(f, p, params, X, T, grad):
    out = run_in_graph(f, params, X, T, p)
    assert out["problem"] is None, f"in_graph_data_parallel(params, X, T, p={p}) {out['problem']}."
    B = len(X)
    _close(out["grad"], grad, f"with p={p} replicas and B={B} rows, the node 'grad' should hold the gradient of the "
                              "mean loss over the whole batch, flattened as W1, b1, W2, b2", "grad")
    idle = [r for r, names in enumerate(out["ran"]) if not names]
    assert not idle, (
        f"in-graph replication places each replica on its own worker, so each of the {p} workers computes; "
        f"with p={p}, rank(s) {idle} ran no node of your graph (ranks that did: "
        f"{[r for r in range(p) if r not in idle]}).")
    rows = out["rows"]
    assert sum(rows) == B and max(rows) <= -(-B // p), (
        f"with p={p} replicas and B={B} rows, each row should go through mp.forward once, on the replica whose "
        f"part it is (at most {-(-B // p)} rows per worker); rows forwarded per worker: {rows}. A replica works on "
        "its own part of the batch only, and its op computes it with mp.forward and mp.backward.")
    got, want = int(np.sum(out["bytes"])), int(np.sum(out["between"]))
    assert got == want, (
        f"with p={p}, your graph moved {got} bytes; the between-graph step on the same batch "
        f"(data_parallel_step, mode 'server') moved {want}: only the parameters (out from the ps) and the "
        "replicas' gradients (back to it) should travel, once per worker.")
    mine, theirs = _per_rank_traffic(out["bytes"]), _per_rank_traffic(out["between"])
    assert mine == theirs, (
        f"with p={p}, the workers' (bytes sent, bytes received) should be {theirs} in some order, as in the "
        f"between-graph step (one ps, one replica on each worker); your graph's were {mine}.")


@question("ex06_6", points=2, title="In-graph replication", names=("in_graph_data_parallel",))
def ex06_6(ns):
    """in_graph_data_parallel(params, X, T, p): one graph of p data-parallel replicas and their sum."""
    check_in_graph(ns["in_graph_data_parallel"], 3, G_PARAMS, G_X, G_T, G_GRAD)
