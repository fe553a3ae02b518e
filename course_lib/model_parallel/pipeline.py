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

Two refinements from Narayanan et al. 2021 (*Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM*, SC21):

* **Interleaved 1F1B** (section 2.2.2), :func:`simulate_interleaved` on the ideal machine and
  :func:`interleaved_pipeline_step` on real processes: each device holds v
  *model chunks* (virtual stages) instead of one contiguous group of layers, device d the
  chunks d, d + p, ..., d + (v - 1) p of a pipeline of v p chunks. Each op then costs 1/v of a
  stage's, the pipeline fills and drains v times faster, and the bubble shrinks by v: idle time
  over busy time ``(p - 1) / (v m)`` (the paper's "bubble time fraction"), i.e. an idle fraction
  of the run ``(p - 1) / (v m + p - 1)``. The price: a micro-batch crosses v p - 1 borders between
  devices instead of p - 1 (each way), so about v times the messages, and m must be a multiple of p.
* **Activation recomputation** (section 3.5; Chen et al. 2016, *Training Deep Nets with Sublinear
  Memory Cost*): ``pipeline_step(..., recompute=True)`` stashes only each micro-batch's *input*
  to the stage and recomputes the stage's forward inside the backward. A stage of L layers then
  holds one activation per stashed micro-batch instead of L + 1, for one extra forward per
  backward (with t_b = 2 t_f: a third more compute).

Every compute phase is traced under a label, ``F<i>`` (forward of micro-batch i) or ``B<i>``
(backward), so a timeline tells forwards from backwards; the interleaved schedule adds the chunk,
``F<i>c<chunk>``.
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
           "interleaved_ops", "simulate_interleaved", "interleaved_bubble",
           "stage_layers", "pipeline_step", "interleaved_pipeline_step", "assemble_pipeline_grads",
           "stash_bytes", "interleaved_messages", "interleaved_bytes"]

SCHEDULES = ("gpipe", "1f1b")
TAG_ACT = 6011
TAG_GRAD = 6012
TAG_CHUNK = 6100        # interleaved 1F1B: TAG_CHUNK + 2 (i v p + g) + direction, see _chunk_tag


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


def _exact(*costs) -> bool:
    return all(isinstance(x, (int, Fraction)) for x in costs)


def _list_schedule(ops, dependency, cost):
    """Run each device's ops in their order on an ideal machine (no communication cost): an op
    starts when its device is free and its dependency is done. ``ops[d]`` lists device d's ops
    (tuples whose first item is "F" or "B"); ``dependency(d, op)`` names the ``(device, op)``
    it waits for (None: none); ``cost(op)`` is its duration. Returns the events
    ``(device, op, start, end)`` in the order they were placed."""
    p = len(ops)
    done, free, pos, events = {}, [0] * p, [0] * p, []
    while any(pos[d] < len(ops[d]) for d in range(p)):
        progressed = False
        for d in range(p):
            if pos[d] >= len(ops[d]):
                continue
            op = ops[d][pos[d]]
            dep = dependency(d, op)
            if dep is not None and dep not in done:
                continue
            start = max(free[d], done[dep] if dep is not None else 0)
            end = start + cost(op)
            done[(d, op)] = end
            free[d] = end
            events.append((d, op, start, end))
            pos[d] += 1
            progressed = True
        if not progressed:          # cannot happen for the schedules here; guards edits
            raise RuntimeError(f"the schedule deadlocks at positions {pos}")
    return events


def _peak_stash(ops) -> int:
    """Most micro-batches (or chunk micro-batches) whose forward ran and backward did not yet."""
    held = best = 0
    for op in ops:
        held += 1 if op[0] == "F" else -1
        best = max(best, held)
    return best


def simulate(kind: str, p: int, m: int, t_f=1, t_b=1):
    """Run the schedule on an ideal machine (no communication cost).

    Each stage executes its :func:`stage_ops` in order; an op starts when the stage is
    free and its dependency is done. Returns a dict: ``events`` (list of
    ``(stage, op, micro_batch, start, end)``), ``steps`` (makespan, in units of the
    costs), ``busy`` per stage, ``bubble`` (exact Fraction when costs are integers or
    Fractions), ``peak_stash`` per stage (activations held at once) and the costs
    ``t_f``, ``t_b``.
    """
    p, m = _check(p, m, kind)
    ops = [stage_ops(kind, p, m, s) for s in range(p)]

    def dependency(s, op):
        what, i = op
        if what == "F":
            return None if s == 0 else (s - 1, ("F", i))
        return (s, ("F", i)) if s == p - 1 else (s + 1, ("B", i))

    placed = _list_schedule(ops, dependency, lambda op: t_f if op[0] == "F" else t_b)
    events = [(s, op, i, start, end) for s, (op, i), start, end in placed]
    steps = max(e[4] for e in events)
    busy = [sum(e[4] - e[3] for e in events if e[0] == s) for s in range(p)]
    total = sum(busy)
    bubble = 1 - Fraction(total) / (p * Fraction(steps)) if _exact(t_f, t_b) else 1 - total / (p * steps)
    return {"events": events, "steps": steps, "busy": busy, "bubble": bubble,
            "peak_stash": [_peak_stash(o) for o in ops], "kind": kind, "p": p, "m": m,
            "t_f": t_f, "t_b": t_b}


def interleaved_ops(p: int, m: int, v: int, d: int):
    """Ordered ops ``[("F" | "B", micro_batch, chunk), ...]`` of device d under the interleaved
    1F1B schedule with v chunks per device (Narayanan et al. 2021, section 2.2.2), in the order
    of Megatron-LM's ``forward_backward_pipelining_with_interleaving``: forwards go through the
    chunks in groups of p micro-batches (chunk 0 for micro-batches 0..p-1, then chunk 1 for the
    same ones, ...), backwards through the chunks in reverse; ``(p - d - 1) + (v - 1) p``
    warm-up forwards, then one forward and one backward in turn.

    With v = 1 this is :func:`stage_ops`' 1F1B. Megatron-LM's code warms up ``2 (p - d - 1) +
    (v - 1) p``: p - d - 1 more forwards, which on a real machine keep a device busy while a
    message is in flight; on the ideal machine of :func:`simulate_interleaved` both give the
    same bubble, and the extra ones only hold more activations."""
    p, m = _check(p, m)
    v = int(v)
    if v < 1:
        raise ValueError(f"need v >= 1 model chunks per device, got v={v}")
    if not 0 <= d < p:
        raise ValueError(f"device {d} out of range for p={p}")
    if m % p:
        raise ValueError(f"the interleaved schedule needs m a multiple of p, got m={m}, p={p}")
    total = m * v

    def forward(k):             # the device's k-th forward: (micro-batch, chunk)
        group, within = divmod(k, p * v)
        chunk, j = divmod(within, p)
        return group * p + j, chunk

    def backward(k):
        i, chunk = forward(k)
        return i, v - 1 - chunk

    warm = min((p - d - 1) + (v - 1) * p, total)
    ops = [("F", *forward(k)) for k in range(warm)]
    for k in range(total - warm):
        ops += [("F", *forward(warm + k)), ("B", *backward(k))]
    ops += [("B", *backward(k)) for k in range(total - warm, total)]
    return ops


def simulate_interleaved(p: int, m: int, v: int, t_f=1, t_b=1):
    """:func:`simulate` for the interleaved 1F1B schedule: v chunks per device, each op costing
    ``t_f / v`` or ``t_b / v`` (a chunk holds 1/v of the device's layers). Chunk c of device d is
    virtual stage ``g = c p + d``; its forward waits for virtual stage g - 1's, its backward for
    g + 1's. Returns the same dict as :func:`simulate` (``events`` as
    ``(device, op, micro_batch, start, end)``, plus ``chunks``, each event's chunk, and ``v``);
    ``peak_stash`` counts chunk micro-batches, each 1/v of a stage's activations. With v = 1 it
    is the 1F1B schedule."""
    p, m = _check(p, m)
    v = int(v)
    ops = [interleaved_ops(p, m, v, d) for d in range(p)]
    last = v * p - 1

    def dependency(d, op):
        what, i, chunk = op
        g = chunk * p + d
        if what == "F":
            return None if g == 0 else ((g - 1) % p, ("F", i, (g - 1) // p))
        return (d, ("F", i, chunk)) if g == last else ((g + 1) % p, ("B", i, (g + 1) // p))

    f, b = (Fraction(t_f, v), Fraction(t_b, v)) if _exact(t_f, t_b) else (t_f / v, t_b / v)
    placed = _list_schedule(ops, dependency, lambda op: f if op[0] == "F" else b)
    events = [(d, op, i, start, end) for d, (op, i, _), start, end in placed]
    chunks = [chunk for _, (_, _, chunk), _, _ in placed]
    steps = max(e[4] for e in events)
    busy = [sum(e[4] - e[3] for e in events if e[0] == d) for d in range(p)]
    bubble = 1 - sum(busy) / (p * steps)
    return {"events": events, "chunks": chunks, "steps": steps, "busy": busy, "bubble": bubble,
            "peak_stash": [_peak_stash(o) for o in ops], "kind": f"interleaved 1f1b, v={v}", "p": p, "m": m,
            "v": v, "t_f": t_f, "t_b": t_b}


def interleaved_bubble(p: int, m: int, v: int) -> Fraction:
    """The interleaved schedule's idle fraction ``(p - 1) / (v m + p - 1)``: its idle time
    ``(p - 1)(t_f + t_b) / v`` over the run, busy ``m (t_f + t_b)`` plus idle. The paper quotes
    idle over busy, ``(p - 1) / (v m)``. v = 1 gives :func:`bubble_formula`."""
    p, m = _check(p, m)
    return Fraction(p - 1, int(v) * m + p - 1)


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


def stash_bytes(stash) -> int:
    """Bytes of the activations held in ``stash`` (micro-batch -> list of arrays)."""
    return int(sum(a.nbytes for acts in stash.values() for a in acts))


class _Stage:
    """One stage's layers, its accumulated gradients and the activations it stashes."""

    def __init__(self, layers, lo: int, hi: int):
        self.lo, self.last_layer = lo, len(layers) - 1
        self.mine = [(np.asarray(W).copy(), np.asarray(b).copy()) for W, b in layers[lo:hi]]
        self.grads = [(np.zeros_like(W), np.zeros_like(b)) for W, b in self.mine]

    def forward(self, a):
        """The stage's input and every layer's output."""
        acts = [a]
        for j, (W, b) in enumerate(self.mine):
            acts.append(layer_forward(W, b, acts[-1], self.lo + j == self.last_layer))
        return acts

    def backward(self, acts, d):
        """Add this micro-batch's gradients; return the gradient for the stage's input."""
        for j in range(len(self.mine) - 1, -1, -1):
            dW, db, d = layer_backward(self.mine[j][0], acts[j], acts[j + 1], d, self.lo + j == self.last_layer)
            self.grads[j] = (self.grads[j][0] + dW, self.grads[j][1] + db)
        return d


def _cpu_timed(cpu_seconds: dict, kind: str, fn):
    """``fn()``, adding the CPU time this thread spent in it to ``cpu_seconds[kind]``: what an op
    costs, which a busy machine does not stretch (its wall time counts the turns of other processes)."""
    t0 = time.thread_time()
    out = fn()
    cpu_seconds[kind] += time.thread_time() - t0
    return out


def pipeline_step(comm, layers, X, T, m: int, schedule: str = "gpipe",
                  t_f: float = 0.0, t_b: float = 0.0, recompute: bool = False):
    """One forward+backward of the layer stack, pipelined over all ranks.

    ``layers`` is the full list ``[(W, b), ...]``; stage s keeps only its own layers.
    Only stage 0 reads X and only the last stage reads T (everybody gets them here for
    simplicity; a real pipeline loads them where needed). Returns this stage's layer
    range, its gradients, the loss (last stage; else None), the peak number of stashed
    micro-batches, the peak bytes of stashed activations, the bytes it sent and the CPU seconds
    its forwards, recomputations and backwards took (``cpu_seconds``, keys F, R, B).

    Each forward runs in a compute phase labelled ``F<i>``, each backward in one labelled
    ``B<i>``, padded to ``t_f`` and ``t_b`` seconds when those are given (emulated compute).
    With ``recompute`` (activation recomputation) a forward stashes only its input; the
    backward first recomputes the stage's forward from it, in a phase labelled ``R<i>``
    (padded to ``t_f``), then runs ``B<i>``.

    Sends do not block: in 1F1B's steady state two neighbours send to each other at once
    (stage s its activation forward, stage s + 1 its gradient back), and two blocking sends of
    messages larger than a Pipe's buffer would wait for each other forever. Megatron-LM posts
    such pairs together for the same reason (``torch.distributed.batch_isend_irecv``).
    """
    p, s = comm.size, comm.rank
    m = _check(p, m, schedule)[1]
    X, T = np.asarray(X), np.asarray(T)
    B = X.shape[0]
    if m > B:
        raise ValueError(f"cannot cut a batch of {B} rows into {m} micro-batches")
    lo, hi = stage_layers(len(layers), p)[s]
    stage = _Stage(layers, lo, hi)
    rows = np.array_split(np.arange(B), m)
    stash, peak, peak_bytes, total_loss, in_flight = {}, 0, 0, 0.0, []
    cpu_seconds = {"F": 0.0, "R": 0.0, "B": 0.0}
    sent0 = comm.stats.bytes_sent(s)
    for op, i in stage_ops(schedule, p, m, s):
        if op == "F":
            a = X[rows[i]] if s == 0 else comm.recv(source=s - 1, tag=TAG_ACT)
            acts = padded_compute(comm, f"F{i}", t_f,
                                  functools.partial(_cpu_timed, cpu_seconds, "F", functools.partial(stage.forward, a)))
            stash[i] = acts[:1] if recompute else acts      # recomputation keeps the stage's input only
            peak, peak_bytes = max(peak, len(stash)), max(peak_bytes, stash_bytes(stash))
            if s < p - 1:
                in_flight.append(comm.isend(acts[-1], s + 1, tag=TAG_ACT))
            continue
        acts = stash.pop(i)
        if recompute:
            acts = padded_compute(comm, f"R{i}", t_f, functools.partial(
                _cpu_timed, cpu_seconds, "R", functools.partial(stage.forward, acts[0])))
        if s == p - 1:
            loss, d = _output_gradient(acts[-1], T[rows[i]], B)
            total_loss += loss
        else:
            d = comm.recv(source=s + 1, tag=TAG_GRAD)
        d_in = padded_compute(comm, f"B{i}", t_b, functools.partial(
            _cpu_timed, cpu_seconds, "B", functools.partial(stage.backward, acts, d)))
        if s > 0:
            in_flight.append(comm.isend(d_in, s - 1, tag=TAG_GRAD))
    for request in in_flight:
        request.wait()
    return {"layers": (lo, hi), "grads": stage.grads, "loss": total_loss if s == p - 1 else None,
            "peak_stash": peak, "peak_stash_bytes": int(peak_bytes),
            "bytes_sent": int(comm.stats.bytes_sent(s) - sent0), "cpu_seconds": cpu_seconds,
            "param_bytes": int(sum(W.nbytes + b.nbytes for W, b in stage.mine))}


def _chunk_tag(g: int, i: int, n_chunks: int, backward: bool) -> int:
    """The tag of the message *into* virtual stage g for micro-batch i, forward (its input) or backward
    (the gradient of its output). Two devices exchange several streams at once (with p = 2, device 1
    sends chunk 1's activation forward to chunk 2 and its gradient back to chunk 0, both to device
    0): a tag naming chunk, micro-batch and direction makes every message unmistakable."""
    return TAG_CHUNK + 2 * (i * n_chunks + g) + int(backward)


def _output_gradient(Y, T_rows, B: int):
    """The loss ``||Y - T||^2 / 2B`` of a micro-batch and its gradient for Y: 1/B of the whole batch,
    so the micro-batches' gradients add up to the full batch's."""
    return float(0.5 * np.sum((Y - T_rows) ** 2) / B), (Y - T_rows) / B


def interleaved_pipeline_step(comm, layers, X, T, m: int, v: int, t_f: float = 0.0, t_b: float = 0.0):
    """One forward+backward under interleaved 1F1B (Narayanan et al. 2021, section 2.2.2) on real ranks.

    The layer stack is cut in v p chunks (:func:`stage_layers`); device d holds chunks d, d + p, ...,
    d + (v - 1) p (chunk c of device d is virtual stage g = c p + d) and runs
    :func:`interleaved_ops` in order. Virtual stage g receives its input from device (g - 1) mod p
    and the gradient of its output from device (g + 1) mod p. Each op is a compute phase labelled
    ``F<i>c<c>`` or ``B<i>c<c>``, padded to ``t_f / v`` or ``t_b / v`` (a chunk has 1/v of a device's
    layers). Sends do not block, as in :func:`pipeline_step`, for the same reason.

    Traffic (p > 1; with p = 1 every border stays inside the one device): a micro-batch crosses the
    v p - 1 borders between chunks forward and again backward, each a message between devices, so the
    run sends ``2 m (v p - 1)`` messages, device d ``m (2 v - [d = 0] - [d = p - 1])`` of them, and
    ``2 B 8 sum_k w_k`` bytes, w_k the width at border k (:func:`interleaved_bytes`).

    Returns pipeline_step's dict with ``layers`` a list of the device's chunk ranges and ``grads``
    one gradient list per chunk (:func:`assemble_pipeline_grads` puts them in layer order),
    ``peak_stash`` in chunk micro-batches, plus ``messages_sent``."""
    p, d = comm.size, comm.rank
    order = interleaved_ops(p, m, v, d)                 # checks p, m, v and d
    n_chunks, X, T = v * p, np.asarray(X), np.asarray(T)
    B = X.shape[0]
    if m > B:
        raise ValueError(f"cannot cut a batch of {B} rows into {m} micro-batches")
    ranges = stage_layers(len(layers), n_chunks)
    chunks = [_Stage(layers, *ranges[c * p + d]) for c in range(v)]
    rows = np.array_split(np.arange(B), m)
    stash, peak, peak_bytes, total_loss, in_flight = {}, 0, 0, 0.0, []
    sent0, messages0 = comm.stats.bytes_sent(d), comm.stats.messages_sent(d)
    for op, i, c in order:
        g, stage = c * p + d, chunks[c]
        if op == "F":
            a = X[rows[i]] if g == 0 else comm.recv(source=(g - 1) % p, tag=_chunk_tag(g, i, n_chunks, False))
            stash[i, c] = padded_compute(comm, f"F{i}c{c}", t_f / v, functools.partial(stage.forward, a))
            peak, peak_bytes = max(peak, len(stash)), max(peak_bytes, stash_bytes(stash))
            if g < n_chunks - 1:
                in_flight.append(comm.isend(stash[i, c][-1], (g + 1) % p, tag=_chunk_tag(g + 1, i, n_chunks, False)))
            continue
        acts = stash.pop((i, c))
        if g == n_chunks - 1:
            loss, grad_out = _output_gradient(acts[-1], T[rows[i]], B)
            total_loss += loss
        else:
            grad_out = comm.recv(source=(g + 1) % p, tag=_chunk_tag(g, i, n_chunks, True))
        grad_in = padded_compute(comm, f"B{i}c{c}", t_b / v, functools.partial(stage.backward, acts, grad_out))
        if g > 0:
            in_flight.append(comm.isend(grad_in, (g - 1) % p, tag=_chunk_tag(g - 1, i, n_chunks, True)))
    for request in in_flight:
        request.wait()
    return {"layers": [ranges[c * p + d] for c in range(v)], "grads": [stage.grads for stage in chunks],
            "loss": total_loss if d == p - 1 else None, "peak_stash": peak, "peak_stash_bytes": int(peak_bytes),
            "bytes_sent": int(comm.stats.bytes_sent(d) - sent0),
            "messages_sent": int(comm.stats.messages_sent(d) - messages0),
            "param_bytes": int(sum(W.nbytes + b.nbytes for stage in chunks for W, b in stage.mine))}


def interleaved_messages(p: int, m: int, v: int) -> list[int]:
    """Messages device d sends in :func:`interleaved_pipeline_step`: each of its v chunks sends every
    micro-batch's output forward (but the last chunk of the pipeline, on device p - 1) and its input's
    gradient back (but the first, on device 0): ``m (2 v - [d = 0] - [d = p - 1])``; in all
    ``2 m (v p - 1)``. With p = 1 the borders are inside the device: no message."""
    if p == 1:
        return [0]
    return [m * (2 * v - (d == 0) - (d == p - 1)) for d in range(p)]


def interleaved_bytes(layers, B: int, p: int, v: int) -> list[int]:
    """Bytes device d sends in :func:`interleaved_pipeline_step` on a batch of B rows: for each of its
    chunks g = c p + d, the whole batch's activations at its output border forward (g < v p - 1) and
    their gradients at its input border back (g > 0), ``B w 8`` bytes each, w the border's width
    (the input width of the chunk after it)."""
    if p == 1:
        return [0]
    n_chunks = v * p
    starts = [lo for lo, _ in stage_layers(len(layers), n_chunks)]
    width_into = [np.asarray(layers[lo][0]).shape[0] for lo in starts]      # input width of chunk g
    sent = [0] * p
    for g in range(n_chunks):
        out = B * width_into[g + 1] * 8 if g < n_chunks - 1 else 0
        back = B * width_into[g] * 8 if g > 0 else 0
        sent[g % p] += out + back
    return sent


def assemble_pipeline_grads(results):
    """Put the ranks' gradient lists together into ``[(dW, db), ...]`` for all layers, in layer order:
    one layer range per rank (:func:`pipeline_step`) or one per chunk
    (:func:`interleaved_pipeline_step`, ``layers`` a list of ranges, ``grads`` a list per chunk)."""
    pieces = []
    for res in results:
        ranges, grads = res["layers"], res["grads"]
        if isinstance(ranges, tuple):               # pipeline_step: one contiguous stage
            ranges, grads = [ranges], [grads]
        pieces += zip(ranges, grads)
    out, expected = [], 0
    for (lo, hi), grads in sorted(pieces, key=lambda piece: piece[0][0]):
        if lo != expected:
            raise ValueError(f"the ranks' layer ranges leave a gap or overlap at layer {expected}")
        out.extend(grads)
        expected = hi
    return out
