"""Lesson 08, data parallelism as it is practised: visible checks.

ex08_1  assign_buckets(param_nbytes, cap_bytes)                 DDP's buckets, last parameter first
ex08_2  update_scale(scale, clean_steps, found_overflow, growth_interval, growth_factor=2.0, backoff_factor=0.5)
                                                               one step of dynamic loss scaling
ex08_3  shard_range(n_params, n_ranks, rank)                   the chunk comm.reduce_scatter leaves on rank
ex08_4  zero_bytes_per_param(stage, n_ranks)                   ZeRO's model-state bytes per parameter per rank
ex08_5  reduce_in_buckets(comm, grads, buckets, offsets, n_params)
                                                               DDP's step: each bucket's ring allreduce started
                                                               the moment backward completes it

Questions 1, 3 and 4 are also checked on real runs: the buckets of a real backward, a real
``comm.reduce_scatter``, and ZeRO runs whose arrays are measured. Question 5 runs on real workers
with a real backward: a communicator that records each ``comm.iallreduce`` (how many gradients
backward had made when it started, what it carried, when it was waited for), the bytes every rank
sent, and a short training run against serial training.
"""
from __future__ import annotations

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_array,
    as_int,
    as_number,
    as_sequence,
    call_keeping_inputs,
    formula_mismatch,
    num,
    off_by,
    readable,
    refuse_helpers,
    shown,
    worst,
)

CHECK_TIMEOUT = 8.0  # seconds a check's cluster run may take (they take well under one)


# ------------------------------------------------------------------------------ ex08_1
def as_buckets(out, n_params: int) -> list[list[int]]:
    """The answer as a list of lists of ints, each parameter exactly once."""
    if not isinstance(out, (list, tuple)) or not all(isinstance(b, (list, tuple)) for b in out):
        raise AssertionError(f"assign_buckets should return a list of buckets (lists of parameter indices), "
                             f"got {shown(out)}.")
    buckets = [[as_int(q, "a parameter index") for q in b] for b in out]
    flat = sorted(q for b in buckets for q in b)
    assert flat == list(range(n_params)), (
        f"with {n_params} parameters every index 0..{n_params - 1} must be in exactly one bucket; "
        f"your buckets {shown(buckets)} hold {shown(flat)}.")
    assert all(buckets), f"a bucket must not be empty, got {shown(buckets)}."
    return buckets


def assert_buckets(fn, param_nbytes, cap_bytes, want):
    out = call_keeping_inputs(fn, (list(param_nbytes), cap_bytes), ("param_nbytes", "cap_bytes"))
    got = as_buckets(out, len(param_nbytes))
    sizes = [sum(param_nbytes[q] for q in b) for b in got]
    hint = ""
    if got and got[0] and got[0][0] == 0 and len(param_nbytes) > 1:
        hint = " Backward makes the LAST parameter's gradient first: the first bucket starts there."
    elif any(s > cap_bytes and len(b) > 1 for s, b in zip(sizes, got)):
        hint = f" Buckets of {sizes} bytes: a bucket of several parameters must stay within the cap."
    elif len(got) > len(want) and cap_bytes in [sum(param_nbytes[q] for q in b) for b in want]:
        hint = " A bucket may hold exactly cap_bytes: it closes only when the next parameter would pass the cap."
    assert got == want, (f"parameters of {list(param_nbytes)} bytes (model order) with a cap of {cap_bytes} bytes: "
                         f"expected {want}, got {got}.{hint}")


def _ddp_worker(comm, layers, X, T, groups):
    """One data-parallel step whose buckets are ``groups``: the order in which a real backward
    completes the buckets, and the gradient averaged by a ring allreduce per bucket."""
    from course_lib.data_parallel import ddp

    rows = np.array_split(np.arange(len(X)), comm.size)[comm.rank]
    _, grads = ddp.ddp_forward_backward(comm, layers, X[rows], T[rows], [0.0] * len(layers))
    where = {q: i for i, g in enumerate(groups) for q in g}
    missing = [len(g) for g in groups]
    completed, made = [], []
    for q, grad in grads:
        made.append((q, grad))
        missing[where[q]] -= 1
        if missing[where[q]] == 0:
            completed.append(where[q])
    offsets = ddp.param_offsets(layers)
    summed = ddp.reduce_after_backward(comm, iter(made), groups, offsets, offsets[-1][1])
    return completed, summed / np.float32(comm.size)


@harness
def run_buckets(fn, widths, batch, cap_bytes, p):
    """A real DDP step on p workers (float32, lesson 06's tanh stack) with the buckets ``fn``
    makes, each allreduced by a ring (after backward: the overlap is question ex08_5). Returns the
    buckets, the order a real backward completed them on each rank, the averaged gradient of
    rank 0, the serial full-batch gradient and the bytes sent."""
    from course_lib import Cluster
    from course_lib.data_parallel import ddp
    from course_lib.data_parallel.model import flatten_layers
    from course_lib.model_parallel.mlp import deep_forward_backward, init_deep, make_data

    layers = [(W.astype(np.float32), b.astype(np.float32)) for W, b in init_deep(list(widths), seed=2)]
    X, T = (a.astype(np.float32) for a in make_data(batch, widths[0], widths[-1], seed=3))
    sizes = [int(a.nbytes) for a in ddp.param_arrays(layers)]
    groups = [[int(q) for q in g] for g in fn(sizes, cap_bytes)]
    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(_ddp_worker, layers, X, T, groups)
    _, serial = deep_forward_backward(layers, X, T)
    return {"groups": groups, "sizes": sizes, "started": [r[0] for r in res], "grad": res[0][1],
            "serial": flatten_layers(serial, np.float32), "bytes": int(res.stats.total_bytes)}


def ring_bytes(n_bytes: int, p: int, itemsize: int = 4) -> int:
    """Bytes all p ranks send in a ring allreduce of n_bytes: 2 (p-1) chunks each (np.array_split)."""
    n = n_bytes // itemsize
    return sum(2 * (p - 1) * len(c) * itemsize for c in np.array_split(np.empty(n), p))


def assert_overlapped_run(fn, widths, batch, cap_bytes, p, want):
    out = run_buckets(fn, widths, batch, cap_bytes, p)
    assert out["groups"] == want, (f"for the network of widths {list(widths)} (parameters of {out['sizes']} bytes) "
                                   f"and a cap of {cap_bytes} bytes: expected buckets {want}, got {out['groups']}.")
    for rank, started in enumerate(out["started"]):
        assert started == list(range(len(want))), (
            f"rank {rank}: a real backward completed the buckets in the order {started}: a bucket was ready only "
            "after a later one, so its allreduce would wait for backward to reach it.")
    assert np.allclose(out["grad"], out["serial"], rtol=0, atol=1e-6), (
        "the bucketed allreduce did not give the full-batch gradient of serial training.")
    sent = sum(ring_bytes(sum(out["sizes"][q] for q in g), p) for g in want)
    assert out["bytes"] == sent, f"the run sent {out['bytes']} bytes, expected {sent} (a ring allreduce per bucket)."


@question("ex08_1", points=2, title="DDP's buckets in reverse order", names=("assign_buckets",), timeout=15)
def ex08_1(ns):
    """Write ``assign_buckets(param_nbytes, cap_bytes)``: the parameters (indices 0..n-1 in model
    order, ``param_nbytes[q]`` bytes each) grouped into buckets as PyTorch DDP does: starting from
    the LAST parameter, a bucket takes parameters while its bytes stay <= cap_bytes; the parameter
    that would exceed the cap opens the next bucket (a parameter larger than the cap gets a bucket
    alone; none is split). Return the buckets as lists of indices, in the order they are filled."""
    fn = ns["assign_buckets"]
    assert_buckets(fn, [4, 4, 4], 8, [[2, 1], [0]])
    assert_buckets(fn, [400, 48, 4000, 32, 1024, 16], 1100, [[5, 4, 3], [2], [1, 0]])
    # widths 6-8-8-3: W0 192, b0 32, W1 256, b1 32, W2 96, b2 12 bytes (float32), on 2 real workers
    assert_overlapped_run(fn, (6, 8, 8, 3), 8, 300, 2, [[5, 4, 3], [2, 1], [0]])


# ------------------------------------------------------------------------------ ex08_2
def assert_scaling_sequence(fn, growth_interval, steps, start, factors=None):
    """Run the rule from (start, 0 clean steps) over ``steps``: (overflow, expected triple) pairs.

    The expected state is fed to the next step, so one wrong step is reported once."""
    scale, clean = start, 0
    extra = () if factors is None else tuple(factors)
    names = ("scale", "clean_steps", "found_overflow", "growth_interval", "growth_factor", "backoff_factor")
    for step, (overflow, (want_scale, want_clean, want_skip)) in enumerate(steps):
        args = (scale, clean, overflow, growth_interval) + extra
        out = call_keeping_inputs(fn, args, names[:len(args)])
        got_scale, got_clean, got_skip = as_sequence(
            out, 3, "update_scale's result (new_scale, new_clean_steps, skip_step)", kinds=(tuple, list))
        where = (f"at step {step} (S = {num(scale)}, {clean} clean steps before it, "
                 f"{'an overflow' if overflow else 'no overflow'}, growth_interval = {growth_interval}"
                 + (f", growth_factor = {extra[0]}, backoff_factor = {extra[1]}" if extra else "") + ")")
        assert bool(got_skip) == want_skip, (
            f"{where}: skip_step should be {want_skip}, got {shown(got_skip)}. A step whose gradient holds inf or "
            "nan must not touch the weights; any other step is applied.")
        # what this step should do to the scale and the count, in words (the rule, not the numbers)
        if overflow:
            rule = ("an overflow means the scale was too large: it backs off (times backoff_factor), and the count "
                    "of clean steps in a row restarts at 0")
        elif want_scale != scale:
            rule = ("this clean step completes growth_interval clean steps in a row: the scale grows (times "
                    "growth_factor), and the count restarts at 0")
        else:
            rule = ("a clean step is counted; the scale changes only on an overflow, or once the clean steps in a "
                    "row reach growth_interval")
        assert as_number(got_scale, "new_scale") == want_scale, (
            f"{where}: your new scale {num(got_scale)} is wrong: {rule}.")
        assert as_int(got_clean, "new_clean_steps") == want_clean, (
            f"{where}: your clean-step count {shown(got_clean)} is wrong: {rule}.")
        scale, clean = want_scale, want_clean


@question("ex08_2", points=2, title="Dynamic loss scaling", names=("update_scale",))
def ex08_2(ns):
    """Write ``update_scale(scale, clean_steps, found_overflow, growth_interval, growth_factor=2.0,
    backoff_factor=0.5)``: return ``(new_scale, new_clean_steps, skip_step)``. On overflow the
    scale is multiplied by backoff_factor, the step is skipped and the count restarts at 0;
    otherwise the step is applied and counted, and when the count reaches growth_interval the
    scale is multiplied by growth_factor and the count restarts at 0."""
    fn = ns["update_scale"]
    S = 2.0 ** 16
    # three clean steps with interval 3 grow S once; an overflow halves it and skips; the count restarts
    assert_scaling_sequence(fn, 3, [
        (False, (S, 1, False)), (False, (S, 2, False)), (False, (2 * S, 0, False)), (True, (S, 0, True)),
        (False, (S, 1, False)), (False, (S, 2, False)), (True, (S / 2, 0, True)), (False, (S / 2, 1, False)),
        (False, (S / 2, 2, False)), (False, (S, 0, False))], start=S)


# ------------------------------------------------------------------------------ ex08_3
def _rs_worker(comm, n):
    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)     # the sum over ranks: arange * p (p+1) / 2
    return comm.reduce_scatter(x)


@harness
def run_reduce_scatter(fn, n, p):
    """A real ``comm.reduce_scatter`` of n elements on p workers; returns each rank's chunk and
    the student's range of each rank."""
    from course_lib import Cluster

    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(_rs_worker, n)
    return {"chunks": [np.asarray(c) for c in res], "ranges": [readable(fn(n, p, r)) for r in range(p)]}


#: Library functions that cut ``np.array_split``'s ranges, shard_range's whole work: refused.
SHARD_HELPERS = [("course_lib.datasets", "contiguous_shards"),
                 ("course_lib.runtime.algorithm_helpers", "chunk_bounds"),
                 ("course_lib.runtime.algorithm_helpers", "chunk_sizes"),
                 ("course_lib.mapreduce.serial", "shard_ranges"),
                 ("course_lib.model_parallel.tensor", "split_ranges"),
                 ("course_lib.data_parallel.zero", "owned_pieces")]


def as_range(out, what: str) -> tuple[int, int]:
    start, stop = as_sequence(out, 2, what, kinds=(tuple, list))
    return as_int(start, f"{what}: start"), as_int(stop, f"{what}: stop")


def assert_shard_ranges(fn, n, p, want):
    """Ranks 0..p-1 of ``fn(n, p, rank)`` against the literal ``want``."""
    refuse_helpers(fn, (n, p, p - 1), SHARD_HELPERS, "shard_range")
    for rank, expected in enumerate(want):
        got = as_range(call_keeping_inputs(fn, (n, p, rank), ("n_params", "n_ranks", "rank")),
                       f"shard_range({n}, {p}, {rank})")
        assert got == tuple(expected), (f"{n} elements on {p} ranks: rank {rank} owns {tuple(expected)}, got {got}. "
                                        "Cut as reduce_scatter cuts: the first chunks are the longer ones.")


def assert_real_reduce_scatter(fn, n, p):
    out = run_reduce_scatter(fn, n, p)
    total = np.arange(n) * p * (p + 1) / 2
    for rank, (rng, chunk) in enumerate(zip(out["ranges"], out["chunks"])):
        start, stop = as_range(rng, f"shard_range({n}, {p}, {rank})")
        assert 0 <= start <= stop <= n and np.array_equal(total[start:stop], chunk), (
            f"a real reduce_scatter of {n} elements on {p} workers left {len(chunk)} elements on rank {rank}; "
            f"your range [{start}, {stop}) does not hold that chunk.")


@question("ex08_3", points=2, title="The shard a rank owns after reduce-scatter", names=("shard_range",),
          timeout=15)
def ex08_3(ns):
    """Write ``shard_range(n_params, n_ranks, rank)``: the ``(start, stop)`` of the flat vector
    that ``comm.reduce_scatter`` leaves on ``rank`` (ZeRO's shard), cut as ``np.array_split``
    cuts: nearly equal chunks in rank order, the first ``n_params % n_ranks`` one element longer,
    each starting where the previous one stops (an empty one too)."""
    fn = ns["shard_range"]
    assert_shard_ranges(fn, 12, 4, [(0, 3), (3, 6), (6, 9), (9, 12)])
    assert_shard_ranges(fn, 10, 3, [(0, 4), (4, 7), (7, 10)])
    assert_real_reduce_scatter(fn, 10, 3)


# ------------------------------------------------------------------------------ ex08_4
@harness
def run_zero_memory(fn, n_ranks, stages=(0, 1, 2, 3)):
    """Real ZeRO runs (2 steps, fp16 parameters and gradients, fp32 Adam) on n_ranks workers:
    per stage, the model-state bytes rank 0 held at its peak divided by the parameter count,
    and the student's formula."""
    from course_lib import Cluster
    from course_lib.data_parallel import zero

    cfg = zero.ZeroConfig(steps=2)
    measured = {}
    with Cluster(n_ranks, timeout=CHECK_TIMEOUT) as cluster:
        for stage in stages:
            run = zero.run_zero(cluster, stage, cfg)
            measured[stage] = [m.state_bytes / run.n_params for m in run.memory]
    return {"measured": measured, "formula": {s: readable(fn(s, n_ranks)) for s in stages}}


#: What each stage shards (mixed precision with Adam: fp16 parameters 2 bytes, fp16 gradients 2,
#: fp32 master weights, m and v 12 per parameter).
ZERO_STAGES = {
    0: "plain data parallel shards nothing: every rank holds the fp16 parameters (2 bytes), the fp16 gradients (2) "
       "and the fp32 master weights, m and v (12) of every parameter",
    1: "stage 1 shards the optimizer states (fp32 master weights, m and v, 12 bytes) over the ranks, each rank "
       "keeping its 1/n of them, and keeps the fp16 parameters and gradients whole",
    2: "stage 2 shards the fp16 gradients too: only the fp16 parameters stay whole on every rank",
    3: "stage 3 shards the fp16 parameters too: every byte of model state is split over the ranks",
}


def _zero_concept(got, want, stage, n) -> str:
    """Why ``got`` bytes per parameter is wrong at ``stage`` on ``n`` ranks: the value's direction, a
    rounded share, and what the stage shards."""
    rounded = " (it looks rounded down: a share of bytes over n ranks is a fraction; divide with /)" if (
        float(got).is_integer() and not float(want).is_integer() and abs(got - want) < 1) else ""
    return f"{off_by(got, want)}{rounded}: {ZERO_STAGES.get(stage, 'stages run from 0 to 3')}."


def assert_zero_formula(fn, cases):
    """``fn(stage, n)`` against literal values: ``cases`` is [(stage, n, bytes per parameter)]."""
    for stage, n, want in cases:
        got = as_number(call_keeping_inputs(fn, (stage, n), ("stage", "n_ranks")),
                        f"zero_bytes_per_param({stage}, {n})")
        if not np.isclose(got, want, rtol=1e-12, atol=0):
            raise formula_mismatch(f"zero_bytes_per_param({stage}, {n}) = {num(got)} bytes of model state per "
                                   f"parameter on each rank is {_zero_concept(got, want, stage, n)}", want)


def assert_zero_run(fn, n_ranks):
    out = run_zero_memory(fn, n_ranks)
    for stage, per_rank in out["measured"].items():
        got = as_number(out["formula"][stage], f"zero_bytes_per_param({stage}, {n_ranks})")
        for rank, measured in enumerate(per_rank):
            if not np.isclose(got, measured, rtol=1e-12):
                raise formula_mismatch(
                    f"stage {stage} on {n_ranks} real workers: your formula's {num(got)} bytes per parameter, "
                    f"against what rank {rank}'s arrays held (their nbytes), is "
                    f"{_zero_concept(got, measured, stage, n_ranks)}", measured)


@question("ex08_4", points=2, title="ZeRO's memory per worker", names=("zero_bytes_per_param",), timeout=15)
def ex08_4(ns):
    """Write ``zero_bytes_per_param(stage, n_ranks)``: the bytes of model state per parameter
    that each of n_ranks workers holds in mixed-precision training with Adam (fp16 parameters
    and gradients, fp32 master weights, m and v), for stage 0 (plain data parallel: nothing
    sharded), 1 (optimizer states sharded), 2 (and gradients), 3 (and parameters)."""
    fn = ns["zero_bytes_per_param"]
    assert_zero_formula(fn, [(0, 8, 16.0), (3, 8, 2.0)])
    # stages 0-3 on 2 real workers: the bytes each one's arrays held
    assert_zero_run(fn, 2)


# ------------------------------------------------------------------------------ ex08_2 on a real run
def _rule_scaler(fn, growth_interval, start):
    """A DynamicLossScaler whose rule is ``fn`` (growth 2, backoff 0.5)."""
    from dataclasses import dataclass

    from course_lib.data_parallel.mixed_precision import DynamicLossScaler

    @dataclass
    class RuleScaler(DynamicLossScaler):
        rule: object = None

        def update(self, found_overflow):
            self.scale, self.clean_steps, skip = self.rule(self.scale, self.clean_steps, bool(found_overflow),
                                                           self.growth_interval)
            return bool(skip)

    return RuleScaler(scale=start, growth_interval=growth_interval, rule=fn)


def _scaled_worker(comm, fn, layers, X, T, steps, lr, growth_interval, start):
    from course_lib.data_parallel.mixed_precision import data_parallel_worker

    records, _ = data_parallel_worker(comm, layers, X, T, steps, lr, "fp16", _rule_scaler(fn, growth_interval, start))
    return [(r.scale, r.skipped, r.loss) for r in records]


@harness
def run_scaled_training(fn, steps, growth_interval, start=2.0 ** 24, p=2):
    """A real data-parallel fp16 run on p workers whose loss scale follows ``fn`` from ``start``
    (on the lesson's small-target problem the gradients overflow fp16 from about S = 2**30); per step the
    scale used, whether the update was skipped and the loss (summed over ranks), and the loss of
    the fp32 single process."""
    from course_lib import Cluster
    from course_lib.data_parallel import mixed_precision as mpx

    layers, X, T = mpx.small_target_problem(128, [16, 16, 16, 1], 1e-3)
    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(_scaled_worker, fn, layers, X, T, steps, 5e-4, growth_interval, start)
    per_step = list(zip(*res))
    return {"scales": [s[0][0] for s in per_step], "skipped": [bool(s[0][1]) for s in per_step],
            "losses": [sum(r[2] for r in s) for s in per_step]}


# ------------------------------------------------------------------------------ ex08_5
#: The communicator methods a reducer may use besides ``iallreduce``: the clock, the traced
#: compute phase and mpi4py's spellings of rank and size (none of them sends anything).
SPY_ALLOWED = ("now", "compute", "Get_rank", "Get_size")


class _Refused(Exception):
    """The reducer called a communication method other than ``comm.iallreduce``."""


class _SpiedRequest:
    """A request of ``comm.iallreduce``: ``wait`` is recorded (how many gradients backward had
    made by then), everything else passes through."""

    def __init__(self, request, call: int, spy):
        self._request, self._call, self._spy = request, call, spy

    def wait(self, *args, **kwargs):
        self._spy.waits.append((self._call, self._spy.made))
        return self._request.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._request, name)


class _SpyComm:
    """The communicator a check gives the student's reducer: ``comm.iallreduce`` is recorded and
    run; ``rank``, ``size`` and :data:`SPY_ALLOWED` pass through; any other method is refused."""

    def __init__(self, comm):
        self._comm = comm
        self.made = 0                  # gradients backward has made so far
        self.drained = False           # backward asked for after its last gradient
        self.calls, self.waits, self.refused, self.requests = [], [], [], []

    def gradients(self, grads, local, offsets):
        """``grads``, counted, each copied into ``local`` (at its offsets) as it passes."""
        for q, grad in grads:
            self.made += 1
            start, stop = offsets[q]
            local[start:stop] = np.asarray(grad).ravel()
            self.calls.append({"kind": "made", "q": int(q)})
            yield q, grad
        self.drained = True

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if callable(attr) and name not in SPY_ALLOWED:
            self.refused.append(name)
            raise _Refused(f"comm.{name}")
        return attr

    def iallreduce(self, sendobj, *args, **kwargs):
        import inspect

        bound = inspect.signature(self._comm.iallreduce).bind(sendobj, *args, **kwargs)
        op = bound.arguments.get("op")
        self.calls.append({"kind": "iallreduce", "made": self.made, "data": np.array(sendobj, copy=True),
                           "algorithm": bound.arguments.get("algorithm"),
                           "op": "sum" if op is None else str(getattr(op, "name", op)).lower()})
        request = _SpiedRequest(self._comm.iallreduce(sendobj, *args, **kwargs), len(self.requests), self)
        self.requests.append(request)
        return request


def _reduce_worker(comm, fn, layers, X, T, groups):
    """A real backward's gradients handed to ``fn`` through a :class:`_SpyComm`: what it did and
    returned, with this rank's own gradient (flat, as backward made it)."""
    from course_lib.data_parallel import ddp

    rows = np.array_split(np.arange(len(X)), comm.size)[comm.rank]
    _, grads = ddp.ddp_forward_backward(comm, layers, X[rows], T[rows], [0.0] * len(layers))
    offsets = ddp.param_offsets(layers)
    n_params = offsets[-1][1]
    local = np.zeros(n_params, dtype=np.float32)
    spy = _SpyComm(comm)
    out = None
    try:
        out = fn(spy, spy.gradients(grads, local, offsets), [list(g) for g in groups], list(offsets), n_params)
    except BaseException as e:
        for request in spy.requests:   # finish what was started, so that the other ranks finish too
            request._request.wait()
        if not isinstance(e, _Refused):
            raise
    made = [c["q"] for c in spy.calls if c["kind"] == "made"]
    calls = [{k: v for k, v in c.items() if k != "kind"} for c in spy.calls if c["kind"] == "iallreduce"]
    return {"out": readable(out), "refused": spy.refused, "calls": calls, "made": made,
            "waits": spy.waits, "local": local}


def _float_layers(widths, seed):
    from course_lib.model_parallel.mlp import init_deep

    return [(W.astype(np.float32), b.astype(np.float32)) for W, b in init_deep(list(widths), seed=seed)]


@harness
def run_reduce_in_buckets(fn, widths, batch, groups, p, seed=2):
    """One real step on p workers (float32, lesson 06's tanh stack of ``widths``, ``batch`` rows
    split over them): each rank's backward hands its gradients to ``fn`` with the buckets
    ``groups``. Returns what each rank's ``fn`` did and returned, each rank's own gradient, the
    parameters' offsets, and the bytes and messages each rank sent."""
    from course_lib import Cluster
    from course_lib.data_parallel import ddp
    from course_lib.model_parallel.mlp import make_data

    layers = _float_layers(widths, seed)
    X, T = (a.astype(np.float32) for a in make_data(batch, widths[0], widths[-1], seed=seed + 1))
    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(_reduce_worker, fn, layers, X, T, [list(g) for g in groups])
    return {"ranks": list(res), "offsets": [list(o) for o in ddp.param_offsets(layers)],
            "bytes": [int(b) for b in res.stats.bytes.sum(axis=1)],
            "messages": [int(m) for m in res.stats.messages.sum(axis=1)]}


@harness
def run_ddp_training(fn, widths, batch, groups, p, steps, optimizer, seed=2):
    """``steps`` steps of :func:`course_lib.data_parallel.ddp.ddp_train` on p workers whose
    gradients ``fn`` sums (buckets ``groups``), and the same steps of serial training: the
    weights of every rank and of the serial run."""
    from course_lib import Cluster
    from course_lib.data_parallel import ddp
    from course_lib.data_parallel.model import flatten_layers
    from course_lib.model_parallel.mlp import make_data

    layers = _float_layers(widths, seed)
    X, T = make_data(batch, widths[0], widths[-1], seed=seed + 1)
    sizes = [int(a.nbytes) for a in ddp.param_arrays(layers)]
    plan = ddp.BucketPlan(tuple(ddp.Bucket(tuple(int(q) for q in g), sum(sizes[q] for q in g)) for g in groups), 1)
    setup = ddp.DDPSetup(steps=steps, optimizer=optimizer, lr=0.05, plan=plan)
    with Cluster(p, timeout=CHECK_TIMEOUT) as cluster:
        run = ddp.run_ddp(cluster, layers, X, T, setup, reduce_fn=fn)
    return {"weights": [r.weights for r in run.ranks], "serial": ddp.serial_train(layers, X, T, setup),
            "start": flatten_layers(layers, np.float32)}


def _completion(made, groups):
    """Per bucket, how many gradients backward had made when its last one arrived; and the
    buckets in the order backward completed them."""
    position = {q: k + 1 for k, q in enumerate(made)}
    done = [max(position.get(q, len(made) + 1) for q in g) for g in groups]
    return done, sorted(range(len(groups)), key=lambda i: done[i])


def _bucket_values(local, members, offsets):
    return np.concatenate([local[offsets[q][0]:offsets[q][1]] for q in members])


def assert_reduction(out, groups, p):
    """Everything a check asks of ``reduce_in_buckets`` on one real step (``out``: what
    :func:`run_reduce_in_buckets` returned)."""
    offsets, n_params = out["offsets"], out["offsets"][-1][1]
    n_grads = len(offsets)
    setup = f"{p} workers, {n_grads} parameters ({n_params} numbers) in the buckets {[list(g) for g in groups]}"
    for rank, r in enumerate(out["ranks"]):
        who = f"rank {rank} ({setup})"
        if r["refused"]:
            name = r["refused"][0]
            why = ("a blocking allreduce makes backward wait for the network; start comm.iallreduce(bucket, "
                   "algorithm=\"ring\") instead and wait for its request once backward is done"
                   if name in ("allreduce", "Allreduce") else
                   "the buckets' sums must come from one comm.iallreduce(..., algorithm=\"ring\") per bucket, the "
                   "non-blocking ring allreduce that runs while backward goes on")
            raise AssertionError(f"{who}: your function called comm.{name}: {why}.")
        calls, made = r["calls"], r["made"]
        assert len(made) == n_grads, (
            f"{who}: your function asked backward for {len(made)} of the {n_grads} gradients; read grads "
            "to the end (backward makes them one by one as you ask).")
        if len(calls) != len(groups):
            kind = ""
            if len(calls) == 1 and len(groups) > 1:
                kind = (" One allreduce of the whole gradient can only start once backward has ended: nothing "
                        "overlaps.")
            elif len(calls) == len(offsets) and len(groups) < len(offsets):
                kind = " One allreduce per parameter pays the latency of a ring allreduce for every parameter."
            raise AssertionError(f"{who}: your function started {len(calls)} allreduce(s); expected one per "
                                 f"bucket, {len(groups)}.{kind}")
        for k, call in enumerate(calls):
            assert call["algorithm"] == "ring", (
                f"{who}: allreduce {k} ran with algorithm={call['algorithm']!r}: pass algorithm=\"ring\", the "
                "bandwidth-optimal allreduce whose bytes per bucket, 2 (p-1)/p of it per rank, DDP relies on.")
            assert call["op"] == "sum", (
                f"{who}: allreduce {k} reduced with op {call['op']!r}: the buckets are summed over the ranks "
                "(ddp_train divides the sum by p itself).")
        done, order = _completion(made, groups)
        for k, (call, i) in enumerate(zip(calls, order)):
            members = groups[i]
            want = _bucket_values(r["local"], members, offsets)
            data = np.asarray(call["data"]).ravel()
            assert data.size == want.size, (
                f"{who}: your allreduce {k} carried {data.size} numbers. Backward completed bucket {i} "
                f"(parameters {list(members)}) as bucket number {k}, and it holds {want.size}: each allreduce "
                "carries one bucket, its parameters' gradients flattened and concatenated, started in the order "
                "backward completes the buckets.")
            assert np.array_equal(np.sort(data.astype(np.float64)), np.sort(want.astype(np.float64))), (
                f"{who}: your allreduce {k} carried other numbers than the gradients of bucket {i} (parameters "
                f"{list(members)}), the bucket backward completed as number {k}.")
            assert call["made"] <= done[i], (
                f"{who}: bucket {i}'s allreduce started when backward had made {call['made']} gradients, but its "
                f"last gradient was gradient number {done[i]}: start a bucket's allreduce the moment its last "
                "gradient arrives, before asking backward for the next one, so that it runs while backward computes "
                "the layers below (otherwise nothing overlaps).")
        for call, when in r["waits"]:
            assert when >= n_grads, (
                f"{who}: your function waited for allreduce {call} when backward had made only {when} of its "
                f"{n_grads} gradients: the wait holds backward up until that bucket has crossed the network. Wait "
                "for the requests once backward is done.")
        got = as_array(r["out"], "reduce_in_buckets' result", shape=(n_params,))
        assert got.dtype == np.float32, (
            f"{who}: your result is {got.dtype}; the gradients are float32, and so is their sum.")
        want = sum(np.asarray(x["local"], dtype=np.float64) for x in out["ranks"])
        tol = 1e-5 * max(1.0, float(np.abs(want).max()))
        if not np.allclose(got, want, rtol=0, atol=tol):
            if np.allclose(got * p, want, rtol=0, atol=tol):
                raise AssertionError(f"{who}: your result is the average over the ranks; return the sum (ddp_train "
                                     "divides it by p).")
            wrong = [q for q, (a, b) in enumerate(offsets) if not np.allclose(got[a:b], want[a:b], rtol=0, atol=tol)]
            raise AssertionError(
                f"{who}: your flat gradient is not the sum over ranks of every rank's gradient at parameters {wrong} "
                "(offsets[q] = (start, stop) is where parameter q's gradient goes): scatter each summed bucket back "
                "in the order you concatenated it.")
    sizes = [offsets[q][1] - offsets[q][0] for q in range(len(offsets))]
    plan = _plan(groups, sizes)
    from course_lib.data_parallel import ddp

    expected = ddp.step_traffic(plan, p)
    for rank in range(p):
        assert (out["bytes"][rank], out["messages"][rank]) == (int(expected.bytes_per_rank[rank]),
                                                               int(expected.messages_per_rank[rank])), (
            f"rank {rank} ({setup}) sent {out['bytes'][rank]} bytes in {out['messages'][rank]} messages; a ring "
            f"allreduce per bucket sends {int(expected.bytes_per_rank[rank])} bytes in "
            f"{int(expected.messages_per_rank[rank])} messages (2 (p-1) messages per bucket).")


def _plan(groups, sizes):
    from course_lib.data_parallel import ddp

    return ddp.BucketPlan(tuple(ddp.Bucket(tuple(int(q) for q in g), 4 * sum(sizes[q] for q in g)) for g in groups), 1)


def assert_reduce_in_buckets(fn, widths, batch, groups, p, seed=2):
    assert_reduction(run_reduce_in_buckets(fn, widths, batch, groups, p, seed), groups, p)


def assert_trains_like_serial(fn, widths, batch, groups, p, steps, optimizer="sgd", seed=2):
    out = run_ddp_training(fn, widths, batch, groups, p, steps, optimizer, seed)
    serial = np.asarray(out["serial"])
    assert np.abs(serial - np.asarray(out["start"])).max() > 1e-3
    for rank, w in enumerate(out["weights"]):
        w = as_array(w, f"rank {rank}'s weights", shape=serial.shape)
        assert np.allclose(w, serial, rtol=0, atol=2e-6), (
            f"{steps} steps of ddp_train ({optimizer}) on {p} workers with your reduce_in_buckets did not end with "
            f"the weights of serial training on the whole batch: {worst(w, serial, 'weight')} on rank {rank}.")


@question("ex08_5", points=2, title="DDP's overlapped bucketed allreduce", names=("reduce_in_buckets",),
          timeout=20)
def ex08_5(ns):
    """Write ``reduce_in_buckets(comm, grads, buckets, offsets, n_params)``: ``grads`` yields
    ``(q, gradient of parameter q)`` as backward makes them. Start one
    ``comm.iallreduce(bucket, algorithm="ring")`` per bucket the moment its last gradient arrives
    (before asking for the next), wait for them once backward is done, and return the flat
    gradient summed over the ranks (``offsets[q] = (start, stop)``, ``n_params`` numbers)."""
    fn = ns["reduce_in_buckets"]
    # widths 6-8-8-3: W0 48, b0 8, W1 64, b1 8, W2 24, b2 3 numbers; 2 real workers, one step
    assert_reduce_in_buckets(fn, (6, 8, 8, 3), 8, [[5, 4, 3], [2, 1], [0]], 2)
    # three steps of ddp_train on 2 workers against serial training
    assert_trains_like_serial(fn, (6, 8, 8, 3), 8, [[5, 4, 3], [2, 1], [0]], 2, 3)
