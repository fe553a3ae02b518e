"""Plots every lesson uses: the per-worker timeline (a Gantt chart)."""
from __future__ import annotations

COLORS = {"compute": "#4C72B0", "send": "#DD8452", "recv": "#55A868", "wait": "#C8C8C8"}


def timeline(run, ax=None, kinds=("compute", "send", "recv", "wait"), title: str | None = None,
             labels: bool = False, ranks=None):
    """Draw one row per rank: compute (blue), send (orange), recv (green), wait (grey).

    ``run`` is a :class:`~course_lib.runtime.cluster.RunResult` or a Timeline. Phases labelled by the
    program (``comm.compute("label")``) can be written on their bars with ``labels=True``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = getattr(run, "timeline", run)
    if ranks is None:
        ranks = sorted({e.rank for e in events}) or [0]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.45 * len(ranks) + 1.2))
    row = {r: i for i, r in enumerate(ranks)}
    for kind in kinds:
        bars = {}
        for e in events:
            if e.kind == kind and e.rank in row:
                # a zero-length phase still shows as a hairline
                bars.setdefault(e.rank, []).append((e.start, max(e.duration, 1e-6)))
        for rank, spans in bars.items():
            height = 0.8 if kind in ("compute", "wait") else 0.5
            ax.broken_barh(spans, (row[rank] - height / 2, height), facecolors=COLORS[kind],
                           edgecolor="none", zorder=2 if kind != "wait" else 1)
    if labels:
        for e in events:
            if e.kind == "compute" and e.label and e.rank in row and e.duration > 0:
                ax.text(e.start + e.duration / 2, row[e.rank], e.label, ha="center", va="center",
                        fontsize=7, color="white", clip_on=True, zorder=3)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time since the run started (s)")
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3, zorder=0)
    return ax
