"""DDP: gradients allreduced in buckets while backward goes on (Li et al., "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020).

Every rank holds the whole model and 1/p of the batch. Backward produces the gradients
of the last layer first, so DDP groups the parameters into buckets in **reverse** model
order (about 25 MB each by default; a parameter is never split) and starts a bucket's
allreduce, non-blocking, as soon as all its gradients are ready, while backward computes
the layers below. After the first layer, the rank waits for every bucket, divides the sum
by p and updates: the same step as serial training on the whole batch.

Backward is a generator here (:func:`ddp_forward_backward`): a layer's backward runs when its
first gradient is asked for, so the reducer that consumes it decides what overlaps. The
overlapped reducer is question ex08_5 (:func:`course_lib.reference.ex08.reduce_in_buckets`: in
the student release, the student's own); :func:`reduce_after_backward` is the baseline that
drains backward first. :class:`StartRecorder` notes when each bucket's allreduce started.

The time of such a step, its alpha-beta model and the two-lane timeline that shows the
overlap are in :mod:`.overlap`. Compute here is emulated: each layer's backward is padded
(sleeping, so the communication thread gets the CPU) to a time proportional to its FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from course_lib.reference.ex08 import assign_buckets as _assign_buckets  # question ex08_1
from course_lib.reference.ex08 import reduce_in_buckets as _reduce_in_buckets  # question ex08_5

from .. import costs
from ..model_parallel import mlp
from ..model_parallel.pipeline import padded_compute
from . import model as dpm

#: Bucket cap of this lesson's runs. PyTorch's 25 MB is about a quarter of ResNet-50's 100 MB
#: of fp32 gradients; the lesson's stack (:data:`WIDTHS`) has 3.0 MB of them: a quarter of that.
DEFAULT_CAP_BYTES = 800_000
#: The lesson's network: lesson 06's tanh stack, 13 layers, 744 464 parameters.
WIDTHS = (64,) + (256,) * 12 + (16,)
#: The lesson's emulation: each layer's backward padded to 2 ns per FLOP (8.4 ms for a 256 x 256
#: layer on 16 rows), and a network on which one such layer's gradients cost 1.44x that to
#: allreduce (4 ranks: 6 x 1 ms latency + 1.5 x 263 KB / 65 MB/s = 12 ms). At half these times
#: Python's own cost per message (0.3-0.7 ms on 2 cores) put the measured steps up to 2x the model.
SECONDS_PER_FLOP = 2e-9
LATENCY_S = 1e-3
BANDWIDTH_BPS = 65e6


# ----------------------------------------------------------------------------- buckets
@dataclass(frozen=True)
class Bucket:
    """Parameters (indices in model order) in the order backward makes them ready."""
    params: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[Bucket, ...]
    cap_bytes: int

    def __len__(self) -> int:
        return len(self.buckets)

    def bucket_of(self) -> dict[int, int]:
        """{parameter index: the bucket that holds it}."""
        return {q: i for i, b in enumerate(self.buckets) for q in b.params}


def assign_buckets(param_nbytes, cap_bytes: int) -> BucketPlan:
    """Parameters of ``param_nbytes`` (model order) into buckets, last parameter first: question
    ex08_1 (:func:`course_lib.reference.ex08.assign_buckets`), its lists as a :class:`BucketPlan`.

    A bucket takes parameters while its bytes stay <= ``cap_bytes``; the parameter that would
    exceed the cap opens the next bucket (one larger than the cap gets a bucket alone)."""
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes must be positive, got {cap_bytes}")
    groups = _assign_buckets(list(param_nbytes), cap_bytes)
    return BucketPlan(tuple(Bucket(tuple(int(q) for q in g), sum(int(param_nbytes[q]) for q in g))
                            for g in groups), int(cap_bytes))


def param_arrays(layers) -> list[np.ndarray]:
    """The parameters as DDP sees them, in model order: W0, b0, W1, b1, ..."""
    return [a for W, b in layers for a in (W, b)]


def plan_for(layers, cap_bytes: int, itemsize: int = 4) -> BucketPlan:
    """The bucket plan of a layer stack whose gradients have ``itemsize`` bytes per number."""
    return assign_buckets([a.size * itemsize for a in param_arrays(layers)], cap_bytes)


#: PyTorch DDP's first bucket: 1 MB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) against 25 MB for the
#: others, so the first allreduce starts after the last layer or two. Scaled as our cap is:
#: 800 KB x 1/25 = 32 KB.
FIRST_BUCKET_BYTES = 32_000


def plan_with_first_bucket(layers, first_cap_bytes: int = FIRST_BUCKET_BYTES,
                           cap_bytes: int = DEFAULT_CAP_BYTES, itemsize: int = 4) -> BucketPlan:
    """Buckets as PyTorch's DDP makes them: the first (the last parameters, which backward
    produces first) capped at ``first_cap_bytes``, the others at ``cap_bytes``; each cut by
    :func:`assign_buckets`, in reverse model order. ``cap_bytes`` of the plan is the larger cap."""
    sizes = [a.size * itemsize for a in param_arrays(layers)]
    first = assign_buckets(sizes, first_cap_bytes).buckets[0]
    rest_count = min(first.params)                       # parameters 0 .. rest_count - 1 remain
    rest = assign_buckets(sizes[:rest_count], cap_bytes).buckets if rest_count else ()
    return BucketPlan((first,) + tuple(rest), int(cap_bytes))


def param_offsets(layers) -> list[tuple[int, int]]:
    """``[start, end)`` of each parameter in :func:`~.model.flatten_layers`' vector."""
    ends = np.cumsum([0] + [a.size for a in param_arrays(layers)])
    return [(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]


# ----------------------------------------------------------------------------- traffic
@dataclass(frozen=True)
class Traffic:
    """Bytes and messages each rank sends (arrays of length p)."""
    bytes_per_rank: np.ndarray
    messages_per_rank: np.ndarray


def step_traffic(plan: BucketPlan, p: int, itemsize: int = 4) -> Traffic:
    """What each rank sends in one step: a ring allreduce per bucket, 2(p-1)/p n_i bytes and
    2(p-1) messages each (exactly, from :func:`course_lib.costs.traffic`; chunks as array_split)."""
    nbytes, msgs = np.zeros(p, dtype=np.int64), np.zeros(p, dtype=np.int64)
    for b in plan.buckets:
        sent, count = costs.traffic("allreduce", "ring", p, b.nbytes // itemsize, itemsize)
        nbytes, msgs = nbytes + sent, msgs + count
    return Traffic(nbytes, msgs)


# ----------------------------------------------------------------------------- the step
@dataclass(frozen=True)
class DDPSetup:
    """A data-parallel run: bucket cap, steps, optimizer and the emulated backward's speed."""
    cap_bytes: int = DEFAULT_CAP_BYTES
    steps: int = 3
    overlap: bool = True             # False: every bucket allreduced after the whole backward
    optimizer: str = "sgd"           # "sgd" or "adam" (:class:`~.model.Adam`)
    lr: float = 0.05
    seconds_per_flop: float = 0.0    # emulated compute: layer i's backward padded to this x its FLOPs
    plan: BucketPlan | None = None   # buckets given outright (e.g. by an exercise); else by cap_bytes

    def __post_init__(self):
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")

    def plan_of(self, layers) -> BucketPlan:
        """The buckets of this run: :attr:`plan`, or :func:`plan_for` the cap (float32)."""
        return self.plan if self.plan is not None else plan_for(layers, self.cap_bytes, 4)


def backward_flops(layers, batch: int) -> list[int]:
    """FLOPs of each layer's backward on ``batch`` rows: for W of shape (a, b),
    dW = a_in^T dh and d_in = dh W^T cost 2 batch a b each, 4 batch a b in all."""
    return [4 * batch * W.shape[0] * W.shape[1] for W, _ in layers]


def ddp_forward_backward(comm, layers, X, T, pad_seconds):
    """Forward now; backward as it runs in DDP. Returns ``(loss, gradients)``: the local loss
    1/(2 B_local) sum (Y - T)^2, and a generator of ``(q, gradient of parameter q)`` in the order
    backward makes them, b before W from the last layer down (the reverse of the model order).

    The generator computes layer i's backward (padded to ``pad_seconds[i]``, emulated compute)
    only when asked for its first gradient: whoever consumes it overlaps communication with
    backward only by starting that communication before asking for the next gradient."""
    with comm.compute("forward"):
        acts = [X]
        for i, (W, b) in enumerate(layers):
            acts.append(mlp.layer_forward(W, b, acts[-1], i == len(layers) - 1))
    loss = float(0.5 * np.sum((acts[-1] - T) ** 2) / X.shape[0])

    def backward():
        d = (acts[-1] - T) / X.shape[0]
        for i in reversed(range(len(layers))):
            dW, db, d = padded_compute(comm, f"B{i}", pad_seconds[i], lambda i=i, d=d: mlp.layer_backward(
                layers[i][0], acts[i], acts[i + 1], d, i == len(layers) - 1))
            yield 2 * i + 1, db
            yield 2 * i, dW

    return loss, backward()


def reduce_after_backward(comm, grads, buckets, offsets, n_params):
    """The baseline without overlap: all of backward first (``grads`` drained), then each bucket's
    blocking ring allreduce, in the order of ``buckets``. The sum over ranks, flat (``offsets[q]``
    is parameter q's ``[start, end)``), in the gradients' dtype.

    Its step costs backward + sum_i c_i; question ex08_5 (:func:`course_lib.reference.ex08.reduce_in_buckets`)
    starts each c_i as soon as its bucket is complete instead."""
    everything = dict(grads)                                   # runs the whole backward
    dtype = next(iter(everything.values())).dtype if everything else np.float32
    flat_sum = np.zeros(n_params, dtype=dtype)
    for members in buckets:
        lengths = [offsets[q][1] - offsets[q][0] for q in members]
        summed = comm.allreduce(np.concatenate([everything[q].ravel() for q in members]), algorithm="ring")
        for q, piece in zip(members, np.split(summed, np.cumsum(lengths)[:-1])):
            flat_sum[offsets[q][0]:offsets[q][1]] = piece
    return flat_sum


class StartRecorder:
    """The communicator as a step's reducer sees it: every call passes through to ``comm``, and
    each ``allreduce``/``iallreduce`` is recorded as ``(bucket, comm.now())`` in :attr:`started`.

    The bucket is named by what the call carries: a bucket not yet started, all of whose
    gradients backward has made (:meth:`watch`), with as many numbers as were sent; where
    several fit, the first whose gradients are the numbers sent (in the bucket's order, else in
    any order). A call that carries no bucket (a whole vector, a single parameter of a larger
    bucket) is not recorded."""

    def __init__(self, comm, buckets, offsets):
        self._comm, self._buckets = comm, [list(b) for b in buckets]
        self._sizes = [sum(offsets[q][1] - offsets[q][0] for q in b) for b in self._buckets]
        self._made: dict = {}
        self.started: list[tuple[int, float]] = []

    def watch(self, grads):
        """``grads``, remembering every gradient as it passes."""
        for q, grad in grads:
            self._made[q] = grad
            yield q, grad

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def allreduce(self, sendobj, *args, **kwargs):
        self._record(sendobj)
        return self._comm.allreduce(sendobj, *args, **kwargs)

    def iallreduce(self, sendobj, *args, **kwargs):
        self._record(sendobj)
        return self._comm.iallreduce(sendobj, *args, **kwargs)

    def _record(self, sendobj) -> None:
        at = self._comm.now()
        sent = np.asarray(sendobj).ravel()
        done = {i for i, _ in self.started}
        fits = [i for i, members in enumerate(self._buckets) if i not in done and self._sizes[i] == sent.size
                and all(q in self._made for q in members)]
        if len(fits) > 1:
            # buckets of equal size: compare the numbers (cheaply, in the bucket's order, first);
            # the comparison delays the allreduce, by about 1 ms per 800 KB bucket on a busy 2-core machine
            fits = ([i for i in fits if self._carries(sent, i)] or
                    [i for i in fits if np.array_equal(np.sort(sent), np.sort(np.concatenate(
                        [np.asarray(self._made[q]).ravel() for q in self._buckets[i]])))])
        if fits:
            self.started.append((fits[0], at))

    def _carries(self, sent, i) -> bool:
        """Whether ``sent`` is bucket i's gradients in the bucket's order (compared piece by piece)."""
        at = 0
        for q in self._buckets[i]:
            piece = np.asarray(self._made[q]).ravel()
            if not np.array_equal(sent[at:at + piece.size], piece):
                return False
            at += piece.size
        return True


@dataclass(frozen=True)
class StepRecord:
    """One step on one rank: backward start and gradients-averaged end (comm.now() seconds),
    the buckets in the order their allreduce started, with the times, and the local loss."""
    start: float
    end: float
    started: tuple[tuple[int, float], ...]
    loss: float


@dataclass
class RankResult:
    weights: np.ndarray              # the flat float32 parameters after the run
    steps: list[StepRecord] = field(default_factory=list)


def _optimizer_step(setup: DDPSetup, adam, w: np.ndarray, g: np.ndarray) -> None:
    if adam is None:
        w -= np.float32(setup.lr) * g
    else:
        adam.step(w, g)


def ddp_train(comm, layers, X, T, setup: DDPSetup, reduce_fn=None) -> RankResult:
    """Runs on every rank: ``setup.steps`` data-parallel steps on rows ``rank`` of p of (X, T)
    in float32; the averaged gradient (sum over ranks / p) equals the full batch's.

    Each step's gradients go, as backward makes them, to ``reduce_fn(comm, grads, buckets,
    offsets, n_params)``, which returns their sum over ranks: by default question ex08_5's
    overlapped bucketed allreduce (:func:`course_lib.reference.ex08.reduce_in_buckets`), or with
    ``setup.overlap`` False the blocking baseline :func:`reduce_after_backward`."""
    p = comm.size
    if X.shape[0] % p:
        raise ValueError(f"the batch of {X.shape[0]} rows does not split evenly over {p} ranks")
    if reduce_fn is None:
        reduce_fn = _reduce_in_buckets if setup.overlap else reduce_after_backward
    rows = slice(comm.rank * X.shape[0] // p, (comm.rank + 1) * X.shape[0] // p)
    Xr, Tr = X[rows].astype(np.float32), T[rows].astype(np.float32)
    w = dpm.flatten_layers(layers, np.float32)
    plan, offsets = setup.plan_of(layers), param_offsets(layers)
    buckets = [list(b.params) for b in plan.buckets]
    pad = [setup.seconds_per_flop * f for f in backward_flops(layers, Xr.shape[0])]
    adam = dpm.Adam(lr=setup.lr).init(w.size) if setup.optimizer == "adam" else None
    out = RankResult(w)
    for _ in range(setup.steps):
        comm.barrier()
        start = comm.now()
        loss, grads = ddp_forward_backward(comm, dpm.unflatten_layers(w, layers), Xr, Tr, pad)
        recorder = StartRecorder(comm, buckets, offsets)
        summed = reduce_fn(recorder, recorder.watch(grads), buckets, offsets, w.size)
        g = np.asarray(summed, dtype=np.float32) / np.float32(p)
        out.steps.append(StepRecord(start, comm.now(), tuple(recorder.started), loss))
        _optimizer_step(setup, adam, w, g)
    return out


def serial_train(layers, X, T, setup: DDPSetup) -> np.ndarray:
    """The reference: the same steps in one process on the whole batch (float32)."""
    w = dpm.flatten_layers(layers, np.float32)
    adam = dpm.Adam(lr=setup.lr).init(w.size) if setup.optimizer == "adam" else None
    X32, T32 = X.astype(np.float32), T.astype(np.float32)
    for _ in range(setup.steps):
        _, grads = mlp.deep_forward_backward(dpm.unflatten_layers(w, layers), X32, T32)
        _optimizer_step(setup, adam, w, dpm.flatten_layers(grads, np.float32))
    return w


@dataclass
class DDPRun:
    """A run on the cluster: each rank's :class:`RankResult`, traffic and trace."""
    ranks: list[RankResult]
    plan: BucketPlan
    stats: object
    timeline: object

    @property
    def step_seconds(self) -> list[float]:
        """Per step: from the first rank's backward start to the last rank's averaged gradient."""
        return [max(r.steps[s].end for r in self.ranks) - min(r.steps[s].start for r in self.ranks)
                for s in range(len(self.ranks[0].steps))]

    @property
    def median_step(self) -> float:
        return float(np.median(self.step_seconds))

    def started_params(self) -> list[list[list[tuple[int, ...]]]]:
        """[rank][step]: the parameters of each bucket, in the order its allreduce started."""
        return [[[self.plan.buckets[i].params for i, _ in step.started] for step in r.steps] for r in self.ranks]


def lesson_network():
    """The emulated network of the lesson's runs (:data:`LATENCY_S`, :data:`BANDWIDTH_BPS`)."""
    from ..runtime.netem import Network

    return Network(latency=LATENCY_S, bandwidth=BANDWIDTH_BPS)


def run_ddp(cluster, layers, X, T, setup: DDPSetup, network=None, reduce_fn=None) -> DDPRun:
    """:func:`ddp_train` on every worker of ``cluster`` (with ``network`` for this run; the
    gradients summed by ``reduce_fn``, see :func:`ddp_train`)."""
    kwargs = {} if network is None else {"network": network}
    res = cluster.run(ddp_train, layers, X, T, setup, reduce_fn, **kwargs)
    return DDPRun(list(res), setup.plan_of(layers), res.stats, res.timeline)
