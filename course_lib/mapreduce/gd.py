"""Synchronous MapReduce gradient descent on real processes (client-server).

Rank 0 is the server, ranks 1..M are the workers, so M workers need ``Cluster(M + 1)``.
The data (X, y) sit in shared memory created by the parent; worker m maps the rows of
shard m - 1 (``numpy.array_split`` ranges) through a zero-copy view. Only w goes down and
only the packed partial sums come up (see ``serial.map_shard``), once per iteration.

Fault tolerance, the MapReduce way: when a worker dies (its Pipe closes, the server's
``recv`` raises ``PeerLost``), the server gives the dead worker's shards to a live worker,
which re-executes the map of this iteration (traced as ``"map shard k (re-executed)"``)
and keeps those shards from then on. The reduce always runs in shard order, so the final
w is bit-for-bit the one of a run without the fault.

A worker whose fn raised stays alive with its Pipe open, so the server cannot see it die;
``task_timeout`` makes the server give up on any worker that has not answered that many
seconds after the broadcast (the master's timeouts in the MapReduce paper).

Every setting of a run is a field of :class:`MapReduceSettings`, passed whole from
:func:`mapreduce_gd` to the server and the workers.

Minibatch SGD: with ``batch_size=B`` each iteration maps only B rows, drawn by
``serial.minibatch(N, B, t, batch_seed)`` on every rank alike; worker m maps the drawn rows of
its shard, the server divides by B. The messages are those of the full batch.

Checkpoints: with ``checkpoint_dir`` and ``checkpoint_every=k`` the server saves
(w, iteration, losses) every k iterations; ``resume=True`` restarts from the last one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from course_lib import validate

from . import checkpoint as ckpt
from .losses import Problem, get_problem
from .serial import (
    batch_counts,
    default_lr,
    initial_w,
    map_shard,
    minibatch,
    reduce_and_update,
    shard_batch,
    shard_ranges,
)
from .settings import MapReduceSettings

TAG_W, TAG_G, TAG_RE, TAG_RG, TAG_STOP = 1, 2, 3, 4, 5


@dataclass
class GDResult:
    """What one MapReduce GD run gives back."""

    w: np.ndarray | None            # final parameters (None if the server died)
    losses: np.ndarray | None       # losses[t] = L(w_t), including iterations before a resume
    start_iteration: int            # 0, or the checkpoint's iteration when resumed
    iterations: int                 # the iteration reached (== iters when completed)
    time_per_iteration: np.ndarray  # seconds, measured by the server, for this run's iterations
    n_workers: int
    reduce: str
    reexecuted: list = field(default_factory=list)   # dicts: iteration, shard, dead_rank, new_rank
    failures: dict = field(default_factory=dict)     # rank -> WorkerError
    run: object = None                               # the raw RunResult (stats, timeline, ...)
    completed: bool = True

    @property
    def stats(self):
        return self.run.stats

    @property
    def timeline(self):
        return self.run.timeline

    @property
    def wall_time(self):
        return self.run.wall_time

    @property
    def bytes_per_iteration(self) -> float:
        """Measured payload bytes per iteration of this run (all links)."""
        n = max(self.iterations - self.start_iteration, 1)
        return self.stats.total_bytes / n

    @property
    def words_per_iteration(self) -> float:
        """Measured payload words (8 bytes) per iteration of this run."""
        return self.bytes_per_iteration / 8


def mapreduce_gd(cluster, problem, X, y, settings: MapReduceSettings | None = None, *, w0=None,
                 **overrides) -> GDResult:
    """Run ``settings.iters`` iterations of synchronous MapReduce GD on ``cluster`` (size M + 1).

    X, y: SharedArray (recommended: create them once, reuse across runs) or numpy arrays
    (then copied into shared memory for this call and freed after it).
    settings: a :class:`MapReduceSettings` (None: its defaults); keywords override its fields, as in
    ``mapreduce_gd(cluster, "least_squares", X, y, iters=50, faults={2: Fault("kill", step=3)})``.
    w0: the start point (default: zeros).
    """
    from course_lib import SharedArray

    settings = validate.settings_from(MapReduceSettings, settings, overrides)
    job = _prepare(get_problem(problem), X, y, w0, settings)
    owned = []  # arrays given as numpy go to shared memory for this call only
    if not isinstance(X, SharedArray):
        X = SharedArray.from_array(np.ascontiguousarray(X, dtype=np.float64))
        owned.append(X)
    if not isinstance(y, SharedArray):
        y = SharedArray.from_array(np.ascontiguousarray(y, dtype=np.float64))
        owned.append(y)
    try:
        res = cluster.run(_program, X, y, job, **settings.run_knobs())
    finally:
        for sa in owned:
            sa.release()
    return _result(res, job)


@dataclass(frozen=True, eq=False)
class _Job:
    """One run as the server and the workers need it: the settings, and what the parent resolved from them."""

    settings: MapReduceSettings
    problem: Problem
    lr: float            # settings.lr, or 1/L on the data
    w: np.ndarray        # the start point: w0, zeros, or the checkpoint's w
    start: int           # the first iteration to run: 0, or the checkpoint's
    prefix: np.ndarray   # the losses of the iterations before a resume
    meta: dict           # what a checkpoint must match to be resumed


def _result(res, job: _Job) -> GDResult:
    server, start, reduce = res[0], job.start, job.settings.reduce
    failures = dict(getattr(res, "failures", {}) or {})
    n_workers = len(res) - 1
    if server is None:  # the server died: report how far the checkpoints got
        return GDResult(None, None, start, start, np.empty(0), n_workers, reduce,
                        failures=failures, run=res, completed=False)
    losses = np.concatenate([job.prefix, server["losses"]])
    return GDResult(server["w"], losses, start, job.settings.iters, np.asarray(server["times"]), n_workers,
                    reduce, reexecuted=server["reexecuted"], failures=failures, run=res, completed=True)


def _prepare(problem: Problem, X, y, w0, settings: MapReduceSettings) -> _Job:
    """Check the data; the step size, initial w and the checkpoint to resume from."""
    Xa, ya = np.asarray(X), np.asarray(y)
    if Xa.ndim != 2 or ya.ndim not in (1, 2) or len(ya) != len(Xa):
        raise ValueError(f"X must be (N, d) and y must have N rows; got {Xa.shape} and {ya.shape}")
    lr = default_lr(problem, Xa) if settings.lr is None else settings.lr
    w = initial_w(ya, Xa.shape[1]) if w0 is None else np.array(w0, dtype=np.float64)
    meta = {"problem": problem.name, "reduce": settings.reduce, "lr": lr, "shape": tuple(Xa.shape)}
    if settings.batch_size is not None:
        if settings.batch_size > len(Xa):
            raise ValueError(f"batch_size {settings.batch_size} is more than the {len(Xa)} rows")
        meta.update(batch_size=settings.batch_size, batch_seed=settings.batch_seed)
    start, prefix = 0, np.empty(0)
    if settings.resume:
        found = ckpt.load(settings.checkpoint_dir)
        if found is not None:
            w, start, prefix, saved_meta = found
            if saved_meta != repr(sorted(meta.items())):
                raise ValueError(f"the checkpoint in {settings.checkpoint_dir} is for another job: {saved_meta}")
    return _Job(settings, problem, lr, w, start, prefix, meta)


def mapreduce_program(comm, problem, X, y, settings: MapReduceSettings | None = None, *, w0=None) -> dict:
    """The SPMD program alone, for any communicator (``mpiexec``, ``python -m course_lib.run``).

    Every rank passes its own copy of the same ``X, y`` and resolves the same run from ``settings``
    (no parent process here to do it once); rank 0 returns the server's dict (``w``, ``losses``,
    ``times``, ``reexecuted``, ``shards_of``), the others their ``shards`` and ``maps``.
    """
    settings = MapReduceSettings() if settings is None else settings
    return _program(comm, X, y, _prepare(get_problem(problem), X, y, w0, settings))


def _program(comm, X, y, job: _Job):
    """The SPMD program: rank 0 serves, the others map."""
    if comm.size < 2:
        raise ValueError("MapReduce GD needs a server and at least one worker: Cluster(M + 1) with M >= 1")
    if comm.rank == 0:
        return _server(comm, len(X), job)
    return _worker(comm, X, y, job)


def _server(comm, n, job: _Job):
    """Rank 0: for each iteration, broadcast w, gather the maps (re-executing the lost ones), reduce, update."""
    from course_lib import PeerLost

    settings, w = job.settings, job.w
    m = comm.size - 1
    counts = [hi - lo for lo, hi in shard_ranges(n, m)]
    shards_of = {r: [r - 1] for r in range(1, m + 1)}  # rank -> shards it maps
    losses, times, reexecuted = [], [], []
    for t in range(job.start, settings.iters):
        t0 = comm.now()
        for r in sorted(shards_of):  # broadcast w (one send per live worker)
            try:
                comm.send(w, r, tag=TAG_W)
            except PeerLost:
                pass  # found dead again below, when its answer does not come
        results = [None] * m
        deadline = None if settings.task_timeout is None else t0 + settings.task_timeout
        for r in sorted(shards_of):  # gather, in rank order
            try:
                for k in shards_of[r]:
                    results[k] = _recv_by(comm, r, TAG_G, deadline)
            except (PeerLost, TimeoutError):
                pass
        _reexecute(comm, w, t, results, shards_of, reexecuted, settings.task_timeout)
        batch = settings.batch_size
        rows = counts if batch is None else batch_counts(minibatch(n, batch, t, settings.batch_seed),
                                                         shard_ranges(n, m))
        w = _reduce_step(comm, job, t, results, rows, w, losses)
        times.append(comm.now() - t0)
        comm.progress(t + 1, settings.iters)  # a progress bar in the notebook cell
    for r in range(1, m + 1):  # also to a worker given up for silence: it may still be listening
        try:
            comm.send(np.empty(0), r, tag=TAG_STOP)  # 0 payload bytes: the traffic formula stays exact
        except PeerLost:
            pass
    return {"w": w, "losses": np.array(losses), "times": times, "reexecuted": reexecuted,
            "shards_of": {r: list(s) for r, s in shards_of.items()}}


def _reduce_step(comm, job: _Job, t: int, results, counts, w, losses: list):
    """Reduce the maps of iteration t into the next w (noting the loss), and checkpoint if one is due."""
    settings = job.settings
    every = settings.checkpoint_every
    save = settings.checkpoint_dir is not None and every and (t + 1) % every == 0
    with comm.compute("reduce + update" + (" + checkpoint" if save else "")):
        w, loss = reduce_and_update(results, counts, settings.reduce, w, job.lr)
        losses.append(loss)
        if save:
            ckpt.save(settings.checkpoint_dir, w, t + 1, np.concatenate([job.prefix, losses]), job.meta)
    return w


def _recv_by(comm, source, tag, deadline):
    """recv, or TimeoutError once comm.now() passes deadline (polls; None: block)."""
    if deadline is None:
        return comm.recv(source=source, tag=tag)
    while not comm.iprobe(source=source, tag=tag):
        if comm.now() > deadline:
            raise TimeoutError(f"rank {source} did not answer in time")
        time.sleep(2e-4)
    return comm.recv(source=source, tag=tag)


def _reexecute(comm, w, t, results, shards_of, log, task_timeout=None):
    """Give the shards of dead workers to live ones and collect their maps of iteration t."""
    from course_lib import PeerLost

    while True:
        dead = [r for r in shards_of if any(results[k] is None for k in shards_of[r])]
        if not dead:
            return
        for r in dead:
            orphans = shards_of.pop(r)
            if not shards_of:
                raise RuntimeError(f"every worker died (last: rank {r}); nothing can re-execute shard {orphans}")
            for k in orphans:  # to the least loaded live worker, ties to the lowest rank
                q = min(shards_of, key=lambda s: (len(shards_of[s]), s))
                shards_of[q].append(k)
                shards_of[q].sort()
                log.append({"iteration": t, "shard": k, "dead_rank": r, "new_rank": q})
                try:
                    comm.send(([k], w), q, tag=TAG_RE)
                    deadline = None if task_timeout is None else comm.now() + task_timeout
                    results[k] = _recv_by(comm, q, TAG_RG, deadline)
                except (PeerLost, TimeoutError):
                    results[k] = None  # q died too: the next round hands its shards on


def _worker(comm, X, y, job: _Job):
    """Rank m: map its shard (and any re-executed one) of every w the server sends, until the stop."""
    from course_lib import PeerLost, Status

    problem, reduce = job.problem, job.settings.reduce
    Xa, ya = np.asarray(X), np.asarray(y)
    n, m = len(Xa), comm.size - 1
    ranges = shard_ranges(n, m)
    mine = [comm.rank - 1]
    maps = 0
    status = Status()
    batch, t = job.settings.batch_size, job.start - 1   # t: the iteration of the last w received
    while True:
        try:
            msg = comm.recv(source=0, status=status)
        except PeerLost:
            return {"shards": mine, "maps": maps, "server_lost": True}
        if status.tag == TAG_STOP:
            return {"shards": mine, "maps": maps, "server_lost": False}
        if status.tag == TAG_RE:
            ks, w = msg
            tag, suffix = TAG_RG, " (re-executed)"
            mine = sorted(mine + list(ks))
        else:
            ks, w, tag, suffix = mine, msg, TAG_G, ""
            t += 1
        rows = None if batch is None else minibatch(n, batch, t, job.settings.batch_seed)
        for k in ks:
            lo, hi = ranges[k]
            with comm.compute(f"map shard {k}{suffix}"):
                if rows is None:
                    out = map_shard(problem, Xa[lo:hi], ya[lo:hi], w, reduce)  # views: no copy
                else:  # the drawn rows of this shard (a copy of B/M rows, on average)
                    mine_rows = shard_batch(rows, lo, hi)
                    out = map_shard(problem, Xa[mine_rows], ya[mine_rows], w, reduce)
                maps += 1
            try:
                comm.send(out, 0, tag=tag)
            except PeerLost:
                return {"shards": mine, "maps": maps, "server_lost": True}
