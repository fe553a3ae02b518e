"""Mixed-precision training with dynamic loss scaling (Micikevicius et al., "Mixed Precision
Training", ICLR 2018), data parallel on real worker processes.

Each step, on every worker:

1. cast the fp32 master weights to fp16 (2 bytes per parameter);
2. forward and backward in fp16: every product is accumulated in fp32 and rounded to fp16
   when stored, as tensor cores do; the backward starts from ``S * dL/dY``, so every fp16
   gradient is ``S`` times the true one and small values stay above fp16's smallest
   subnormal ``2**-24 ~ 6e-8`` instead of rounding to zero;
3. allreduce the fp16 gradients with the ring algorithm: 2 (N-1) n x 2 bytes over all ranks,
   exactly half of fp32's 2 (N-1) n x 4. The algorithm is named, not left to the default, which
   switches from recursive doubling to the ring at 64 KiB: a payload half the size could then run
   another algorithm and move more than half the bytes (at N = 5 recursive doubling sends 10 n
   items in all where the ring sends 8 n);
4. unscale in fp32 (``g = g16 / S``); if any entry is inf or nan, skip the update (all ranks
   see the same reduced gradient, so all skip together); otherwise Adam updates the fp32
   master copy;
5. update ``S`` by :func:`update_scale`.

bfloat16 (Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", 2019) keeps fp32's
8 exponent bits and 7 of its 23 fraction bits: the same range as fp32 (smallest normal
``2**-126 ~ 1.2e-38``), so gradients that fp16's 5 exponent bits flush to zero survive and no loss
scaling is needed; the price is precision: 8 significant bits against fp16's 11, a relative
rounding error up to ``2**-8`` against ``2**-11``, which is why the master weights stay fp32.
numpy has no bfloat16: it is **emulated** here by rounding a float32 to
nearest-even on its low 16 bits (:func:`bf16_round`), and sent as the high 16 bits
(:func:`bf16_encode`), 2 bytes an element, summed by :data:`BF16_SUM` (each partial sum in
float32, rounded back to bf16, as an fp16 ring sum is).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from course_lib.data_parallel.model import Adam, flatten_layers, unflatten_layers
from course_lib.model_parallel.mlp import deep_forward_backward, init_deep, make_data
from course_lib.reference.ex08 import update_scale as _update_scale  # question ex08_2
from course_lib.runtime.ops import Op

HALF = np.float16
FP16_SMALLEST_SUBNORMAL = float(np.finfo(HALF).smallest_subnormal)  # 2**-24
FP16_MAX = float(np.finfo(HALF).max)                                 # 65504
BF16_SMALLEST_SUBNORMAL = 2.0 ** -133                                # 7 fraction bits below 2**-126
BF16_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)              # 2**-126, as fp32's


# ----------------------------------------------------------------------------- bfloat16, emulated
def bf16_round(x) -> np.ndarray:
    """``x`` rounded to bfloat16, as float32 values whose low 16 bits are 0 (round to nearest,
    ties to even, on the bits: add ``0x7FFF`` plus the lowest kept bit, then clear the low half).
    NaN stays NaN; values above bf16's largest finite number become inf, as in a real cast."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    bits = x32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x32), np.float32(np.nan), rounded).reshape(np.shape(x))


def bf16_encode(x) -> np.ndarray:
    """The 2-byte wire form of bf16: the high 16 bits of :func:`bf16_round` ``(x)``, as uint16."""
    return (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)


def bf16_decode(u) -> np.ndarray:
    """float32 values of bf16 numbers in wire form (:func:`bf16_encode`)."""
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _bf16_sum(a, b):
    """Two bf16 partial sums (wire form) added in float32 and rounded back to bf16."""
    return bf16_encode(bf16_decode(a) + bf16_decode(b))


#: Sum of bf16 arrays in wire form: commutative, so the ring may use it; 2 bytes an element.
BF16_SUM = Op(_bf16_sum, commute=True, name="sum@bfloat16")


def _store_fp16(x) -> np.ndarray:
    return np.asarray(x).astype(HALF)


#: How a 16-bit format stores a value: fp16 as numpy's float16; bf16 emulated (float32 arrays).
STORE = {"fp16": _store_fp16, "bf16": bf16_round}


# ----------------------------------------------------------------------------- the scaling rule
@dataclass(frozen=True)
class ScaleUpdate:
    """What one step does to the loss scale."""
    scale: float
    clean_steps: int
    skip_step: bool


def update_scale(scale: float, clean_steps: int, found_overflow: bool, growth_interval: int,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5) -> ScaleUpdate:
    """Dynamic loss scaling (Micikevicius et al. 2018, section 3.2; PyTorch's GradScaler): question
    ex08_2 (:func:`course_lib.reference.ex08.update_scale`), its triple as a :class:`ScaleUpdate`.

    On overflow: ``S <- backoff_factor * S``, skip this step's update, clean count back to 0.
    Otherwise: count the clean step; after ``growth_interval`` clean steps in a row,
    ``S <- growth_factor * S`` and the count starts again from 0."""
    new_scale, new_clean, skip = _update_scale(scale, clean_steps, found_overflow, growth_interval,
                                               growth_factor, backoff_factor)
    return ScaleUpdate(float(new_scale), int(new_clean), bool(skip))


@dataclass
class DynamicLossScaler:
    """The loss scale and its clean-step count; PyTorch's defaults (init 2**16, growth 2,
    backoff 0.5, interval 2000). Lessons use a shorter interval so a short run shows growth."""
    scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clean_steps: int = 0

    def update(self, found_overflow: bool) -> bool:
        """Apply :func:`update_scale`; return True when this step's update must be skipped."""
        new = update_scale(self.scale, self.clean_steps, found_overflow, self.growth_interval,
                           self.growth_factor, self.backoff_factor)
        self.scale, self.clean_steps = new.scale, new.clean_steps
        return new.skip_step


# ----------------------------------------------------------------------------- fp16 forward/backward
def half_forward(layers16, X16, store=_store_fp16) -> list[np.ndarray]:
    """Forward in 16 bits; returns the cache the backward needs: ``[X, a_1, ..., a_L]``.

    ``a_i = tanh(a_{i-1} W_i + b_i)`` (no tanh on the last layer), each product accumulated
    in fp32 and stored with ``store`` (fp16, or :func:`bf16_round`). Only the layer outputs are
    kept: tanh' = 1 - tanh^2 is computed from the output, so the pre-activations are not needed."""
    acts = [store(X16)]
    last = len(layers16) - 1
    for i, (W, b) in enumerate(layers16):
        h = acts[-1].astype(np.float32) @ W.astype(np.float32) + b.astype(np.float32)
        acts.append(store(h if i == last else np.tanh(h)))
    return acts


def half_backward(layers16, acts, T, scale: float, batch_total: int,
                  store=_store_fp16) -> list[tuple[np.ndarray, np.ndarray]]:
    """16-bit gradients ``[(dW, db), ...]`` of ``S * L``, L = 1/(2B) sum (Y - T)^2, B = ``batch_total``.

    Starts from ``dY = S (Y - T) / B`` stored in 16 bits; each layer:
    ``dh = dY * (1 - a^2)``, ``dW = a_in^T dh``, ``db = sum_rows dh``, ``d_in = dh W^T``,
    computed in fp32 and stored with ``store`` (in fp16 small values flush to zero)."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is what the scaler looks for
        return _half_backward(layers16, acts, T, scale, batch_total, store)


def _half_backward(layers16, acts, T, scale, batch_total, store=_store_fp16):
    """:func:`half_backward`'s body; every ``store(...)`` is a value stored in 16 bits."""
    Y = acts[-1].astype(np.float32)
    d = store(np.float32(scale) * (Y - np.asarray(T, np.float32)) / np.float32(batch_total))
    grads = [None] * len(layers16)
    for i in range(len(layers16) - 1, -1, -1):
        W = layers16[i][0].astype(np.float32)
        d32, a_out = d.astype(np.float32), acts[i + 1].astype(np.float32)
        dh = store(d32 if i == len(layers16) - 1 else d32 * (1 - a_out * a_out)).astype(np.float32)
        a_in = acts[i].astype(np.float32)
        grads[i] = (store(a_in.T @ dh), store(dh.sum(0)))
        d = store(dh @ W.T)
    return grads


def half_loss(acts, T, batch_total: int) -> float:
    """``1/(2B) sum (Y - T)^2`` of the fp16 output, summed in fp32."""
    r = acts[-1].astype(np.float32) - np.asarray(T, np.float32)
    return float(0.5 * np.sum(r * r) / batch_total)


# ----------------------------------------------------------------------------- one worker's state
@dataclass
class MixedPrecisionState:
    """What one data-parallel worker holds between steps: fp32 master weights, Adam's m and v
    (12 bytes per parameter), the 16-bit working copy and the 16-bit gradients (2 + 2).

    ``precision="bf16"`` keeps the working copy and gradients as float32 arrays of bf16 values
    (emulated: 4 bytes each in this process's memory, 2 on the wire)."""
    master: np.ndarray
    like: list = field(repr=False)
    adam: Adam
    params16: np.ndarray = field(default=None, repr=False)
    grads16: np.ndarray = field(default=None, repr=False)
    precision: str = "fp16"

    @classmethod
    def from_layers(cls, layers, lr: float, precision: str = "fp16") -> MixedPrecisionState:
        if precision not in STORE:
            raise ValueError(f"precision must be one of {sorted(STORE)}, got {precision!r}")
        master = flatten_layers(layers, dtype=np.float32)
        dtype = HALF if precision == "fp16" else np.float32
        return cls(master=master, like=layers, adam=Adam(lr=lr).init(master.size),
                   params16=STORE[precision](master), grads16=np.zeros(master.size, dtype), precision=precision)

    def forward_backward(self, X, T, scale: float, batch_total: int) -> tuple[float, list]:
        """Cast master -> 16 bits (in place), 16-bit forward/backward into ``grads16``; returns
        (this shard's loss, the forward cache)."""
        store = STORE[self.precision]
        self.params16[:] = store(self.master)
        layers16 = unflatten_layers(self.params16, self.like)
        acts = half_forward(layers16, X, store)
        self.grads16[:] = flatten_layers(half_backward(layers16, acts, T, scale, batch_total, store))
        return half_loss(acts, T, batch_total), acts

    def apply(self, reduced: np.ndarray, scale: float) -> bool:
        """Unscale the reduced gradient in fp32, ``g = reduced / S``; step Adam unless it holds
        inf/nan. Returns whether an overflow was found (then nothing was updated)."""
        with np.errstate(invalid="ignore"):
            g = reduced.astype(np.float32) / np.float32(scale)
        if not np.all(np.isfinite(g)):
            return True
        self.adam.step(self.master, g)
        return False


# ----------------------------------------------------------------------------- data-parallel runs
@dataclass
class StepRecord:
    """One rank's view of one step."""
    loss: float            # this shard's part of the full-batch loss (they add up)
    scale: float           # the loss scale this step used
    skipped: bool          # overflow found: no update
    zero_fraction: float   # fraction of this rank's gradient entries that are exactly 0
    allreduce_bytes: int   # bytes this rank sent in the gradient allreduce


@dataclass
class TrainingRun:
    """A data-parallel run, steps combined over ranks."""
    label: str
    losses: np.ndarray          # full-batch loss before each step's update
    scales: np.ndarray
    skipped: np.ndarray         # bool per step
    zero_fraction: np.ndarray   # mean over ranks, per step
    allreduce_bytes: np.ndarray  # summed over ranks, per step
    total_bytes: int            # the cluster's Stats for the whole run
    n_params: int
    master: np.ndarray = field(repr=False)  # final fp32 weights (rank 0; all ranks agree)

    @classmethod
    def combine(cls, label: str, per_rank: list, total_bytes: int) -> TrainingRun:
        records = [r[0] for r in per_rank]

        def col(name):  # one row per rank, one column per step
            return np.array([[getattr(s, name) for s in rank] for rank in records])
        master = per_rank[0][1]
        return cls(label, col("loss").sum(0), col("scale")[0], col("skipped")[0],
                   col("zero_fraction").mean(0), col("allreduce_bytes").sum(0), int(total_bytes),
                   int(master.size), master)


def fp32_forward_backward(state: MixedPrecisionState, X, T, batch_total: int) -> tuple[float, np.ndarray]:
    """The fp32 baseline: (loss, flat float32 gradient) at the master weights, no scaling."""
    layers32 = unflatten_layers(state.master, state.like)
    loss, grads = deep_forward_backward(layers32, X.astype(np.float32), T.astype(np.float32), batch_total)
    return loss, flatten_layers(grads, dtype=np.float32)


def data_parallel_worker(comm, layers, X, T, steps: int, lr: float, precision: str = "fp16",
                         scaler: DynamicLossScaler | None = None, algorithm: str = "ring"):
    """Run on every rank: train on shard ``rank`` of (X, T) for ``steps`` steps.

    ``precision="fp16"``: the mixed-precision step of this module (scale 1 if ``scaler`` is None);
    ``"bf16"``: the same in emulated bfloat16, allreduced in its 2-byte wire form (:data:`BF16_SUM`);
    ``"fp32"``: fp32 forward/backward and an fp32 allreduce. All allreduce with ``algorithm``
    (the ring by default), so their bytes compare like with like. Returns (records, final master)."""
    shard = np.array_split(np.arange(len(X)), comm.size)[comm.rank]
    Xs, Ts = X[shard], T[shard]
    state = MixedPrecisionState.from_layers(layers, lr, "bf16" if precision == "bf16" else "fp16")
    records = []
    for _ in range(steps):
        scale = 1.0 if scaler is None or precision == "fp32" else scaler.scale
        with comm.compute(f"{precision} forward/backward"):
            if precision in STORE:
                loss, _ = state.forward_backward(Xs, Ts, scale, len(X))
                grad = state.grads16
            else:
                loss, grad = fp32_forward_backward(state, Xs, Ts, len(X))
        zeros = float(np.mean(grad == 0))
        before = comm.stats.bytes_sent(comm.rank)
        with np.errstate(over="ignore", invalid="ignore"):  # fp16 sums may overflow: then skip
            if precision == "bf16":
                reduced = bf16_decode(comm.allreduce(bf16_encode(grad), op=BF16_SUM, algorithm=algorithm))
            else:
                reduced = comm.allreduce(grad, algorithm=algorithm)
        sent = comm.stats.bytes_sent(comm.rank) - before
        overflow = state.apply(reduced, scale)
        skipped = scaler.update(overflow) if scaler is not None and precision in STORE else overflow
        records.append(StepRecord(loss, scale, bool(skipped), zeros, int(sent)))
    return records, state.master


def train_data_parallel(cluster, layers, X, T, steps: int, lr: float = 1e-3, precision: str = "fp16",
                        scaler: DynamicLossScaler | None = None, label: str = "",
                        algorithm: str = "ring") -> TrainingRun:
    """:func:`data_parallel_worker` on every worker of ``cluster``; steps combined over ranks."""
    res = cluster.run(data_parallel_worker, layers, X, T, steps, lr, precision, scaler, algorithm)
    return TrainingRun.combine(label or precision, list(res), res.stats.total_bytes)


def train_fp32_serial(layers, X, T, steps: int, lr: float = 1e-3) -> np.ndarray:
    """The single-process baseline: full-batch fp32 gradients, Adam. Returns the loss per step."""
    state = MixedPrecisionState.from_layers(layers, lr)
    losses = []
    for _ in range(steps):
        loss, grad = fp32_forward_backward(state, X, T, len(X))
        losses.append(loss)
        state.apply(grad, 1.0)
    return np.array(losses)


def small_target_problem(batch: int, widths, target_scale: float, seed: int = 0):
    """``(layers, X, T)``: lesson 06's regression with targets ``target_scale`` times smaller
    (a quantity measured in large units) and the output layer initialised at that scale, as
    one initialises a net to the scale of its outputs. Loss and gradients are then tiny from
    the first step: what fp16 without loss scaling cannot represent."""
    X, T = make_data(batch, widths[0], widths[-1], seed=seed + 1)
    layers = init_deep(widths, seed=seed)
    W, b = layers[-1]
    layers[-1] = (W * target_scale, b * target_scale)
    return layers, X, T * target_scale
