"""Pictures of pipeline schedules: simulated (in steps) or measured (in seconds)."""
from __future__ import annotations

__all__ = ["plot_schedule", "plot_timeline", "OP_COLORS"]

F_COLOR, B_COLOR, R_COLOR = "#4c72b0", "#dd8452", "#55a868"
OP_COLORS = {"F": F_COLOR, "B": B_COLOR, "R": R_COLOR}
OP_NAMES = {"F": "forward", "B": "backward", "R": "recompute (forward again)"}


def _lighter(colour: str, share: float) -> tuple:
    """``colour`` mixed with white: ``share`` 0 keeps it, 1 is white."""
    from matplotlib.colors import to_rgb
    return tuple(c + (1 - c) * share for c in to_rgb(colour))


def _draw(ax, bars, p, xlabel, title, unit_label=True, chunks=None, v=1):
    """One bar per op ``(stage, op, i, start, end)``; ``chunks`` (the interleaved schedule's chunk
    of each bar) lightens the later chunks of a device, so chunk 0 is the darkest, and labels a bar
    with its micro-batch only."""
    from matplotlib.patches import Patch
    ops_seen = []
    for k, (stage, op, i, start, end) in enumerate(bars):
        chunk = chunks[k] if chunks is not None else 0
        colour = _lighter(OP_COLORS[op], 0.5 * chunk / max(1, v - 1)) if chunk else OP_COLORS[op]
        ax.broken_barh([(start, end - start)], (stage - 0.4, 0.8), facecolors=colour, edgecolor="white",
                       linewidth=0.5)
        if unit_label:
            # interleaved ops are short: the micro-batch alone (the colour says forward or backward)
            ax.text((start + end) / 2, stage, f"{i}" if chunks is not None else f"{op}{i}", ha="center",
                    va="center", fontsize=7, color="white" if not chunk else "black")
        if op not in ops_seen:
            ops_seen.append(op)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" if chunks is None else f"device {s}" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=OP_COLORS[op], label=OP_NAMES[op]) for op in "FRB" if op in ops_seen]
    if chunks is not None and v > 1:
        later = "chunk 1" if v == 2 else f"chunks 1 to {v - 1}"
        handles += [Patch(color=_lighter(F_COLOR, 0.5), label=f"{later}: lighter")]
    handles.append(Patch(facecolor="white", edgecolor="grey", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, framealpha=0.9)
    return ax


def _cost(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def plot_schedule(sim, ax=None):
    """Gantt chart of :func:`.pipeline.simulate`'s (or :func:`.pipeline.simulate_interleaved`'s)
    result, one row per stage (device); the title gives the costs t_f and t_b it was run with."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(8, 0.5 + 0.45 * sim["p"]))[1]
    steps = sim["steps"]
    steps_text = f"{float(steps):g}" if steps != int(steps) else f"{int(steps)}"
    title = (f"{sim['kind']}: p={sim['p']}, m={sim['m']}, t_f={_cost(sim.get('t_f', 1))}, "
             f"t_b={_cost(sim.get('t_b', 1))}: {steps_text} steps, "
             f"bubble {sim['bubble']} = {float(sim['bubble']):.3f}")
    n_ops = len(sim["events"])
    _draw(ax, sim["events"], sim["p"], "time (schedule steps)", title, unit_label=n_ops <= 16 * 2 * sim["p"],
          chunks=sim.get("chunks"), v=sim.get("v", 1))
    ax.set_xlim(0, float(steps) * 1.02)
    return ax


def plot_timeline(timeline, p, ax=None, title="measured"):
    """Gantt chart of the F/R/B compute events of a real run's timeline (seconds): forwards,
    recomputed forwards (``recompute=True``) and backwards, each in its own colour. Labels with a
    chunk (``F3c1``, :func:`.pipeline.interleaved_pipeline_step`) draw a device's later chunks
    lighter, as :func:`plot_schedule` does for the simulated interleaved schedule."""
    import re

    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(8, 0.5 + 0.45 * p))[1]
    bars, chunks = [], []
    for e in timeline:
        label = re.fullmatch(r"([FRB])(\d+)(?:c(\d+))?", str(e.label)) if e.kind == "compute" else None
        if label:
            bars.append((e.rank, label[1], label[2], e.start, e.end))
            chunks.append(int(label[3] or 0))
    t0 = min(b[3] for b in bars)
    bars = [(s, op, i, a - t0, b - t0) for s, op, i, a, b in bars]
    interleaved = any(chunks)           # an interleaved run's bars are short: its labels give the micro-batch only
    _draw(ax, bars, p, "time since the first forward (s)", title, unit_label=len(bars) <= (128 if interleaved else 64),
          chunks=chunks if interleaved else None, v=max(chunks) + 1)
    return ax
