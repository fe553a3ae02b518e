"""Hogwild! (Recht, Re, Wright, Niu 2011): SGD on a weight vector in shared memory, no locks.

Every worker process attaches the same ``w`` (a :class:`course_lib.SharedArray`) and, for
each of its samples i, reads the few coordinates ``w[idx[i]]`` and writes them back
updated, without asking anybody. Two updates collide only if their samples share a
coordinate; on a sparse problem that is rare (see ``sparsity_stats``), so the lost or
mixed writes barely matter and the processes never wait for each other.

The locked variant takes a ``multiprocessing.Lock`` around each update: always correct,
serialised. A lock cannot travel through a Pipe (multiprocessing only lets it be
inherited at process start), so this module starts its own processes with
``multiprocessing`` (the start method of the course: fork, spawn or forkserver), ships the
worker function by value with cloudpickle and hands the lock over at start.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import NamedTuple

import cloudpickle
import numpy as np

from course_lib import validate
from course_lib.reference.ex03 import hogwild_worker  # question ex03_3

from .settings import HogwildSettings
from .sgd_problems import SparseProblem, sample_order, serial_sparse_sgd, sparse_loss


def locked_worker(w, idx, val, y, order, lr, lock):
    """The steps of :func:`hogwild_worker`, each one inside ``with lock:`` (read and write of w as one unit)."""
    for i in order:
        with lock:
            hogwild_worker(w, idx, val, y, (i,), lr)
    return len(order)


class _Report(NamedTuple):
    """What a worker process sends back: ``("ok", rank, start, end, count, cpu)`` or
    ``("error", rank, repr(exception), traceback, None, None)``."""

    status: str
    rank: int
    start: float | str    # perf_counter at the start (the exception's repr on error)
    end: float | str      # perf_counter at the end (the traceback on error)
    updates: object       # the worker's return value: a count, or timed_worker's dict
    cpu: float | None     # process_time spent between start and end: the time it held a core


def _entry(payload, rank, lock, barrier, conn):
    """Child process: attach the shared arrays, wait for the others, run the worker loop."""
    try:
        worker, w_sa, idx_sa, val_sa, y_sa, order, lr = cloudpickle.loads(payload)
        w, idx, val, y = w_sa.array, idx_sa.array, val_sa.array, y_sa.array
        barrier.wait(timeout=30)
        t0, c0 = time.perf_counter(), time.process_time()
        if lock is None:
            n = worker(w, idx, val, y, order, lr)
        else:
            n = worker(w, idx, val, y, order, lr, lock=lock)
        t1, c1 = time.perf_counter(), time.process_time()
        conn.send(("ok", rank, t0, t1, n, c1 - c0))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        conn.send(("error", rank, repr(e), traceback.format_exc(), None, None))
    finally:
        conn.close()


@dataclass
class HogwildResult:
    """What a Hogwild! run measured (times in seconds since the first worker started)."""

    w: np.ndarray
    final_loss: float      # sparse_loss at the final w
    wall_time: float       # first start to last finish
    worker_times: list     # (start, end) per worker
    cpu_share: list        # per worker, the share of its (start, end) it held a core: CPU time / wall time
    n_updates: int
    locked: bool
    n_workers: int
    spans: list | None = None     # per worker, (read, written) times of each update (timed_worker only)
    samples: list | None = None   # per worker, the samples it visited, in order
    wall_times: list | None = None  # every repeat's wall time; this result is the fastest repeat's
    apart: bool = False     # each worker on a private copy of w (no model, no collision)

    @property
    def loss(self) -> float:
        """:attr:`final_loss`, under the name the lesson 03 notebook and its question use."""
        return self.final_loss


def _context(start_method):
    import multiprocessing as mp

    from course_lib.runtime.cluster import default_start_method

    method = start_method or default_start_method()  # the course's default, as Cluster uses
    if method not in mp.get_all_start_methods():
        raise ValueError(f"unknown start method {method!r}; have {mp.get_all_start_methods()}")
    return mp.get_context(method)


def run_hogwild(problem: SparseProblem, settings: HogwildSettings | None = None, **overrides) -> HogwildResult:
    """Run ``settings.n_workers`` processes of Hogwild! (or the locked variant) on ``problem``.

    ``settings``: a :class:`HogwildSettings` (None: its defaults); keywords override its fields,
    as in ``run_hogwild(p, n_workers=2, lock=True)``.
    The ``n_updates`` samples are ``sample_order(n, n_updates, seed)`` dealt round-robin to
    the workers, so the serial baseline (``serial_sparse_sgd`` on the same order) makes the
    same number of updates on the same samples. ``worker`` replaces the worker loop
    (signature of :func:`hogwild_worker`, plus ``lock`` when ``lock=True``).

    ``apart=True`` runs each worker on a private copy of ``w`` (:func:`on_private_copy`): the
    time of the same loop with nothing shared, and no model.

    ``repeats`` runs the whole thing that many times, from w = 0 each time, and returns the
    fastest run (``wall_times`` lists them all). A run of 0.1 s is shorter than the time
    another program may hold a core, so one run says as much about the laptop as about
    Hogwild!; the fastest of a few is what timeit reports, for the same reason.
    """
    settings = validate.settings_from(HogwildSettings, settings, overrides)
    worker = settings.worker
    if worker is None:
        worker = locked_worker if settings.lock else hogwild_worker
    if settings.apart:
        worker = on_private_copy(worker)
    ctx = _context(settings.start_method)
    runs = [_run_once(ctx, problem, settings, worker) for _ in range(settings.repeats)]
    return fastest_run(runs)


def fastest_run(runs: list[HogwildResult]) -> HogwildResult:
    """The run with the smallest wall time, carrying every run's wall time in ``wall_times``."""
    fastest = min(runs, key=lambda run: run.wall_time)
    fastest.wall_times = [run.wall_time for run in runs]
    return fastest


def on_private_copy(worker):
    """``worker`` run on a private copy of ``w``: the same loop, the same reads and writes, but
    nothing shared, so no collision and no cache line moving between cores. No model comes of
    it (the shared ``w`` stays at 0); it is the time two processes take when they do not
    interfere at all, the ceiling Hogwild! is measured against."""
    def apart(w, idx, val, y, order, lr):
        return worker(np.array(w), idx, val, y, order, lr)

    return apart


def _run_once(ctx, problem, settings: HogwildSettings, worker) -> HogwildResult:
    """One run of :func:`run_hogwild` with the loop ``worker``: fresh shared arrays, the workers, their result."""
    from course_lib.runtime.shm import SharedArray

    n_workers = settings.n_workers
    order = sample_order(problem.n, settings.n_updates, settings.seed)
    samples = [order[r::n_workers] for r in range(n_workers)]
    arrays = [SharedArray.create(problem.d, np.float64, fill=0.0),
              SharedArray.from_array(problem.idx), SharedArray.from_array(problem.val),
              SharedArray.from_array(problem.y)]
    try:
        reports = _run_workers(ctx, worker, arrays, samples, settings)
        w = arrays[0].array.copy()
    finally:
        for a in arrays:
            a.release()
    return _result(reports, samples, w, problem, settings)


def _run_workers(ctx, worker, arrays, samples, settings: HogwildSettings) -> list[_Report]:
    """One process per entry of ``samples``, started together (a barrier); their reports, in rank order."""
    shared_lock = ctx.Lock() if settings.lock else None
    barrier = ctx.Barrier(len(samples))
    procs, conns = [], []
    try:
        for r, mine in enumerate(samples):
            payload = cloudpickle.dumps((worker, *arrays, mine, settings.lr))
            recv_end, send_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_entry, args=(payload, r, shared_lock, barrier, send_end),
                            name=f"hogwild-{r}", daemon=True)
            p.start()
            send_end.close()  # the child holds the only send end: EOF here means it died
            procs.append(p)
            conns.append(recv_end)
        return _collect_reports(procs, conns, settings.timeout)
    finally:
        _stop(procs, conns)


def _collect_reports(procs, conns, timeout) -> list[_Report]:
    """Every worker's report within ``timeout`` seconds in all; the first failure raises."""
    deadline = time.monotonic() + timeout
    reports = []
    for r, c in enumerate(conns):
        if not c.poll(max(deadline - time.monotonic(), 0)):
            raise TimeoutError(f"Hogwild! worker {r} still running after {timeout} s")
        try:
            reports.append(_Report(*c.recv()))
        except EOFError:
            procs[r].join(1)
            raise RuntimeError(f"Hogwild! worker {r} died (exit code {procs[r].exitcode})") from None
    for rep in reports:
        if rep.status == "error":
            raise RuntimeError(f"Hogwild! worker {rep.rank} raised {rep.start}\n{rep.end}")
    return reports


def _stop(procs, conns) -> None:
    """Join the workers (terminating any still alive after 2 s) and close the pipes."""
    for p in procs:
        p.join(timeout=2)
        if p.is_alive():
            p.terminate()
            p.join(2)
    for c in conns:
        c.close()


def _result(reports: list[_Report], samples, w, problem: SparseProblem, settings: HogwildSettings) -> HogwildResult:
    """Times relative to the first start; timed_worker's dicts split into counts and spans."""
    t_first = min(rep.start for rep in reports)
    spans = None
    if all(isinstance(rep.updates, dict) for rep in reports):  # timed_worker
        spans = [rep.updates["spans"] - t_first for rep in reports]
        reports = [rep._replace(updates=rep.updates["n"]) for rep in reports]
    return HogwildResult(
        w=w, final_loss=sparse_loss(problem.idx, problem.val, problem.y, w),
        wall_time=max(rep.end for rep in reports) - t_first,
        worker_times=[(rep.start - t_first, rep.end - t_first) for rep in reports],
        cpu_share=[rep.cpu / max(rep.end - rep.start, 1e-9) for rep in reports],
        n_updates=sum(rep.updates for rep in reports), locked=settings.lock, apart=settings.apart,
        n_workers=len(reports),
        spans=spans, samples=samples)


class SerialRun(NamedTuple):
    """The serial baseline's answer; unpacks as ``w, final_loss, wall_time``."""

    w: np.ndarray
    final_loss: float
    wall_time: float    # seconds of the SGD loop alone


def run_serial(problem: SparseProblem, n_updates: int = 20000, lr: float = 0.5, seed: int = 0) -> SerialRun:
    """The serial baseline on the same samples as :func:`run_hogwild`: ``(w, final_loss, wall_time)``."""
    order = sample_order(problem.n, n_updates, seed)
    t0 = time.perf_counter()
    w = serial_sparse_sgd(problem.idx, problem.val, problem.y, problem.d, order, lr)
    wall_time = time.perf_counter() - t0
    return SerialRun(w, sparse_loss(problem.idx, problem.val, problem.y, w), wall_time)
