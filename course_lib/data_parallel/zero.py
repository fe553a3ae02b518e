"""ZeRO stages 1, 2 and 3 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC 2020) on real worker processes, beside plain data parallel.

Mixed-precision training with Adam keeps, per parameter, an fp16 working copy (2 bytes), an fp16
gradient (2 bytes) and the fp32 master weight, m and v (12 bytes): 16 bytes. Stage 1 shards the
optimizer states over the N ranks, stage 2 the gradients too, stage 3 the parameters too; how many
bytes per parameter each rank then holds is question ex08_4 (:func:`zero_bytes_per_param` runs the
answer). Communication volume per rank, as the paper states it (section 7, in elements): 2 Psi for
plain DP (an allreduce is a reduce-scatter and an allgather, Psi each) and for stages 1 and 2, 3 Psi
for stage 3 (the parameters are allgathered twice, before forward and before backward: 1.5x). With
ring collectives each rank sends exactly (N-1)/N Psi per reduce-scatter or allgather (the paper
rounds (N-1)/N up to 1), so the mean per rank is 2 (N-1)/N Psi and 3 (N-1)/N Psi elements
(:func:`zero_elements_per_rank`), fp16 on the wire: x 2 bytes; summed over all ranks
2 (N-1) Psi x 2 and 3 (N-1) Psi x 2 bytes (:func:`zero_bytes_per_step`).

Memory is measured from
the arrays each rank holds (:class:`MemoryLedger`): the training state, plus stage 2's and 3's
transient one-layer buffers (the gradient bucket being reduce-scattered, the layer's gathered
parameters). Not counted: activations and the float32 compute copies of a layer (the lesson's
memory-anatomy section measures activations) and the collectives' own send/receive chunks.

Layout. Stage 1 shards the flat vector as ``comm.reduce_scatter`` cuts it (``np.array_split``):
rank r owns :func:`shard_range`. Stages 2 and 3 reduce-scatter each layer's gradient as soon as
backward produces it (one bucket per layer), so rank r owns chunk r of every layer.

Equality with plain DP: the ring reduce-scatter adds the ranks' values of chunk c in the same
order as the first half of a ring allreduce, and Adam is elementwise, so stage 1 equals DP that
allreduces the whole gradient at once, and stages 2 and 3 equal DP that allreduces each layer
as it is produced (DDP with one bucket per layer): bit for bit. The two DP groupings differ only
in the order of fp16 additions (identical at N = 2, where two addends commute). From N = 3 on the
ring cuts the whole vector and each layer into different chunks, so an element's N addends are
summed starting from different ranks and round differently; Adam then magnifies a few of these
differences: its first step is lr g / (|g| + eps), about lr sign(g) whatever the size of g, so an
element whose fp16 sum is exactly 0 in one grouping and not in the other moves by 0 in one and by
about lr in the other (lesson 08 measures it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from course_lib.reference.ex08 import shard_range  # noqa: F401 (question ex08_3, re-exported)
from course_lib.reference.ex08 import zero_bytes_per_param as _zero_bytes_per_param  # question ex08_4

from ..datasets import contiguous_shards  # the runs cut as reduce_scatter does, whatever ex08_3 answers
from ..model_parallel.mlp import init_deep, layer_backward, layer_forward, make_data
from .model import Adam, flatten_layers, layer_ranges, layer_sizes

CATEGORIES = ("params fp16", "grads fp16", "optimizer fp32", "gathered params", "gradient bucket")
STATE_CATEGORIES = CATEGORIES[:3]


def zero_bytes_per_param(stage: int, n_ranks: int) -> float:
    """Model-state bytes per parameter on each rank, stage 0 (plain DP) to 3: question ex08_4
    (:func:`course_lib.reference.ex08.zero_bytes_per_param`), its stage checked."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (plain DP), 1, 2 or 3, got {stage}")
    return _zero_bytes_per_param(stage, n_ranks)


def zero_bytes_per_step(stage: int, n_params: int, n_ranks: int, itemsize: int = 2) -> int:
    """Bytes all ranks send in one step with ring collectives: a ring reduce-scatter or allgather
    of Psi elements sends (N-1) Psi elements in all, an allreduce twice that. DP and stages 1-2:
    2 (N-1) Psi; stage 3 allgathers the parameters twice (forward, backward) and
    reduce-scatters the gradients: 3 (N-1) Psi."""
    zero_bytes_per_param(stage, n_ranks)                      # validates the stage
    passes = 3 if stage == 3 else 2
    return passes * (int(n_ranks) - 1) * int(n_params) * int(itemsize)


def zero_elements_per_rank(stage: int, n_params: int, n_ranks: int, exact: bool = True) -> float:
    """Elements one rank sends per step, on average over the ranks (Rajbhandari et al. 2020,
    section 7): ``passes x (N-1)/N x Psi`` with ring collectives (``exact``), or the paper's
    ``passes x Psi`` (``exact=False``), passes = 2 for DP and stages 1-2, 3 for stage 3."""
    zero_bytes_per_param(stage, n_ranks)                      # validates the stage
    passes = 3 if stage == 3 else 2
    n_ranks = int(n_ranks)
    return passes * int(n_params) * ((n_ranks - 1) / n_ranks if exact else 1.0)


# -- memory accounting -------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryReport:
    """Bytes a rank held at its peak, by category, and the peak itself."""
    peak_bytes: int
    at_peak: dict[str, int]

    @property
    def state_bytes(self) -> int:
        """The persistent training state at the peak (parameters, gradients, optimizer)."""
        return sum(self.at_peak[c] for c in STATE_CATEGORIES)

    @property
    def transient_bytes(self) -> int:
        return self.peak_bytes - self.state_bytes


@dataclass
class MemoryLedger:
    """The arrays a rank holds, by category, with the peak of their total ``nbytes``."""
    held: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    peak: MemoryReport = field(default_factory=lambda: MemoryReport(0, dict.fromkeys(CATEGORIES, 0)))

    def hold(self, name: str, category: str, array: np.ndarray) -> np.ndarray:
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {CATEGORIES}")
        self.held[name] = (category, array)
        now = self.by_category()
        if sum(now.values()) > self.peak.peak_bytes:
            self.peak = MemoryReport(sum(now.values()), now)
        return array

    def free(self, name: str) -> None:
        del self.held[name]

    def by_category(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for category, array in self.held.values():
            out[category] += int(array.nbytes)
        return out


# -- the run -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZeroConfig:
    """The model (widths of lesson 06's tanh stack), the global batch and Adam's settings."""
    widths: tuple[int, ...] = (31, 48, 48, 48, 48, 48, 48, 8)
    batch: int = 64
    steps: int = 10
    lr: float = 1e-2
    loss_scale: float = 1.0        # a constant loss scale: gradients x S before fp16, / S in fp32
    seed: int = 0
    data_seed: int = 1


def owned_pieces(sizes: list[int], stage: int, n_ranks: int, rank: int) -> list[tuple[int, int]]:
    """Flat ``[start, stop)`` ranges rank owns: stage 1 one chunk of the whole vector, stages 2-3
    chunk ``rank`` of every layer (each layer is reduce-scattered on its own)."""
    if stage <= 1:
        return [contiguous_shards(sum(sizes), n_ranks)[rank]]
    starts = np.cumsum([0] + list(sizes))
    return [(int(a) + s, int(a) + e) for a, n in zip(starts, sizes)
            for s, e in [contiguous_shards(n, n_ranks)[rank]]]


@dataclass
class _RankState:
    """What one rank holds, and how its stage fetches parameters and reduces gradients."""
    comm: object
    stage: int
    cfg: ZeroConfig
    dp_by_layer: bool
    ledger: MemoryLedger
    ranges: list[tuple[int, int]]
    pieces: list[tuple[int, int]]
    params16: np.ndarray = None          # full (DP, stages 1-2) or the own shard (stage 3)
    grads16: np.ndarray = None           # full (DP, stage 1) or the own shard (stages 2-3)
    master: np.ndarray = None            # fp32, full (DP) or own shard
    adam: Adam = None

    def layer_params(self, i: int, like):
        """Layer i's (W, b) as float32 for compute; stage 3 allgathers them first."""
        a, b = self.ranges[i]
        if self.stage < 3:
            flat = self.params16[a:b]
        else:
            s, e = contiguous_shards(b - a, self.comm.size)[self.comm.rank]
            off = self._shard_offset(i)
            parts = self.comm.allgather(self.params16[off:off + e - s])
            flat = self.ledger.hold("gathered", "gathered params", np.concatenate(parts))
        W, bias = like[i]
        return flat[:W.size].astype(np.float32).reshape(W.shape), flat[W.size:].astype(np.float32)

    def done_with_params(self) -> None:
        if self.stage == 3:
            self.ledger.free("gathered")

    def _shard_offset(self, i: int) -> int:
        """Where layer i's piece starts in this rank's shard (stages 2-3)."""
        return sum(e - s for s, e in self.pieces[:i])

    def gradient_ready(self, i: int, g16: np.ndarray) -> None:
        """Backward produced layer i's fp16 gradient: store it, or reduce it now (buckets)."""
        a, b = self.ranges[i]
        if self.stage == 0 and self.dp_by_layer:
            self.grads16[a:b] = self.comm.allreduce(g16, algorithm="ring")
        elif self.stage <= 1:
            self.grads16[a:b] = g16
        else:
            self.ledger.hold("bucket", "gradient bucket", g16)
            off = self._shard_offset(i)
            piece = self.comm.reduce_scatter(g16)
            self.grads16[off:off + piece.size] = piece
            self.ledger.free("bucket")

    def update(self) -> None:
        """After backward: finish the reduction, Adam on what this rank owns, share the result."""
        if self.stage == 0 and not self.dp_by_layer:
            self.grads16[:] = self.comm.allreduce(self.grads16, algorithm="ring")
        if self.stage == 1:
            s, e = self.pieces[0]
            self.grads16[s:e] = self.comm.reduce_scatter(self.grads16)
        own = self.grads16[slice(*self.pieces[0])] if self.stage == 1 else self.grads16
        self.adam.step(self.master, own.astype(np.float32) / np.float32(self.cfg.loss_scale))
        if self.stage in (0, 3):
            self.params16[:] = self.master.astype(np.float16)
            return
        shards = self.comm.allgather(self.master.astype(np.float16))
        for rank, shard in enumerate(shards):
            at = 0
            for s, e in owned_pieces(layer_sizes_of(self.ranges), self.stage, self.comm.size, rank):
                self.params16[s:e] = shard[at:at + e - s]
                at += e - s


def layer_sizes_of(ranges) -> list[int]:
    return [b - a for a, b in ranges]


def _init_rank(comm, stage: int, cfg: ZeroConfig, dp_by_layer: bool, layers) -> _RankState:
    """Every rank starts from the same fp32 master weights and keeps only what its stage keeps."""
    sizes = layer_sizes(layers)
    ledger = MemoryLedger()
    pieces = owned_pieces(sizes, max(stage, 1), comm.size, comm.rank)
    full32 = flatten_layers(layers, np.float32)
    own32 = full32 if stage == 0 else np.concatenate([full32[s:e] for s, e in pieces])
    st = _RankState(comm, stage, cfg, dp_by_layer, ledger, layer_ranges(layers), pieces)
    st.params16 = ledger.hold("params", "params fp16", (own32 if stage == 3 else full32).astype(np.float16))
    st.grads16 = ledger.hold("grads", "grads fp16",
                             np.zeros(own32.size if stage >= 2 else full32.size, np.float16))
    st.master = ledger.hold("master", "optimizer fp32", own32.copy())
    st.adam = Adam(lr=cfg.lr).init(own32.size)
    ledger.hold("adam m", "optimizer fp32", st.adam.m)
    ledger.hold("adam v", "optimizer fp32", st.adam.v)
    return st


def _train_step(st: _RankState, layers, X, T, batch_total: int) -> float:
    """Forward layer by layer, backward layer by layer (each gradient handed over as soon as it
    exists), then the update. Returns this rank's share of the loss 1/(2B) sum (Y - T)^2."""
    acts = [X]
    last = len(layers) - 1
    for i in range(len(layers)):
        W, b = st.layer_params(i, layers)
        acts.append(layer_forward(W, b, acts[-1], i == last))
        st.done_with_params()
    loss = float(0.5 * np.sum((acts[-1].astype(np.float64) - T) ** 2) / batch_total)
    d = (acts[-1] - T) * np.float32(st.cfg.loss_scale / batch_total)
    for i in range(last, -1, -1):
        W, b = st.layer_params(i, layers)
        dW, db, d = layer_backward(W, acts[i], acts[i + 1], d, i == last)
        st.done_with_params()
        st.gradient_ready(i, np.concatenate([dW.ravel(), db]).astype(np.float16))
    st.update()
    return loss


@dataclass(frozen=True)
class ZeroRankResult:
    """One rank's view: its master shard, the flat pieces it owns, its loss shares, its memory."""
    rank: int
    master: np.ndarray
    pieces: list[tuple[int, int]]
    losses: list[float]
    memory: MemoryReport


def zero_worker(comm, stage: int, cfg: ZeroConfig, dp_by_layer: bool = False) -> ZeroRankResult:
    """Train ``cfg.steps`` steps of ZeRO ``stage`` (0 = plain DP) on this rank's slice of the batch.

    ``dp_by_layer`` (stage 0 only): allreduce each layer's gradient as backward produces it
    (the reduction order of stages 2-3) instead of the whole gradient after backward (stage 1's)."""
    layers = [(W.astype(np.float32), b.astype(np.float32)) for W, b in init_deep(cfg.widths, cfg.seed)]
    X, T = make_data(cfg.batch, cfg.widths[0], cfg.widths[-1], cfg.data_seed)
    lo, hi = contiguous_shards(cfg.batch, comm.size)[comm.rank]
    X, T = X[lo:hi].astype(np.float32), T[lo:hi].astype(np.float32)
    st = _init_rank(comm, stage, cfg, dp_by_layer, layers)
    losses = [_train_step(st, layers, X, T, cfg.batch) for _ in range(cfg.steps)]
    pieces = [(0, st.master.size)] if stage == 0 else st.pieces
    return ZeroRankResult(comm.rank, st.master, pieces, losses, st.ledger.peak)


@dataclass(frozen=True)
class ZeroRun:
    """A whole run: the fp32 master weights put back together, the loss per step (summed over
    ranks), each rank's memory, and the bytes and messages of the run."""
    stage: int
    n_ranks: int
    n_params: int
    steps: int
    master: np.ndarray
    losses: np.ndarray
    memory: list[MemoryReport]
    bytes_total: int
    messages_total: int
    bytes_per_rank: tuple[int, ...] = ()   # what each rank sent in the whole run

    @property
    def bytes_per_step(self) -> float:
        return self.bytes_total / self.steps

    @property
    def bytes_per_rank_per_step(self) -> np.ndarray:
        """Each rank's bytes sent per step (they differ by the array_split remainders)."""
        return np.asarray(self.bytes_per_rank, dtype=float) / self.steps

    @property
    def bytes_per_param(self) -> list[float]:
        """Each rank's peak (state + transient buffers) divided by the parameter count."""
        return [m.peak_bytes / self.n_params for m in self.memory]


def run_zero(cluster, stage: int, cfg: ZeroConfig = ZeroConfig(), dp_by_layer: bool = False) -> ZeroRun:
    """Run :func:`zero_worker` on every rank of ``cluster`` and assemble the result."""
    res = cluster.run(zero_worker, stage, cfg, dp_by_layer)
    n = sum(layer_sizes(init_deep(cfg.widths, cfg.seed)))
    master = np.empty(n, np.float32)
    for r in res:
        at = 0
        for s, e in r.pieces:
            master[s:e] = r.master[at:at + e - s]
            at += e - s
    losses = np.sum([r.losses for r in res], axis=0)
    return ZeroRun(stage, len(res), n, cfg.steps, master, losses, [r.memory for r in res],
                   res.stats.total_bytes, res.stats.total_messages,
                   tuple(int(res.stats.bytes_sent(r)) for r in range(len(res))))


# -- stage 3 with parameter prefetch (FSDP's forward/backward prefetch) ------------------------
#: The emulation of :func:`run_zero3_prefetch`: each layer's forward padded to 6 ms and its backward
#: to 12 ms (twice: dW and d_in), on a network of 4 ms latency and 50 MB/s, so that gathering a
#: layer's parameters costs two thirds of its forward (emulated; milliseconds, so that a loaded
#: 2-core machine's scheduling delays do not drown it).
PREFETCH_FORWARD_S, PREFETCH_BACKWARD_S = 6e-3, 12e-3
PREFETCH_LATENCY_S, PREFETCH_BANDWIDTH_BPS = 4e-3, 50e6


def prefetch_network():
    """The emulated network of the prefetch demonstration."""
    from ..runtime.netem import Network

    return Network(latency=PREFETCH_LATENCY_S, bandwidth=PREFETCH_BANDWIDTH_BPS)


class _Gather:
    """A direct allgather of one layer's parameter shards with isend/irecv: each rank sends its
    shard to each of the N-1 others, (N-1) shards per rank as in a ring allgather, but all at once,
    so it proceeds in the rank's sender threads while the main thread computes."""

    def __init__(self, comm, shard: np.ndarray, tag: int):
        self.comm, self.tag = comm, tag
        others = [r for r in range(comm.size) if r != comm.rank]
        self.recvs = {r: comm.irecv(source=r, tag=tag) for r in others}
        self.sends = [comm.isend(shard, r, tag=tag) for r in others]
        self.own = shard

    def wait(self) -> np.ndarray:
        parts = {self.comm.rank: self.own}
        parts.update({r: req.wait() for r, req in self.recvs.items()})
        for req in self.sends:
            req.wait()
        return np.concatenate([parts[r] for r in range(self.comm.size)])


def zero3_prefetch_worker(comm, cfg: ZeroConfig, prefetch: bool,
                          seconds=(PREFETCH_FORWARD_S, PREFETCH_BACKWARD_S)):
    """One ZeRO stage-3 step (``cfg.steps`` is ignored) whose parameter gathers overlap compute
    when ``prefetch``: the gather of the next layer's parameters (layer i+1 in forward, i-1 in
    backward) is started before the current layer computes, as FSDP's forward and backward
    prefetch do; without it, each gather starts only when its layer is about to compute.

    Each layer's compute is padded (:func:`~course_lib.model_parallel.pipeline.padded_compute`)
    to ``seconds`` (forward, backward), labelled ``F<i>`` and ``B<i>``. The gradients are
    reduce-scattered per layer after backward, as :func:`zero_worker` does during it, so the
    result is :func:`run_zero`'s stage 3 after one step, bit for bit. Returns
    ``(rank result, (step start, end of backward, step end) in comm.now() seconds)``."""
    from ..model_parallel.pipeline import padded_compute

    layers = [(W.astype(np.float32), b.astype(np.float32)) for W, b in init_deep(cfg.widths, cfg.seed)]
    X, T = make_data(cfg.batch, cfg.widths[0], cfg.widths[-1], cfg.data_seed)
    lo, hi = contiguous_shards(cfg.batch, comm.size)[comm.rank]
    X, T = X[lo:hi].astype(np.float32), T[lo:hi].astype(np.float32)
    st = _init_rank(comm, 3, cfg, False, layers)
    L = len(layers)

    def start(i: int, phase: int) -> _Gather:
        off, (s, e) = st._shard_offset(i), st.pieces[i]
        return _Gather(comm, st.params16[off:off + e - s], tag=1000 * phase + i)

    def params_of(flat, i):
        W, _ = layers[i]
        return flat[:W.size].astype(np.float32).reshape(W.shape), flat[W.size:].astype(np.float32)

    comm.barrier()
    t0 = comm.now()
    acts = [X]
    pending = start(0, 1)
    for i in range(L):                                  # forward
        flat = pending.wait()
        nxt = (i + 1, 1) if i + 1 < L else (L - 1, 2)  # after the last layer: the first of backward
        if prefetch:                                    # start the next gather before computing
            pending = start(*nxt)
        W, b = params_of(flat, i)
        acts.append(padded_compute(comm, f"F{i}", seconds[0],
                                   lambda W=W, b=b, i=i: layer_forward(W, b, acts[-1], i == L - 1)))
        if not prefetch:                                # only once this layer is done
            pending = start(*nxt)
    loss = float(0.5 * np.sum((acts[-1].astype(np.float64) - T) ** 2) / cfg.batch)
    d = (acts[-1] - T) * np.float32(cfg.loss_scale / cfg.batch)
    grads = [None] * L
    for i in range(L - 1, -1, -1):                      # backward
        flat = pending.wait()
        if prefetch:
            pending = start(i - 1, 2) if i > 0 else None
        W, b = params_of(flat, i)
        dW, db, d = padded_compute(comm, f"B{i}", seconds[1],
                                   lambda W=W, i=i, d=d: layer_backward(W, acts[i], acts[i + 1], d, i == L - 1))
        if not prefetch:
            pending = start(i - 1, 2) if i > 0 else None
        grads[i] = np.concatenate([dW.ravel(), db]).astype(np.float16)
    t_backward = comm.now()
    for i in range(L - 1, -1, -1):                      # reduce-scatter, in the order backward made them
        st.gradient_ready(i, grads[i])
    st.update()
    t1 = comm.now()
    return ZeroRankResult(comm.rank, st.master, st.pieces, [loss], st.ledger.peak), (t0, t_backward, t1)


@dataclass(frozen=True)
class PrefetchRun:
    """:func:`zero3_prefetch_worker` on every rank: the master put back together, each rank's
    (start, end of backward, end) of the step, the trace and traffic."""
    prefetch: bool
    master: np.ndarray
    spans: list[tuple[float, float, float]]
    timeline: object = field(repr=False)
    stats: object = field(repr=False)

    @property
    def step_seconds(self) -> float:
        """From the first rank's start to the last rank's end."""
        return max(e for _, _, e in self.spans) - min(s for s, _, _ in self.spans)

    @property
    def forward_backward_seconds(self) -> float:
        """From the first rank's start to the last rank's end of backward: the part prefetch acts on."""
        return max(b for _, b, _ in self.spans) - min(s for s, _, _ in self.spans)


def prefetch_model(cfg: ZeroConfig, n_ranks: int, prefetch: bool, network=None,
                   seconds=(PREFETCH_FORWARD_S, PREFETCH_BACKWARD_S)) -> float:
    """Forward + backward time of :func:`zero3_prefetch_worker`, alpha-beta model: a gather of
    layer i costs g_i = latency + (N-1) x shard bytes / bandwidth (the shards arrive one after the
    other on the receiver's link). Without prefetch every layer waits for its gather: sum over
    2L gathers + L (forward + backward). With prefetch the gather of the next layer runs while
    this one computes, so only what exceeds the compute shows: the first gather, then
    max(compute_i, g_next) per layer."""
    net = prefetch_network() if network is None else network
    sizes = layer_sizes(init_deep(cfg.widths, cfg.seed))

    def gather(i):
        shard = int(np.ceil(sizes[i] / n_ranks)) * 2
        return net.latency + (n_ranks - 1) * shard / net.bandwidth

    order = [(i, seconds[0]) for i in range(len(sizes))] + [(i, seconds[1]) for i in reversed(range(len(sizes)))]
    if not prefetch:
        return sum(gather(i) + c for i, c in order)
    total = gather(order[0][0])
    for k, (_, c) in enumerate(order):
        total += max(c, gather(order[k + 1][0])) if k + 1 < len(order) else c
    return total


def run_zero3_prefetch(cluster, cfg: ZeroConfig, prefetch: bool, network=None,
                       seconds=(PREFETCH_FORWARD_S, PREFETCH_BACKWARD_S)) -> PrefetchRun:
    """One stage-3 step with or without prefetch on ``network`` (default :func:`prefetch_network`)."""
    res = cluster.run(zero3_prefetch_worker, cfg, prefetch, seconds,
                      network=prefetch_network() if network is None else network)
    n = sum(layer_sizes(init_deep(cfg.widths, cfg.seed)))
    master = np.empty(n, np.float32)
    for r, _ in res:
        at = 0
        for s, e in r.pieces:
            master[s:e] = r.master[at:at + e - s]
            at += e - s
    return PrefetchRun(prefetch, master, [tuple(span) for _, span in res], res.timeline, res.stats)
