"""Where a data-parallel worker's memory goes in mixed-precision training with Adam.

Training state, per parameter (Rajbhandari et al., "ZeRO", SC 2020, section 3.1; the
Ultra-Scale Playbook): fp16 parameters 2 bytes, fp16 gradients 2, and the optimizer's
fp32 master weights, Adam's m and v 4 + 4 + 4 = 12: 16 bytes per parameter, whatever the batch.

Activations: the forward cache the backward needs. For lesson 06's tanh stack with widths
``d_0 .. d_L`` it keeps the input and every layer's output, ``B (d_0 + d_1 + ... + d_L)``
values of 2 bytes in fp16: the input ``a_0 = X`` and each ``a_{i-1}`` for ``dW_i = a_{i-1}^T dh_i``,
each hidden ``a_i`` for tanh' = 1 - a_i^2, the output ``Y`` for ``dL/dY = (Y - T) / B``. The
pre-activations are not kept (tanh' is computed from the output). This grows linearly with B.

Every number here is measured inside a worker process of a :class:`course_lib.Cluster`:
the ``nbytes`` of the arrays it holds after a real training step, sent back to the parent.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_lib.data_parallel.mixed_precision import DynamicLossScaler, MixedPrecisionState

# Bytes per parameter of each part of the training state (ZeRO, section 3.1).
BYTES_PER_PARAM = {"fp16 parameters": 2, "fp16 gradients": 2, "fp32 master weights": 4,
                   "Adam m": 4, "Adam v": 4}
FP16_BYTES = 2


@dataclass(frozen=True)
class StateBytes:
    """The training state one worker holds, measured (``nbytes``) and by the formula."""
    rank: int
    n_params: int
    measured: dict  # category -> bytes, categories as in BYTES_PER_PARAM

    @property
    def formula(self) -> dict:
        """``n_params x`` bytes per parameter of each category."""
        return {k: self.n_params * b for k, b in BYTES_PER_PARAM.items()}

    @property
    def total(self) -> int:
        return int(sum(self.measured.values()))

    @property
    def bytes_per_param(self) -> float:
        return self.total / self.n_params


@dataclass(frozen=True)
class ActivationBytes:
    """The forward cache at one batch size: measured ``nbytes`` and ``B * sum(widths) * 2``."""
    batch: int
    measured: int
    formula: int
    kept: tuple  # shapes of the kept arrays: X, a_1, ..., Y


@dataclass(frozen=True)
class MemoryAnatomy:
    """Training state per worker and activations per batch size, from one cluster run."""
    widths: tuple
    states: list       # StateBytes, one per rank
    activations: list  # ActivationBytes, one per batch size


def activation_formula(widths, batch: int, bytes_per_value: int = FP16_BYTES) -> int:
    """``B * (d_0 + d_1 + ... + d_L) * bytes``: the input and every layer's output."""
    return int(batch) * int(sum(widths)) * int(bytes_per_value)


def state_bytes_of(state: MixedPrecisionState, rank: int) -> StateBytes:
    """``nbytes`` of each array a mixed-precision worker holds."""
    measured = {"fp16 parameters": state.params16.nbytes, "fp16 gradients": state.grads16.nbytes,
                "fp32 master weights": state.master.nbytes, "Adam m": state.adam.m.nbytes,
                "Adam v": state.adam.v.nbytes}
    return StateBytes(rank, int(state.master.size), {k: int(v) for k, v in measured.items()})


def memory_worker(comm, layers, batches, seed: int = 0):
    """Run on every rank: one real mixed-precision data-parallel step (fp16 forward/backward,
    fp16 allreduce, Adam on the fp32 master), then the bytes of what the rank holds, and of
    the forward cache at each batch size in ``batches``."""
    rng = np.random.default_rng(seed + comm.rank)
    widths = [layers[0][0].shape[0]] + [W.shape[1] for W, _ in layers]
    state = MixedPrecisionState.from_layers(layers, lr=1e-3)
    scaler = DynamicLossScaler()
    X, T = rng.normal(size=(batches[0], widths[0])), rng.normal(size=(batches[0], widths[-1]))
    state.forward_backward(X, T, scaler.scale, batches[0] * comm.size)
    with np.errstate(over="ignore", invalid="ignore"):
        reduced = comm.allreduce(state.grads16)
    scaler.update(state.apply(reduced, scaler.scale))
    activations = []
    for B in batches:
        X, T = rng.normal(size=(B, widths[0])), rng.normal(size=(B, widths[-1]))
        _, cache = state.forward_backward(X, T, scaler.scale, B)
        activations.append(ActivationBytes(int(B), int(sum(a.nbytes for a in cache)),
                                           activation_formula(widths, B), tuple(a.shape for a in cache)))
    return state_bytes_of(state, comm.rank), activations


def measure_memory(cluster, layers, batches=(64, 128, 256, 512, 1024), seed: int = 0) -> MemoryAnatomy:
    """:func:`memory_worker` on every worker of ``cluster``; rank 0's activations."""
    res = cluster.run(memory_worker, layers, list(batches), seed)
    widths = (layers[0][0].shape[0],) + tuple(W.shape[1] for W, _ in layers)
    return MemoryAnatomy(widths, [r[0] for r in res], res[0][1])


def plot_memory(anatomy: MemoryAnatomy, axes=None):
    """Left: stacked bars of the measured bytes per category for each rank, the formula
    ``16 x n_params`` and its parts marked. Right: activations against batch size,
    measured points and the formula line. Returns the figure."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax, ax2 = axes
    for state in anatomy.states:
        bottom = 0
        for k, (cat, nbytes) in enumerate(state.measured.items()):
            ax.bar(state.rank, nbytes / 1e3, bottom=bottom / 1e3, color=f"C{k}", width=0.5,
                   label=f"{cat} ({BYTES_PER_PARAM[cat]} B/param)" if state.rank == 0 else None)
            bottom += nbytes
        edges = np.cumsum(list(state.formula.values()))
        ax.hlines(edges / 1e3, state.rank - 0.35, state.rank + 0.35, colors="k", linestyles="--",
                  label="formula (cumulative)" if state.rank == 0 else None)
    ax.set_xticks([s.rank for s in anatomy.states], [f"rank {s.rank}" for s in anatomy.states])
    ax.set_ylabel("kB held by the worker")
    ax.set_title(f"training state, measured: {anatomy.states[0].n_params:,} parameters")
    ax.set_xlim(-0.5, len(anatomy.states) + 1.3)  # room for the legend beside the bars
    ax.legend(fontsize=8, loc="center right")
    B = np.array([a.batch for a in anatomy.activations])
    ax2.plot(B, [a.formula / 1e3 for a in anatomy.activations], "-", color="C5", label="formula B x sum(widths) x 2 B")
    ax2.plot(B, [a.measured / 1e3 for a in anatomy.activations], "o", color="k", label="measured (nbytes of the cache)")
    ax2.axhline(anatomy.states[0].total / 1e3, color="C0", ls=":", label="training state (does not grow with B)")
    ax2.set_xlabel("batch size B on the worker")
    ax2.set_ylabel("kB")
    ax2.set_title("activations kept for the backward, measured")
    ax2.legend(fontsize=8)
    ax.figure.tight_layout()
    return ax.figure
