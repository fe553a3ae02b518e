"""Pictures of pipeline schedules: simulated (in steps) or measured (in seconds)."""
from __future__ import annotations

__all__ = ["plot_schedule", "plot_timeline"]

F_COLOR, B_COLOR = "#4c72b0", "#dd8452"


def _draw(ax, bars, p, xlabel, title, unit_label=True):
    for stage, op, i, start, end in bars:
        ax.broken_barh([(start, end - start)], (stage - 0.4, 0.8),
                       facecolors=F_COLOR if op == "F" else B_COLOR, edgecolor="white", linewidth=0.5)
        if unit_label:
            ax.text((start + end) / 2, stage, f"{op}{i}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=F_COLOR, label="forward"), Patch(color=B_COLOR, label="backward"),
                       Patch(facecolor="white", edgecolor="grey", label="idle (bubble)")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, framealpha=0.9)
    return ax


def plot_schedule(sim, ax=None):
    """Gantt chart of :func:`.pipeline.simulate`'s result, one row per stage."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(8, 0.5 + 0.45 * sim["p"]))[1]
    title = (f"{sim['kind']}: p={sim['p']}, m={sim['m']}, {sim['steps']} steps, "
             f"bubble {sim['bubble']} = {float(sim['bubble']):.3f}")
    _draw(ax, sim["events"], sim["p"], "time (schedule steps)", title, unit_label=sim["m"] <= 16)
    ax.set_xlim(0, sim["steps"] * 1.02)
    return ax


def plot_timeline(timeline, p, ax=None, title="measured"):
    """Gantt chart of the F/B compute events of a real run's timeline (seconds)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(8, 0.5 + 0.45 * p))[1]
    bars = [(e.rank, e.label[0], e.label[1:], e.start, e.end) for e in timeline
            if e.kind == "compute" and e.label[:1] in ("F", "B")]
    t0 = min(b[3] for b in bars)
    bars = [(s, op, i, a - t0, b - t0) for s, op, i, a, b in bars]
    _draw(ax, bars, p, "time since the first forward (s)", title, unit_label=len(bars) <= 64)
    return ax
