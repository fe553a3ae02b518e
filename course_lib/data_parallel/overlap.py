"""How much of a DDP step's communication hides behind backward: the alpha-beta model of an
overlapped step, a run against it, and the timeline that shows it (lesson 08; :mod:`.ddp`).

The time of one step (the alpha-beta model, Hockney 1994): bucket i is ready at r_i (the
backward time of the layers down to its earliest parameter), one ring allreduce of n_i
bytes costs c_i = 2(p-1) alpha + 2(p-1)/p n_i beta, and the buckets are reduced one after
the other (one stream), so

    finish_i = max(r_i, finish_{i-1}) + c_i,    overlapped step = finish_last,
    non-overlapped step = backward + sum_i c_i.

Small buckets pay 2(p-1) alpha many times; one big bucket cannot start before backward ends.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .. import costs
from .ddp import BucketPlan, DDPSetup, backward_flops, run_ddp


@dataclass(frozen=True)
class StepModel:
    """The alpha-beta model of one step's backward and allreduces (seconds)."""
    ready: tuple[float, ...]     # r_i: bucket i's last gradient exists
    comm: tuple[float, ...]      # c_i = 2(p-1) alpha + 2(p-1)/p n_i beta
    finish: tuple[float, ...]    # finish_i = max(r_i, finish_{i-1}) + c_i
    backward: float

    @property
    def overlapped(self) -> float:
        return self.finish[-1] if self.finish else self.backward

    @property
    def sequential(self) -> float:
        return self.backward + sum(self.comm)


def model_step(plan: BucketPlan, layer_seconds, p: int, cost: costs.CostModel) -> StepModel:
    """Predict a step from each layer's backward seconds (model order) and alpha, beta.

    Backward runs the layers last to first, so parameter q (W of layer q // 2 or its b) is
    ready at the sum of the backward times of layers L-1 .. q // 2."""
    ready_param = {}
    t = 0.0
    for i in reversed(range(len(layer_seconds))):
        t += float(layer_seconds[i])
        ready_param[2 * i] = ready_param[2 * i + 1] = t
    ready = [max(ready_param[q] for q in b.params) for b in plan.buckets]
    comm = [costs.predict("allreduce", "ring", p, b.nbytes, cost) for b in plan.buckets]
    finish, last = [], 0.0
    for r, c in zip(ready, comm):
        last = max(r, last) + c
        finish.append(last)
    return StepModel(tuple(ready), tuple(comm), tuple(finish), t)


def plot_overlap(timeline, ax, ranks=None, title: str | None = None, legend: bool = True,
                 origin: float = 0.0, window: tuple[float, float] | None = None):
    """Two lanes per rank: compute (forward, then the backward of layers B_i, labelled) above,
    communication below (the sends and receives of the allreduces, which the rank's background
    thread runs while the compute lane goes on).

    Times are drawn in ms since ``origin`` (e.g. the step's start), so two panels given the same
    ``window`` (ms, relative to their own origins) share one time scale. A compute block is
    labelled only where its label fits (at least 2.5 % of the window wide), so labels never collide."""
    from matplotlib.patches import Patch

    from ..plot import COLORS

    ranks = sorted({e.rank for e in timeline}) if ranks is None else list(ranks)

    def ms(t):
        return 1e3 * (t - origin)

    if window is None:
        drawn = [e for e in timeline if e.rank in ranks]
        window = (min(ms(e.start) for e in drawn), max(ms(e.end) for e in drawn)) if drawn else (0.0, 1.0)
    min_label = 0.025 * (window[1] - window[0])
    for k, rank in enumerate(ranks):
        for lane, kinds in ((0, ("compute",)), (1, ("send", "recv"))):
            for kind in kinds:
                events = [e for e in timeline if e.rank == rank and e.kind == kind]
                ax.broken_barh([(ms(e.start), max(1e3 * e.duration, 1e-2)) for e in events],
                               (2 * k + lane - 0.4, 0.8), facecolors=COLORS[kind], edgecolor="white", linewidth=0.4)
        for e in timeline.of(rank, "compute"):
            if 1e3 * e.duration >= min_label and window[0] <= ms(e.start) and ms(e.end) <= window[1]:
                ax.text(ms(e.start) + 1e3 * e.duration / 2, 2 * k, e.label, ha="center", va="center", fontsize=6,
                        color="white", clip_on=True)
    ax.set_yticks(range(2 * len(ranks)))
    ax.set_yticklabels([f"rank {r} {lane}" for r in ranks for lane in ("compute", "comm")], fontsize=8)
    ax.set_ylim(2 * len(ranks) - 0.5, -0.5)   # rank 0's compute lane on top
    ax.set_xlim(*window)
    ax.set_xlabel("time since the step started (ms)" if origin else "time since the run started (ms)")
    if legend:
        ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in ("compute", "send", "recv")],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    return ax


@dataclass(frozen=True)
class OverlapComparison:
    """Median step (backward + allreduces) overlapped and not, measured, beside the model."""
    cap_bytes: int
    p: int
    overlapped: float
    sequential: float
    model: StepModel
    runs: dict = field(repr=False, compare=False, default_factory=dict)   # {overlap: DDPRun}

    @property
    def ratio(self) -> float:
        return self.overlapped / self.sequential

    @property
    def model_ratio(self) -> float:
        return self.model.overlapped / self.model.sequential


def predict_step(layers, batch: int, setup: DDPSetup, p: int, network) -> StepModel:
    """:func:`model_step` for the run ``setup`` of ``batch`` rows over p ranks on ``network``."""
    seconds = [setup.seconds_per_flop * f for f in backward_flops(layers, batch // p)]
    return model_step(setup.plan_of(layers), seconds, p, costs.CostModel.from_network(network))


def compare_overlap(cluster, layers, X, T, setup: DDPSetup, network) -> OverlapComparison:
    """Run ``setup`` without overlap, then with it, on ``network``; median step of each."""
    runs = {o: run_ddp(cluster, layers, X, T, replace(setup, overlap=o), network) for o in (False, True)}
    p = cluster.n_workers
    return OverlapComparison(setup.cap_bytes, p, runs[True].median_step, runs[False].median_step,
                             predict_step(layers, X.shape[0], setup, p, network), runs)


def overlap_fraction(timeline, rank: int, start: float, end: float) -> float:
    """Share of ``rank``'s communication time (its send and recv events) in [start, end] that
    falls inside its backward compute phases (labels ``B<i>``): 0 when nothing overlaps."""
    def clip(e):
        return max(e.start, start), min(e.end, end)

    backward = [clip(e) for e in timeline.of(rank, "compute") if e.label.startswith("B")]
    talk = [clip(e) for e in timeline if e.rank == rank and e.kind in ("send", "recv")]
    total = sum(max(0.0, b - a) for a, b in talk)
    inside = sum(max(0.0, min(b, d) - max(a, c)) for a, b in talk for c, d in backward)
    return inside / total if total > 0 else 0.0
