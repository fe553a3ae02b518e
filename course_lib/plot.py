"""Plots every lesson uses: the per-worker timeline (a Gantt chart)."""
from __future__ import annotations

import re

#: One colour per kind of phase, far apart in hue and lightness: compute dark, waiting light.
COLORS = {"compute": "#1F4E9A", "send": "#E8743B", "recv": "#2E9E4F", "wait": "#D4D4D4"}
#: Colours (and hatches) of the compute phases when the program's labels split them into groups.
COMPUTE_GROUPS = (("#1F4E9A", ""), ("#8E44AD", "//"), ("#2B2B2B", ""), ("#A0522D", ".."), ("#5DADE2", "xx"),
                  ("#C0392B", "\\\\"))
#: Names a group of labels stands for, where the label is a code (the pipelines' F0, B0, ...).
GROUP_NAMES = {"F": "F (forward)", "B": "B (backward)"}
#: A phase narrower than this share of the time axis is drawn this wide (else it is invisible).
MIN_WIDTH = 0.003


def label_group(label: str) -> str:
    """The group a compute label belongs to: the label without its numbers ("F3" -> "F",
    "step 2" -> "step", "map shard 1 (re-executed)" -> "map shard (re-executed)")."""
    group = re.sub(r"\d+(?:[.,]\d+)*", "", label or "")
    return re.sub(r"\s+", " ", group).strip(" ,:-") or "compute"


def timeline(run, ax=None, kinds=("compute", "send", "recv", "wait"), title: str | None = None,
             labels: bool | None = None, ranks=None):
    """Draw one row per rank: compute (dark blue), send (orange), recv (green), wait (light grey).

    ``run`` is a :class:`~course_lib.runtime.cluster.RunResult`, a Timeline or a list of events.
    Each instant of a rank's run is drawn in exactly one kind (:meth:`Timeline.exclusive`: where
    two threads of a rank overlap, work wins over waiting), so a row's colours add up to at most
    its run. A send blocked because its receiver does not read is waiting (grey), as the runtime
    traces it.

    Compute phases labelled by the program (``comm.compute("F0")``, ``"B0"``, ...) get one colour
    per group of labels (the label without its numbers) when there are two to six groups; the
    legend gives each kind's share of the drawn ranks' time. A phase shorter than
    :data:`MIN_WIDTH` of the axis is drawn that wide, and the legend says so. ``labels``: write
    each compute label on its bar (True), never (False), or where it fits (None, the default).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .runtime.trace import Timeline

    events = getattr(run, "timeline", run)
    events = (events if isinstance(events, Timeline) else Timeline(events)).exclusive()
    if ranks is None:
        ranks = sorted({e.rank for e in events}) or [0]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.45 * len(ranks) + 1.2))
    row = {r: i for i, r in enumerate(ranks)}
    mine = [e for e in events if e.rank in row and e.kind in kinds]
    t_lo = min((e.start for e in mine), default=0.0)
    t_hi = max((e.end for e in mine), default=1.0)
    span = max(t_hi - min(t_lo, 0.0), 1e-9)
    min_width = MIN_WIDTH * span
    rank_time = sum(events.busy(r) for r in ranks) or span

    groups = sorted({label_group(e.label) for e in mine if e.kind == "compute"})
    by_group = 2 <= len(groups) <= len(COMPUTE_GROUPS) or (len(groups) == 1 and groups[0] != "compute")
    widened = False
    handles = []
    for kind in kinds:
        keys = [(kind, g) for g in groups] if kind == "compute" and by_group else [(kind, None)]
        for i, key in enumerate(keys):
            if kind == "compute" and by_group:
                colour, hatch = COMPUTE_GROUPS[i]
                name = f"compute: {GROUP_NAMES.get(key[1], key[1])}"
                phases = [e for e in mine if e.kind == kind and label_group(e.label) == key[1]]
            else:
                colour, hatch, name = COLORS[kind], "", kind
                phases = [e for e in mine if e.kind == kind]
            share = sum(e.duration for e in phases) / rank_time
            bars = {}
            for e in phases:
                width = max(e.duration, min_width) if kind != "wait" else max(e.duration, 1e-9)
                widened |= kind != "wait" and e.duration < min_width
                bars.setdefault(e.rank, []).append((e.start, width))
            # a hatch is drawn in the edge colour: a tint of the bar's, so a thin bar shows no white lines
            edge = _tint(colour) if hatch else "none"
            for rank, spans in bars.items():
                ax.broken_barh(spans, (row[rank] - 0.4, 0.8), facecolors=colour, hatch=hatch or None,
                               edgecolor=edge, linewidth=0, zorder=1 if kind == "wait" else 2)
            text = f"{name} ({share:.0%})" if share >= 0.005 or not phases else f"{name} (<1%)"
            handles.append(Patch(facecolor=colour, hatch=hatch or None, edgecolor=edge if hatch else colour,
                                 label=text))

    if labels is not False and "compute" in kinds:
        _write_labels(ax, [e for e in mine if e.kind == "compute"], row, span, always=bool(labels))
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel("time since the run started (s)")
    note = f"share of the ranks' time\n(phases under {MIN_WIDTH:.1%} of the run\ndrawn that wide)" if widened \
        else "share of the ranks' time"
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8,
              title=note, title_fontsize=7, alignment="left")
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3, zorder=0)
    return ax


def _tint(colour: str, amount: float = 0.45):
    """``colour`` mixed with white (``amount`` of white)."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


def _write_labels(ax, phases, row, span: float, always: bool) -> None:
    """Write each compute phase's label on its bar: all of them, or (``always`` False) where it fits.

    A label is shown only while its bar lies wholly inside the x range, and (unless ``always``) fits
    at the range's scale: a caller that zooms with ``set_xlim`` after drawing gets the labels that fit
    there, and none cut in half at the edge.
    """
    phases = [e for e in phases if e.label and e.duration > 0]
    # a 7-point character is about 0.055 inch wide
    needed = {id(e): 0.055 * len(e.label) + 0.05 for e in phases}
    if not always and len(phases) > 400:  # too many to keep: only those that fit the whole run
        inches = ax.get_position().width * ax.figure.get_figwidth()
        phases = [e for e in phases if e.duration / span * inches >= needed[id(e)]]
    texts = [(ax.text(e.start + e.duration / 2, row[e.rank], e.label, ha="center", va="center", fontsize=7,
                      color="white", clip_on=True, zorder=3), e) for e in phases]

    def show(axes):
        lo, hi = axes.get_xlim()
        inches = axes.get_position().width * axes.figure.get_figwidth()
        for text, e in texts:
            inside = lo <= e.start and e.end <= hi
            fits = always or e.duration / max(hi - lo, 1e-12) * inches >= needed[id(e)]
            text.set_visible(inside and fits)

    ax.callbacks.connect("xlim_changed", show)
    show(ax)
