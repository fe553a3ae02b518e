"""Two ways to trade compute for memory in a data-parallel step: gradient accumulation and
activation checkpointing (the Ultra-Scale Playbook, Hugging Face 2025, "Memory usage in
Transformers"; Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016).

**Gradient accumulation.** A rank whose memory holds the activations of only ``m`` rows runs
``k`` micro-batches of ``m`` rows one after the other, adding their gradients, and allreduces
once: the update is that of one batch of ``N k m`` rows, since the loss 1/(2B) sum (Y - T)^2 is a
sum over rows (each micro-batch gradient is taken with ``B = N k m``). The allreduce moves the
same bytes whatever ``k`` (2 (N-1)/N Psi x 4 per rank with a ring), so the bytes per sample are
divided by ``k``; the activations held are those of ``m`` rows, whatever ``k``. (PyTorch's DDP
skips the allreduce of the first ``k - 1`` micro-batches under ``no_sync()``.)

**Activation checkpointing.** The forward keeps only every ``c``-th layer's output (the
checkpoints); the backward recomputes a segment of ``c`` layers from its checkpoint just before
it needs them. The last segment is not recomputed (its activations are still there when backward
starts), so the extra work is the forward of the other layers: at most one forward, a third of
forward + backward (a layer's backward costs twice its forward: dW and d_in). The memory held
drops from every layer's output to the checkpoints plus one segment; with ``c ~ sqrt(L)`` both
are ``O(sqrt(L))``. The gradient is the same, bit for bit: the same operations on the same values.

Everything here runs inside worker processes of a :class:`course_lib.Cluster`; the bytes are the
``nbytes`` of the arrays held, the times ``time.perf_counter()`` in the worker.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..datasets import contiguous_shards
from ..model_parallel.mlp import layer_backward, layer_forward
from .model import flatten_layers, unflatten_layers


# ----------------------------------------------------------------------------- checkpointing
@dataclass
class ActivationLedger:
    """Bytes of the activations held, and their peak."""
    held: int = 0
    peak: int = 0

    def keep(self, a: np.ndarray) -> np.ndarray:
        self.held += int(a.nbytes)
        self.peak = max(self.peak, self.held)
        return a

    def drop(self, a: np.ndarray) -> None:
        self.held -= int(a.nbytes)


def checkpoint_layers(n_layers: int, segment: int) -> list[int]:
    """Indices ``i`` of the activations ``a_i`` kept by the forward (``a_0 = X`` included): the
    start of every segment of ``segment`` layers, and every activation of the last segment."""
    if segment < 1:
        raise ValueError(f"segment must be >= 1 layer, got {segment}")
    starts = list(range(0, n_layers, segment))
    return sorted(set(starts) | set(range(starts[-1], n_layers + 1)))


def forward_backward(layers, X, T, batch_total: int, segment: int | None = None):
    """Loss and flat gradient of 1/(2B) sum (Y - T)^2 (B = ``batch_total``), with the
    activations kept every ``segment`` layers (``None``: all of them, no recomputation).

    Returns ``(loss, flat gradient, ledger, recomputed layers)``; the ledger counts the
    activations held (the inputs a_0 .. a_L of the layers' backward), not the gradients."""
    L = len(layers)
    segment = L if segment is None else int(segment)
    kept = set(range(L + 1)) if segment >= L else set(checkpoint_layers(L, segment))
    ledger = ActivationLedger()
    acts: dict[int, np.ndarray] = {0: ledger.keep(X)}
    a = X
    for i, (W, b) in enumerate(layers):            # forward: keep only the checkpoints
        a = layer_forward(W, b, a, i == L - 1)
        if i + 1 in kept:
            acts[i + 1] = ledger.keep(a)
    Y = acts[L]
    loss = float(0.5 * np.sum((Y - T) ** 2) / batch_total)
    d = (Y - T) / batch_total
    grads: list = [None] * L
    recomputed = 0
    for i in range(L - 1, -1, -1):
        if i not in acts or i + 1 not in acts:     # dropped: recompute the segment from its checkpoint
            start = max(j for j in acts if j <= i)
            a = acts[start]
            stop = i + 1 if i + 1 not in acts else i   # a_{i+1} may be the next segment's checkpoint
            for j in range(start, stop):
                a = layer_forward(*layers[j], a, j == L - 1)
                acts[j + 1] = ledger.keep(a)
                recomputed += 1
        W, _ = layers[i]
        dW, db, d = layer_backward(W, acts[i], acts[i + 1], d, i == L - 1)
        grads[i] = (dW, db)
        ledger.drop(acts.pop(i + 1))               # a_{i+1} is not needed any more
    return loss, flatten_layers(grads, np.float32), ledger, recomputed


@dataclass(frozen=True)
class CheckpointMeasurement:
    """One segment length on one rank: the peak activation bytes, the forward + backward
    times of ``repeats`` runs (wall-clock and the process's CPU time, seconds), the layers
    recomputed per step, the gradient. The CPU time is what the compute costs; the wall-clock
    time also counts what a busy machine kept the process waiting."""
    segment: int | None
    peak_bytes: int
    seconds: tuple[float, ...]
    recomputed: int
    grad: np.ndarray
    cpu_seconds: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    @property
    def cpu_median(self) -> float:
        return float(np.median(self.cpu_seconds))


def checkpoint_worker(comm, layers, X, T, segments, repeats: int = 5):
    """Run on every rank: forward + backward of this rank's rows with each segment length in
    ``segments`` (``None``: no checkpointing), ``repeats`` times each, interleaved so that a
    change of load hits every setting alike. Returns one :class:`CheckpointMeasurement` each."""
    lo, hi = contiguous_shards(len(X), comm.size)[comm.rank]
    X, T = X[lo:hi].astype(np.float32), T[lo:hi].astype(np.float32)
    layers = [(W.astype(np.float32), b.astype(np.float32)) for W, b in layers]
    times = {s: [] for s in segments}
    cpu = {s: [] for s in segments}
    results = {}
    for s in segments:                       # once untimed: the first call pays for allocating
        forward_backward(layers, X, T, len(X), s)
    for _ in range(repeats):
        for s in segments:
            t0, c0 = time.perf_counter(), time.process_time()
            with comm.compute(f"segment {s}"):
                results[s] = forward_backward(layers, X, T, len(X), s)
            times[s].append(time.perf_counter() - t0)
            cpu[s].append(time.process_time() - c0)
    return [CheckpointMeasurement(s, results[s][2].peak, tuple(times[s]), results[s][3], results[s][1],
                                  tuple(cpu[s])) for s in segments]


def measure_checkpointing(cluster, layers, X, T, segments, repeats: int = 5):
    """:func:`checkpoint_worker` on every worker; ``[rank][segment]`` measurements."""
    return list(cluster.run(checkpoint_worker, layers, X, T, list(segments), repeats))


# ----------------------------------------------------------------------------- accumulation
@dataclass(frozen=True)
class AccumulationRank:
    """One rank's run: final weights, bytes it sent per step, peak activation bytes held."""
    weights: np.ndarray
    bytes_per_step: float
    peak_activation_bytes: int


def accumulation_worker(comm, layers, X, T, micro_rows: int, k: int, steps: int, lr: float):
    """Run on every rank: ``steps`` SGD steps, each on ``k`` micro-batches of ``micro_rows`` rows
    of this rank (rows ``[rank k m, (rank + 1) k m)`` of the global batch of ``N k m`` rows),
    gradients added locally, one ring allreduce per step (float32)."""
    per_rank = micro_rows * k
    if len(X) != per_rank * comm.size:
        raise ValueError(f"the batch has {len(X)} rows; N k m = {comm.size} x {k} x {micro_rows} are needed")
    rows = slice(comm.rank * per_rank, (comm.rank + 1) * per_rank)
    Xr, Tr = X[rows].astype(np.float32), T[rows].astype(np.float32)
    w = flatten_layers(layers, np.float32)
    peak = 0
    before = comm.stats.bytes_sent(comm.rank)
    for _ in range(steps):
        g = np.zeros_like(w)
        for j in range(k):                        # the micro-batches, one after the other
            mb = slice(j * micro_rows, (j + 1) * micro_rows)
            _, gj, ledger, _ = forward_backward(unflatten_layers(w, layers), Xr[mb], Tr[mb], len(X))
            g += gj
            peak = max(peak, ledger.peak)
        g = comm.allreduce(g, algorithm="ring")   # once per step, whatever k
        w -= np.float32(lr) * g
    sent = comm.stats.bytes_sent(comm.rank) - before
    return AccumulationRank(w, sent / steps, peak)


def run_accumulation(cluster, layers, X, T, micro_rows: int, k: int, steps: int = 2, lr: float = 0.05):
    """:func:`accumulation_worker` on every worker of ``cluster``."""
    return list(cluster.run(accumulation_worker, layers, X, T, micro_rows, k, steps, lr))


def serial_sgd(layers, X, T, steps: int = 2, lr: float = 0.05) -> np.ndarray:
    """The single-process baseline: ``steps`` SGD steps on the whole batch at once (float32)."""
    w = flatten_layers(layers, np.float32)
    X32, T32 = X.astype(np.float32), T.astype(np.float32)
    for _ in range(steps):
        _, g, _, _ = forward_backward(unflatten_layers(w, layers), X32, T32, len(X))
        w -= np.float32(lr) * g
    return w
