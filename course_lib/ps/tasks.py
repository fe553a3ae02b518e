"""Asynchronous tasks and their dependencies (Li et al., OSDI 2014, section 3.4, and its figure 5).

A push or a pull is a *task*: ``kv.pull`` returns at once and the worker computes while it runs.
A task may be marked to depend on earlier ones (``kv.pull(keys, after=[ts])``): it starts only once
they have finished. The SGD loop of one worker, iteration ``t``: read ``w`` (the pull of ``t``),
gradient, push ``u_t``. Two ways to issue the pull of ``t + 1``:

* **with the dependency** on push ``t``: it leaves once push ``t`` is acknowledged, so the read
  contains ``u_t``; with the sequential server (``tau = 0``) each read holds every update of every
  earlier iteration, staleness 0, and the run is plain synchronous SGD. Per iteration the worker
  waits for two round trips::

      T_dep  ~  c + 4 alpha        (c: compute; push -> ack, then pull -> answer)

* **without** it: the pull of ``t + 1`` leaves before the gradient of ``t`` is computed, and its
  round trip hides behind the computation; the read misses ``u_t`` (staleness 1), so the run is
  SGD with a delay of one iteration (:func:`delayed_sgd`)::

      T_overlap  ~  max(c, 2 alpha)

Staleness is measured, not assumed: every push also adds 1 to a counter key (the last key, not a
weight), so the value a pull returns for it is the number of pushes the read contains.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .workload import CTRData, minibatch_grad


@dataclass(frozen=True)
class TaskEvent:
    """When (seconds since the run started) worker ``worker`` issued or saw the end of a task."""
    worker: int
    iteration: int
    what: str            # "pull sent" or "push sent"
    time: float


def prefetch_worker(kv, data: CTRData, iters: int, batch: int, eta: float, depend: bool, work: float = 0.0,
                    seed: int = 0) -> dict:
    """One worker's loop on its shard of ``data``; ``depend``: the pull of ``t + 1`` waits for push ``t``.

    ``work`` seconds of emulated compute per gradient. Returns the staleness of every read (the
    iterations of updates it misses), the task events and the seconds per iteration."""
    comm = kv.comm
    counter = data.n_keys                                  # the key every push adds 1 to
    rows = np.arange(kv.w, len(data.y), kv.cfg.n_workers)
    rng = np.random.default_rng(seed * 1000 + kv.w)        # the minibatches of sequential_lr
    batches = [rng.choice(rows, size=batch, replace=False) for _ in range(iters)]
    keys = [np.append(np.unique(data.idx[b]), counter) for b in batches]
    events, staleness, starts = [], [], []

    def pull(t, after=()):
        ts = kv.pull(keys[t], after=after)          # returns once sent (after its dependencies)
        events.append(TaskEvent(kv.w, t, "pull sent", comm.now()))
        return ts

    next_pull = pull(0)
    for t in range(iters):
        starts.append(comm.now())
        pulled = kv.wait(next_pull)
        staleness.append(t - pulled[-1] / kv.cfg.n_workers)     # iterations of updates the read misses
        if not depend and t + 1 < iters:
            next_pull = pull(t + 1)                              # before the gradient: overlap
        with comm.compute("gradient"):
            if work:
                time.sleep(work)
            g, _ = minibatch_grad(data.idx[batches[t]], data.y[batches[t]], keys[t][:-1], pulled[:-1])
        pushed = kv.push(keys[t], np.append(-eta * g, 1.0))
        events.append(TaskEvent(kv.w, t, "push sent", comm.now()))
        kv.advance()
        if depend and t + 1 < iters:
            next_pull = pull(t + 1, after=[pushed])              # leaves once push t is acknowledged
    starts.append(comm.now())
    return {"staleness": staleness, "events": events, "step_seconds": np.diff(starts).tolist()}


def delayed_sgd(data: CTRData, n_workers: int, iters: int, batch: int, eta: float, delay: int,
                seed: int = 0) -> np.ndarray:
    """Single-process baseline: iteration ``t`` of every worker reads the model after iterations
    ``0 .. t - 1 - delay`` (all of them for ``delay = 0``: synchronous SGD, :func:`.sequential_lr`)::

        w_{t+1} = w_t + sum_workers u(w_{max(t - delay, 0)})"""
    history = [np.zeros(data.n_keys)]
    rngs = [np.random.default_rng(seed * 1000 + k) for k in range(n_workers)]
    rows = [np.arange(k, len(data.y), n_workers) for k in range(n_workers)]
    for t in range(iters):
        read = history[max(t - delay, 0)]
        w = history[-1].copy()
        for k in range(n_workers):
            b = rngs[k].choice(rows[k], size=batch, replace=False)
            keys = np.unique(data.idx[b])
            g, _ = minibatch_grad(data.idx[b], data.y[b], keys, read[keys])
            w[keys] += -eta * g
        history.append(w)
    return history[-1]


__all__ = ["TaskEvent", "prefetch_worker", "delayed_sgd"]
