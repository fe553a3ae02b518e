"""Pipeline parallelism: layers on workers, micro-batches through Pipes.

Stage s (worker s) owns a contiguous group of layers. A batch of B rows is cut in m
micro-batches. Forward ``F_i`` on stage s needs ``F_i`` of stage s-1 (activations
arrive by a Pipe); backward ``B_i`` needs ``B_i`` of stage s+1 (the gradient arrives
back). Two schedules (order of the ops on each stage):

* GPipe (Huang et al. 2019): all m forwards, then all m backwards.
  Every stage stashes the activations of all m micro-batches.
* 1F1B (PipeDream-Flush; Narayanan et al. 2019, 2021): stage s runs ``p - s - 1``
  warm-up forwards, then alternates one forward and one backward, then drains.
  At most ``p - s`` micro-batches are stashed: same bubble, less memory.

With forward cost t_f and backward cost t_b per micro-batch and stage, both schedules
take ``(m + p - 1)(t_f + t_b)``, of which each stage is busy ``m (t_f + t_b)``, so the
idle fraction (the *bubble*) is

    bubble = (p - 1) / (m + p - 1).

:func:`simulate` computes it exactly (``fractions.Fraction``) from the schedule's own
step count; :func:`measured_bubble` computes it from a real run's timeline.
Gradients are summed over micro-batches, so they equal the full-batch gradient.
"""
from __future__ import annotations

import functools
import time
from fractions import Fraction

import numpy as np

from course_lib.reference.ex06 import measured_bubble as _measured_bubble  # question ex06_5
from course_lib.reference.ex06 import predicted_bubble  # question ex06_4

from .mlp import layer_backward, layer_forward

__all__ = ["SCHEDULES", "stage_ops", "simulate", "bubble_formula", "measured_bubble",
           "stage_layers", "pipeline_step", "assemble_pipeline_grads"]

SCHEDULES = ("gpipe", "1f1b")
TAG_ACT = 6011
TAG_GRAD = 6012


def _check(p, m, kind="gpipe"):
    if int(p) < 1 or int(m) < 1:
        raise ValueError(f"need p >= 1 stages and m >= 1 micro-batches, got p={p}, m={m}")
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    return int(p), int(m)


def stage_ops(kind: str, p: int, m: int, s: int):
    """Ordered ops ``[("F", i) | ("B", i), ...]`` of stage s under schedule ``kind``."""
    p, m = _check(p, m, kind)
    if not 0 <= s < p:
        raise ValueError(f"stage {s} out of range for p={p}")
    if kind == "gpipe":
        # backwards in reverse order: the last micro-batch is the first one whose loss is known
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    warm = min(p - s - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", i) for i in range(m - warm, m)]
    return ops


def bubble_formula(p: int, m: int) -> Fraction:
    """``(p - 1) / (m + p - 1)`` as an exact fraction: question ex06_4
    (:func:`course_lib.reference.ex06.predicted_bubble`), with its inputs checked."""
    p, m = _check(p, m)
    return predicted_bubble(p, m)


def simulate(kind: str, p: int, m: int, t_f=1, t_b=1):
    """Run the schedule on an ideal machine (no communication cost).

    Each stage executes its :func:`stage_ops` in order; an op starts when the stage is
    free and its dependency is done. Returns a dict: ``events`` (list of
    ``(stage, op, micro_batch, start, end)``), ``steps`` (makespan, in units of the
    costs), ``busy`` per stage, ``bubble`` (exact Fraction when costs are integers or
    Fractions) and ``peak_stash`` per stage (activations held at once).
    """
    p, m = _check(p, m, kind)
    ops = [stage_ops(kind, p, m, s) for s in range(p)]
    done = {}                       # (op, stage, i) -> end time
    free = [0] * p
    pos = [0] * p
    events = []
    while any(pos[s] < len(ops[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] >= len(ops[s]):
                continue
            op, i = ops[s][pos[s]]
            if op == "F":
                dep = None if s == 0 else ("F", s - 1, i)
            else:
                dep = ("F", s, i) if s == p - 1 else ("B", s + 1, i)
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done[dep] if dep is not None else 0)
            end = start + (t_f if op == "F" else t_b)
            done[(op, s, i)] = end
            free[s] = end
            events.append((s, op, i, start, end))
            pos[s] += 1
            progressed = True
        if not progressed:          # cannot happen for the two schedules; guards edits
            raise RuntimeError(f"schedule {kind} deadlocks at positions {pos}")
    steps = max(e[4] for e in events)
    busy = [sum(e[4] - e[3] for e in events if e[0] == s) for s in range(p)]
    total = sum(busy)
    bubble = 1 - Fraction(total) / (p * Fraction(steps)) if all(
        isinstance(x, (int, Fraction)) for x in (t_f, t_b)) else 1 - total / (p * steps)
    peak = []
    for s in range(p):
        held = best = 0
        for op, _ in ops[s]:
            held += 1 if op == "F" else -1
            best = max(best, held)
        peak.append(best)
    return {"events": events, "steps": steps, "busy": busy, "bubble": bubble,
            "peak_stash": peak, "kind": kind, "p": p, "m": m}


def measured_bubble(timeline, p: int | None = None, labels=("F", "B")) -> float:
    """Idle fraction of a real run: ``1 - sum(compute time) / (p * span)``, question ex06_5
    (:func:`course_lib.reference.ex06.measured_bubble`) on the ``compute`` events whose label
    starts with one of ``labels``; ``span`` runs from the first one's start to the last one's end.
    ``p`` defaults to the number of ranks with such events.
    """
    ev = [e for e in timeline if e.kind == "compute" and str(e.label).startswith(tuple(labels))]
    if not ev:
        raise ValueError("the timeline has no compute events labelled " + "/".join(labels))
    p = len({e.rank for e in ev}) if p is None else int(p)
    return float(_measured_bubble(ev, p))


def stage_layers(n_layers: int, p: int):
    """Contiguous layer ranges of the p stages."""
    if n_layers < p:
        raise ValueError(f"{n_layers} layers cannot fill {p} stages (one layer at least each)")
    from .tensor import split_ranges
    return split_ranges(n_layers, p)


def padded_compute(comm, label, cost, fn):
    """Run ``fn`` in a traced compute phase padded to last ``cost`` seconds (emulated compute).

    A fixed cost per op makes the schedule, not the machine's noise, decide the
    timeline; sleeping (not spinning) keeps it fair on a machine with fewer cores
    than stages, and hands the CPU to a rank's communication thread (lesson 08's DDP).
    """
    with comm.compute(label):
        t0 = time.perf_counter()
        out = fn()
        rest = cost - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
    return out


def pipeline_step(comm, layers, X, T, m: int, schedule: str = "gpipe",
                  t_f: float = 0.0, t_b: float = 0.0):
    """One forward+backward of the layer stack, pipelined over all ranks.

    ``layers`` is the full list ``[(W, b), ...]``; stage s keeps only its own layers.
    Only stage 0 reads X and only the last stage reads T (everybody gets them here for
    simplicity; a real pipeline loads them where needed). Returns this stage's layer
    range, its gradients, the loss (last stage; else None), the peak number of stashed
    micro-batches and the bytes it sent.
    """
    p, s = comm.size, comm.rank
    m = _check(p, m, schedule)[1]
    X, T = np.asarray(X), np.asarray(T)
    B = X.shape[0]
    if m > B:
        raise ValueError(f"cannot cut a batch of {B} rows into {m} micro-batches")
    lo, hi = stage_layers(len(layers), p)[s]
    mine = [(np.asarray(W).copy(), np.asarray(b).copy()) for W, b in layers[lo:hi]]
    last_layer = len(layers) - 1
    rows = np.array_split(np.arange(B), m)
    grads = [(np.zeros_like(W), np.zeros_like(b)) for W, b in mine]
    stash, peak, total_loss = {}, 0, 0.0
    sent0 = comm.stats.bytes_sent(s)

    def fwd(a):
        acts = [a]
        for j, (W, b) in enumerate(mine):
            acts.append(layer_forward(W, b, acts[-1], lo + j == last_layer))
        return acts

    def bwd(acts, d):
        for j in range(len(mine) - 1, -1, -1):
            dW, db, d = layer_backward(mine[j][0], acts[j], acts[j + 1], d, lo + j == last_layer)
            grads[j] = (grads[j][0] + dW, grads[j][1] + db)
        return d

    for op, i in stage_ops(schedule, p, m, s):
        if op == "F":
            a = X[rows[i]] if s == 0 else comm.recv(source=s - 1, tag=TAG_ACT)
            acts = padded_compute(comm, f"F{i}", t_f, functools.partial(fwd, a))
            stash[i] = acts
            peak = max(peak, len(stash))
            if s < p - 1:
                comm.send(acts[-1], s + 1, tag=TAG_ACT)
        else:
            acts = stash.pop(i)
            if s == p - 1:
                Y, Ti = acts[-1], T[rows[i]]
                total_loss += float(0.5 * np.sum((Y - Ti) ** 2) / B)
                d = (Y - Ti) / B      # 1/B of the whole batch: micro-batch grads add up
            else:
                d = comm.recv(source=s + 1, tag=TAG_GRAD)
            d_in = padded_compute(comm, f"B{i}", t_b, functools.partial(bwd, acts, d))
            if s > 0:
                comm.send(d_in, s - 1, tag=TAG_GRAD)
    return {"layers": (lo, hi), "grads": grads, "loss": total_loss if s == p - 1 else None,
            "peak_stash": peak, "bytes_sent": int(comm.stats.bytes_sent(s) - sent0),
            "param_bytes": int(sum(W.nbytes + b.nbytes for W, b in mine))}


def assemble_pipeline_grads(results):
    """Concatenate the stages' gradient lists into ``[(dW, db), ...]`` for all layers."""
    out = []
    for res in sorted(results, key=lambda r: r["layers"][0]):
        out.extend(res["grads"])
    return out
