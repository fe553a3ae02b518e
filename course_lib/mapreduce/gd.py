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

Checkpoints: with ``checkpoint_dir`` and ``checkpoint_every=k`` the server saves
(w, iteration, losses) every k iterations; ``resume=True`` restarts from the last one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import checkpoint as ckpt
from .losses import get_problem
from .serial import check_reduce, default_lr, initial_w, map_shard, reduce_and_update, shard_ranges

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


def mapreduce_gd(cluster, problem, X, y, iters=100, lr=None, w0=None, reduce="sum",
                 checkpoint_dir=None, checkpoint_every=None, resume=False, task_timeout=None,
                 **run_kw) -> GDResult:
    """Run ``iters`` iterations of synchronous MapReduce GD on ``cluster`` (size M + 1).

    X, y: SharedArray (recommended: create them once, reuse across runs) or numpy arrays
    (then copied into shared memory for this call and freed after it).
    run_kw: per-run knobs passed to ``cluster.run``: network, slow, faults, timeout, on_failure.
    With faults and no on_failure given, on_failure="continue" (the server must survive).
    task_timeout: seconds after the broadcast within which a worker must answer; a worker that
    does not (its fn raised, or it is far too slow) is treated as failed and its shards are
    re-executed elsewhere. None (default): only a worker whose process died counts as failed.
    """
    from course_lib import SharedArray

    problem = get_problem(problem)
    check_reduce(reduce)
    if not (isinstance(iters, (int, np.integer)) and iters >= 1):
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ValueError("checkpoint_every needs a checkpoint_dir")
    if checkpoint_every is not None and not (isinstance(checkpoint_every, int) and checkpoint_every >= 1):
        raise ValueError(f"checkpoint_every must be an int >= 1, got {checkpoint_every!r}")
    if task_timeout is not None and not task_timeout > 0:
        raise ValueError(f"task_timeout must be > 0 seconds or None, got {task_timeout!r}")
    if "faults" in run_kw and "on_failure" not in run_kw:
        run_kw["on_failure"] = "continue"

    lr, w, meta, start, prefix = _prepare(problem, X, y, lr, w0, reduce, checkpoint_dir, resume)
    owned = []  # arrays given as numpy go to shared memory for this call only
    if not isinstance(X, SharedArray):
        X = SharedArray.from_array(np.ascontiguousarray(X, dtype=np.float64))
        owned.append(X)
    if not isinstance(y, SharedArray):
        y = SharedArray.from_array(np.ascontiguousarray(y, dtype=np.float64))
        owned.append(y)
    try:
        res = cluster.run(_program, problem, X, y, int(iters), lr, w, reduce, start, prefix,
                          checkpoint_dir, checkpoint_every, meta, task_timeout, **run_kw)
    finally:
        for sa in owned:
            sa.release()

    server = res[0]
    failures = dict(getattr(res, "failures", {}) or {})
    n_workers = len(res) - 1
    if server is None:  # the server died: report how far the checkpoints got
        return GDResult(None, None, start, start, np.empty(0), n_workers, reduce,
                        failures=failures, run=res, completed=False)
    losses = np.concatenate([prefix, server["losses"]])
    return GDResult(server["w"], losses, start, int(iters), np.asarray(server["times"]), n_workers,
                    reduce, reexecuted=server["reexecuted"], failures=failures, run=res, completed=True)


def _prepare(problem, X, y, lr, w0, reduce, checkpoint_dir, resume):
    """Check the inputs; the step size, initial w and the checkpoint to resume from."""
    Xa, ya = np.asarray(X), np.asarray(y)
    if Xa.ndim != 2 or ya.ndim not in (1, 2) or len(ya) != len(Xa):
        raise ValueError(f"X must be (N, d) and y must have N rows; got {Xa.shape} and {ya.shape}")
    lr = default_lr(problem, Xa) if lr is None else float(lr)
    w = initial_w(ya, Xa.shape[1]) if w0 is None else np.array(w0, dtype=np.float64)
    meta = {"problem": problem.name, "reduce": reduce, "lr": lr, "shape": tuple(Xa.shape)}
    start, prefix = 0, np.empty(0)
    if resume:
        if checkpoint_dir is None:
            raise ValueError("resume=True needs a checkpoint_dir")
        found = ckpt.load(checkpoint_dir)
        if found is not None:
            w, start, prefix, saved_meta = found
            if saved_meta != repr(sorted(meta.items())):
                raise ValueError(f"the checkpoint in {checkpoint_dir} is for another job: {saved_meta}")
    return lr, w, meta, start, prefix


def _program(comm, problem, X, y, iters, lr, w, reduce, start, prefix, checkpoint_dir, checkpoint_every, meta,
             task_timeout=None):
    """The SPMD program: rank 0 serves, the others map."""
    if comm.size < 2:
        raise ValueError("MapReduce GD needs a server and at least one worker: Cluster(M + 1) with M >= 1")
    if comm.rank == 0:
        return _server(comm, len(X), iters, lr, w, reduce, start, prefix, checkpoint_dir, checkpoint_every, meta,
                       task_timeout)
    return _worker(comm, problem, X, y, reduce)


def _server(comm, n, iters, lr, w, reduce, start, prefix, checkpoint_dir, checkpoint_every, meta,
            task_timeout=None):
    from course_lib import PeerLost

    m = comm.size - 1
    counts = [hi - lo for lo, hi in shard_ranges(n, m)]
    shards_of = {r: [r - 1] for r in range(1, m + 1)}  # rank -> shards it maps
    losses, times, reexecuted = [], [], []
    for t in range(start, iters):
        t0 = comm.now()
        for r in sorted(shards_of):  # broadcast w (one send per live worker)
            try:
                comm.send(w, r, tag=TAG_W)
            except PeerLost:
                pass  # found dead again below, when its answer does not come
        results = [None] * m
        deadline = None if task_timeout is None else t0 + task_timeout
        for r in sorted(shards_of):  # gather, in rank order
            try:
                for k in shards_of[r]:
                    results[k] = _recv_by(comm, r, TAG_G, deadline)
            except (PeerLost, TimeoutError):
                pass
        _reexecute(comm, w, t, results, shards_of, reexecuted, task_timeout)
        label = "reduce + update"
        save = checkpoint_dir is not None and checkpoint_every and (t + 1) % checkpoint_every == 0
        with comm.compute(label + (" + checkpoint" if save else "")):
            w, loss = reduce_and_update(results, counts, reduce, w, lr)
            losses.append(loss)
            if save:
                ckpt.save(checkpoint_dir, w, t + 1, np.concatenate([prefix, losses]), meta)
        times.append(comm.now() - t0)
        comm.progress(t + 1, iters)  # a progress bar in the notebook cell
    for r in range(1, m + 1):  # also to a worker given up for silence: it may still be listening
        try:
            comm.send(np.empty(0), r, tag=TAG_STOP)  # 0 payload bytes: the traffic formula stays exact
        except PeerLost:
            pass
    return {"w": w, "losses": np.array(losses), "times": times, "reexecuted": reexecuted,
            "shards_of": {r: list(s) for r, s in shards_of.items()}}


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


def _worker(comm, problem, X, y, reduce):
    from course_lib import PeerLost, Status

    Xa, ya = np.asarray(X), np.asarray(y)
    n, m = len(Xa), comm.size - 1
    ranges = shard_ranges(n, m)
    mine = [comm.rank - 1]
    maps = 0
    status = Status()
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
        for k in ks:
            lo, hi = ranges[k]
            with comm.compute(f"map shard {k}{suffix}"):
                out = map_shard(problem, Xa[lo:hi], ya[lo:hi], w, reduce)  # views: no copy
                maps += 1
            try:
                comm.send(out, 0, tag=tag)
            except PeerLost:
                return {"shards": mine, "maps": maps, "server_lost": True}
