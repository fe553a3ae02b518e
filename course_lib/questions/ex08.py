"""Lesson 08, data parallelism as it is practised: visible checks.

ex08_1  assign_buckets(param_nbytes, cap_bytes)                 DDP's buckets, last parameter first
ex08_2  update_scale(scale, clean_steps, found_overflow, growth_interval, growth_factor=2.0, backoff_factor=0.5)
                                                               one step of dynamic loss scaling
ex08_3  shard_range(n_params, n_ranks, rank)                   the chunk comm.reduce_scatter leaves on rank
ex08_4  zero_bytes_per_param(stage, n_ranks)                   ZeRO's model-state bytes per parameter per rank

Questions 1, 3 and 4 are also checked on real runs: buckets allreduced with ``comm.iallreduce``
while backward goes on, a real ``comm.reduce_scatter``, and ZeRO runs whose arrays are measured.
"""
from __future__ import annotations

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
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
    """One data-parallel step whose buckets are ``groups``: each bucket's ring allreduce starts
    (``comm.iallreduce``) as soon as backward has made all its gradients."""
    from course_lib.data_parallel import ddp

    sizes = [a.nbytes for a in ddp.param_arrays(layers)]
    plan = ddp.BucketPlan(tuple(ddp.Bucket(tuple(g), sum(sizes[q] for q in g)) for g in groups), 1)
    rows = np.array_split(np.arange(len(X)), comm.size)[comm.rank]
    reducer = ddp.BucketReducer(comm, plan, ddp.param_offsets(layers), overlap=True)
    ddp.ddp_backward(comm, layers, X[rows], T[rows], reducer, [0.0] * len(layers))
    grad = reducer.finish(sum(a.size for a in ddp.param_arrays(layers)), np.float32) / np.float32(comm.size)
    return [int(i) for i, _ in reducer.started], grad


@harness
def run_buckets(fn, widths, batch, cap_bytes, p):
    """A real overlapped DDP backward on p workers (float32, lesson 06's tanh stack) with the
    buckets ``fn`` makes. Returns the buckets, the order their allreduces started on each rank,
    the averaged gradient of rank 0, the serial full-batch gradient and the bytes sent."""
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
            f"rank {rank} started the buckets' allreduces in the order {started}: a bucket was ready only after "
            "a later one, so it waited for backward to reach it.")
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
