"""``Cluster``: real worker processes on this machine, wired by Pipes, run SPMD-style.

How the wiring works (and why):

* Each worker has one *control* Pipe to the launching process (tasks, results, barrier).
  What travels on it are the small message classes of :mod:`.control` (``StartRun``, ...);
  the worker's side of it is :mod:`.worker`.
* Workers are wired to each other by duplex Pipes: the full mesh by default, or only the
  edges of an undirected networkx graph. The Pipes are made *inside the workers* (each
  listens on a local socket, connects to its higher-ranked neighbours and accepts the
  lower ones), so no process ever holds every end: a 64-way full mesh needs 63
  descriptors per worker, not 4032 in the parent (the default limit is 1024 on Linux,
  256 on macOS). Before starting, the cluster checks that the limit is high enough.
* Failures are detected by watching the control Pipes *and* the process sentinels, so a
  worker that raises, is killed by a signal or hangs is reported with its rank within a
  fraction of a second, and every other worker is stopped: no orphans, no hangs.
  Stopping is done for all workers at once, with one short grace period in total, so a
  worker stuck in a long C call (which cannot run its SIGTERM handler) costs a fraction
  of a second, not a second per worker.
* Ctrl-C is held back only while a process is being started or stopped (a few
  milliseconds), so it never leaves a started worker unrecorded; anywhere else it stops
  every worker and raises ``KeyboardInterrupt`` at once.
"""
from __future__ import annotations

import atexit
import errno
import functools
import inspect
import logging
import multiprocessing as mp
import numbers
import operator
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.connection import wait as wait_for

import cloudpickle

from . import registry, shm
from .constants import RUN_TIMEOUT_S, WIRE_UP_TIMEOUT_S
from .control import (
    BarrierArrived,
    BarrierFailed,
    BarrierRelease,
    DropSegments,
    Listening,
    Progress,
    RunDone,
    RunFailed,
    StartFailed,
    StartRun,
    Stop,
    Wired,
    WireUp,
)
from .faults import as_fault, check_rank_map, check_slow
from .logs import LogEnd, LogLine, show
from .netem import Network
from .trace import Stats, Timeline
from .worker import safe_str, worker_main

START_METHODS = ("fork", "spawn", "forkserver")
RUN_OPTIONS = ("network", "slow", "faults", "timeout", "on_failure")   # Cluster.run's own keywords


class _ClusterSetting:
    """The default of each of ``Cluster.run``'s options: the cluster's own setting (None is a value)."""

    def __repr__(self) -> str:
        return "<the cluster's>"   # how help(cluster.run) shows the default


CLUSTER_SETTING = _ClusterSetting()
_STOP_GRACE_S = 1.0       # a polite Stop(): workers finish their loop and release what they own
_TERMINATE_GRACE_S = 0.3  # after SIGTERM, for all workers together; then SIGKILL
_REPORT_WINDOW_S = 0.3    # after a first failure, how long other ranks may still report theirs
_FDS_BASE = 40            # descriptors a worker or the parent holds besides its Pipes (python, numpy)
_LOG_DRAIN_S = 1.0        # reading the lines that stopped workers left in their Pipes, all together


class WorkerError(RuntimeError):
    """A worker raised, died or hung. ``rank`` is the first culprit, ``ranks`` all of them."""

    def __init__(self, message: str, rank: int, ranks=None, remote_traceback: str = "", exitcode=None,
                 exc_type: str = ""):
        super().__init__(message)
        self.rank = rank
        self.ranks = list(ranks) if ranks is not None else [rank]
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.exc_type = exc_type
        self.others: list = []       # the other ranks' errors of the same run, in arrival order

    def __reduce__(self):
        # BaseException pickles only ``args``; the rank and the traceback must survive the trip too.
        return type(self), (self.args[0], self.rank, self.ranks, self.remote_traceback, self.exitcode, self.exc_type)


class WorkerTimeout(WorkerError, TimeoutError):
    """The run did not finish within its timeout; ``ranks`` are those still running."""


class RunResult(list):
    """Results by rank (a list), plus ``stats``, ``timeline``, ``wall_time`` and ``failures``."""

    def __init__(self, results, stats: Stats, timeline: Timeline, wall_time: float, failures: dict):
        super().__init__(results)
        self.stats, self.timeline, self.wall_time, self.failures = stats, timeline, wall_time, failures


# ------------------------------------------------------------ checks of the arguments
def default_start_method() -> str:
    """How worker processes start: COURSE_START_METHOD if set, else the platform's default."""
    env = os.environ.get("COURSE_START_METHOD")
    if env:
        if env not in START_METHODS:
            raise ValueError(f"COURSE_START_METHOD={env!r}; expected one of {START_METHODS}")
        return env
    return mp.get_start_method(allow_none=False)


def _check_n_workers(n_workers) -> int:
    """An int, or anything that *is* one (np.int64 from np.arange); never a bool or a float."""
    if isinstance(n_workers, bool):
        raise TypeError("n_workers must be an int, got bool")
    try:
        n = operator.index(n_workers)
    except TypeError:
        raise TypeError(f"n_workers must be an int, got {type(n_workers).__name__}") from None
    if n < 1:
        raise ValueError(f"n_workers must be >= 1, got {n}")
    return n


def _check_start_method(start_method) -> str:
    if start_method is None:
        return default_start_method()
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}; expected one of {START_METHODS} "
                         f"(or None for the default)")
    if start_method not in mp.get_all_start_methods():
        raise ValueError(f"start_method {start_method!r} is not available on this platform "
                         f"(available: {mp.get_all_start_methods()})")
    return start_method


def _as_rank(node):
    try:
        return operator.index(node) if not isinstance(node, bool) else node
    except TypeError:
        return node


def _normalise_graph(graph, n_workers):
    """Neighbour sets (of plain ints) from an undirected networkx graph on nodes 0..n-1."""
    if graph is None:
        return {r: set(range(n_workers)) - {r} for r in range(n_workers)}
    if not hasattr(graph, "nodes") or not hasattr(graph, "edges"):
        raise TypeError(f"graph must be a networkx graph, got {type(graph).__name__}")
    if getattr(graph, "is_directed", lambda: False)():
        raise ValueError(
            "graph is directed, but the links between workers are duplex Pipes: along an edge "
            "both ends can send and receive. Say so deliberately with graph=G.to_undirected() "
            "(an edge in either direction becomes one two-way link)")
    nodes = {_as_rank(v) for v in graph.nodes}
    if nodes != set(range(n_workers)):
        extra = sorted(map(repr, nodes - set(range(n_workers))))
        missing = sorted(set(range(n_workers)) - nodes)
        raise ValueError(
            f"graph nodes must be exactly the ranks 0..{n_workers - 1}; "
            f"missing {missing}, unexpected {extra[:10]} (use nx.convert_node_labels_to_integers)"
        )
    neigh = {r: set() for r in range(n_workers)}
    for u, v in graph.edges():
        u, v = _as_rank(u), _as_rank(v)
        if u != v:
            neigh[u].add(v)
            neigh[v].add(u)
    return neigh


def _check_descriptor_budget(neighbors: dict, start_method: str) -> None:
    """Refuse to start when the open-file limit cannot hold the Pipes (instead of failing mid-way)."""
    try:
        import resource
    except ImportError:  # Windows: no RLIMIT_NOFILE
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = len(neighbors)
    degree = max((len(p) for p in neighbors.values()), default=0)
    need = max(degree + _FDS_BASE, 2 * n + _FDS_BASE)  # a worker's links; the parent's Pipes + sentinels
    if soft != resource.RLIM_INFINITY and need > soft:
        raise OSError(errno.EMFILE, _descriptor_advice(n, degree, soft, hard, need))
    server_soft = _fork_server_limit() if start_method == "forkserver" else None
    server_need = max(n, degree) + _FDS_BASE  # it holds one descriptor per living worker
    if server_soft is not None and server_need > server_soft:
        raise OSError(errno.EMFILE, _descriptor_advice(n, degree, server_soft, hard, server_need)
                      + _forkserver_limit_note(start_method))


def _fork_server_limit() -> int | None:
    """The soft RLIMIT_NOFILE of the running fork server (its workers inherit it), if any."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return None
    try:
        import psutil

        soft, _ = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)
    except Exception:  # gone, or a platform without rlimit: the start itself will tell
        return None
    return None if soft < 0 else soft


def _descriptor_advice(n: int, degree: int, soft: int, hard: int, need: int | None = None) -> str:
    from_need = f"needs about {need} open files per process, but" if need else "ran out of open files:"
    suggest = max(4096, need or 0)
    raise_it = (f"raise the limit: `ulimit -n {suggest}` in the shell that starts Jupyter, or in Python "
                f"before creating the Cluster: resource.setrlimit(resource.RLIMIT_NOFILE, ({suggest}, "
                f"{'resource.RLIM_INFINITY' if hard < 0 else hard}))")
    if 0 <= hard < suggest:
        raise_it = (f"the hard limit is {hard}, so only an administrator can raise it (`ulimit -Hn`)")
    return (f"Cluster({n}) {from_need} this process may open only {soft} file descriptors "
            f"(RLIMIT_NOFILE; each worker holds one Pipe per neighbour, {degree} here, and the "
            f"parent two per worker). To fix it, {raise_it}; or use fewer workers or a sparser "
            f"graph (Cluster(n, graph=G)).")


@contextmanager
def _interrupts_deferred():
    """Hold Ctrl-C (SIGINT) back until the block ends, then deliver it.

    Used around starting or stopping one process: an interrupt half-way through
    ``Process.start()`` would leave a child running that no list knows about.
    Only the main thread receives KeyboardInterrupt, so other threads need no deferral.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


class Cluster:
    """Start ``n_workers`` real processes; ``run(fn, ...)`` calls ``fn(comm, ...)`` on each.

    >>> with Cluster(4) as cluster:
    ...     res = cluster.run(lambda comm: comm.rank ** 2)
    >>> list(res)
    [0, 1, 4, 9]

    Parameters (each of network/slow/faults/timeout/on_failure can also be given per run):
      start_method: "fork" | "spawn" | "forkserver" (default: $COURSE_START_METHOD, else Python's default)
      graph: an undirected networkx graph on nodes 0..n-1; Pipes exist only along its edges
        (a directed graph is refused: Pipes are two-way; pass ``G.to_undirected()``)
      network: :class:`Network` to emulate latency and bandwidth
      slow: {rank: factor}, that rank's compute phases take ``factor`` times longer
      faults: {rank: Fault(kind, step)}, make that rank fail at a compute step
      timeout: seconds a run may take before :class:`WorkerTimeout`
      on_failure: "raise" (stop everything) or "continue" (record the failure, let the others finish)
      log_level: level of the worker loggers shown in the parent
    """

    def __init__(self, n_workers: int, start_method: str | None = None, graph=None, network: Network | None = None,
                 slow=None, faults=None, timeout: float | None = RUN_TIMEOUT_S, on_failure: str = "raise",
                 log_level=logging.INFO, trace: bool = True):
        self.n_workers = _check_n_workers(n_workers)
        self.start_method = _check_start_method(start_method)
        self._neighbors = _normalise_graph(graph, self.n_workers)
        self.graph = graph
        self._defaults = self._check_knobs(dict(network=network, slow=slow, faults=faults, timeout=timeout,
                                                on_failure=on_failure))
        self.log_level = log_level
        self.trace = trace
        _check_descriptor_budget(self._neighbors, self.start_method)
        self._ctx = mp.get_context(self.start_method)
        self._procs: list = []
        self._conns: list = []
        self._all_pids: set[int] = set()     # every worker ever started, to sweep what they leave
        self._shared: list[shm.SharedArray] = []
        self._released: list[str] = []       # segments released in the parent, not yet dropped by workers
        self._control_lock = threading.Lock()  # held by run(): no other message may interleave
        self._run_id = 0
        self._closed = False
        self._needs_restart = False
        shm.sweep()  # segments left behind by a kernel that was killed
        self._start()
        # A Cluster dropped without close() stops its workers and closes every channel when
        # collected: nothing here may refer to ``self``, or it would never be collected.
        self._finalizer = weakref.finalize(self, Cluster._stop_workers, self._procs, self._conns)
        shm.add_release_listener(self._on_segment_released)
        atexit.register(self._atexit_ref())

    def _atexit_ref(self):
        ref = weakref.ref(self)

        def close():
            obj = ref()
            if obj is not None:
                obj.close()
        return close

    # -- knobs ----------------------------------------------------------------
    def _check_knobs(self, knobs: dict) -> dict:
        network = knobs["network"] if knobs["network"] is not None else Network()
        if not isinstance(network, Network):
            raise TypeError(f"network must be a course_lib.Network, got {type(network).__name__}")
        faults = {r: as_fault(f) for r, f in check_rank_map(knobs["faults"], self.n_workers, "faults").items()}
        timeout = knobs["timeout"]
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
                                    or not timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if knobs["on_failure"] not in ("raise", "continue"):
            raise ValueError(f"on_failure must be 'raise' or 'continue', got {knobs['on_failure']!r}")
        return dict(network=network, slow=check_slow(knobs["slow"], self.n_workers), faults=faults,
                    timeout=None if timeout is None else float(timeout), on_failure=knobs["on_failure"])

    # -- lifecycle ------------------------------------------------------------
    def _start(self) -> None:
        t_start = time.perf_counter()
        # Started here, not lazily inside the first worker's start: a process that appears
        # during that start is then always a worker (a Ctrl-C test tells them apart so).
        resource_tracker.ensure_running()
        try:
            for rank in range(self.n_workers):
                with _interrupts_deferred():
                    self._launch(rank)
            self._wire_mesh(deadline=time.perf_counter() + WIRE_UP_TIMEOUT_S)
        except BaseException as exc:
            with _interrupts_deferred():
                self._stop_workers(self._procs, self._conns, graceful=False)
                _sweep_segments_of(self._all_pids)
            if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
                raise OSError(errno.EMFILE, self._fd_advice()) from exc
            raise
        self.startup_time = time.perf_counter() - t_start

    def _launch(self, rank: int) -> None:
        """Start the worker of ``rank`` and record it (call with interrupts deferred)."""
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        # A forked child inherits the parent's ends of its own and its elder siblings' Pipes:
        # hand them over so it closes them (63 wasted descriptors per worker at n=64 otherwise).
        inherited = None
        if self.start_method == "fork":
            inherited = ([*self._conns, parent_end], [p.sentinel for p in self._procs])
        proc = self._ctx.Process(
            target=worker_main, args=(rank, self.n_workers, child_end, self.log_level, inherited),
            name=f"course-worker-{rank}", daemon=True,
        )
        try:
            proc.start()
        finally:
            child_end.close()  # else the parent never sees EOF when this child dies
        self._procs.append(proc)
        self._conns.append(parent_end)
        self._all_pids.add(proc.pid)

    def _fd_advice(self) -> str:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        degree = max(len(p) for p in self._neighbors.values())
        return _descriptor_advice(self.n_workers, degree, soft, hard)

    def _wire_mesh(self, deadline: float) -> None:
        """Collect each worker's listening address, hand out neighbours' addresses, wait until wired."""
        addresses = [m.address for m in self._gather_control(Listening, deadline)]
        for rank, conn in enumerate(self._conns):
            higher = {p: addresses[p] for p in self._neighbors[rank] if p > rank}
            lower = sorted(p for p in self._neighbors[rank] if p < rank)
            conn.send(WireUp(higher, lower))
        self._gather_control(Wired, deadline)

    def _gather_control(self, expected: type, deadline: float) -> list:
        out = [None] * self.n_workers
        waiting = set(range(self.n_workers))
        while waiting:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise WorkerTimeout(f"workers {sorted(waiting)} did not start in time", min(waiting), waiting)
            for rank, msg in self._ready_messages(waiting, min(remaining, 1.0)):
                if not isinstance(msg, expected):
                    raise self._start_error(rank, msg)
                out[rank] = msg
                waiting.discard(rank)
        return out

    def _start_error(self, rank: int, msg) -> Exception:
        if not isinstance(msg, StartFailed):
            self._procs[rank].join(0.5)  # its exit code, for the report
            return self._death_error(rank, while_starting=True)
        if msg.errno == errno.EMFILE:
            return OSError(errno.EMFILE, f"worker {rank} failed while starting: {msg.message}\n"
                                         + self._fd_advice() + _forkserver_limit_note(self.start_method))
        return WorkerError(f"worker {rank} failed while starting: {msg.exc_type}: {msg.message}\n\n"
                           f"--- traceback from rank {rank} ---\n{msg.traceback}", rank, [rank],
                           msg.traceback, exc_type=msg.exc_type)

    def _ready_messages(self, ranks, timeout: float):
        """Wait (at most ``timeout`` s) on the control Pipes and the process sentinels of ``ranks``.

        Yields ``(rank, message)``; the message is ``None`` when the process is gone.
        One ``wait()`` on every descriptor at once: the delay does not grow with n. The
        workers' log lines, which travel on the same Pipes, are shown here as they arrive.
        """
        conns = {self._conns[r]: r for r in ranks}
        sentinels = {self._procs[r].sentinel: r for r in ranks}
        seen = set()
        for obj in wait_for(list(conns) + list(sentinels), timeout=timeout):
            rank = conns.get(obj, sentinels.get(obj))
            if rank in seen:
                continue
            seen.add(rank)
            msg = _next_control_message(rank, self._conns[rank])
            if msg is _ONLY_LOG_LINES and obj in sentinels:
                msg = None  # it exited, and nothing but lines was left in its Pipe
            if msg is not _ONLY_LOG_LINES:
                yield rank, msg

    def close(self) -> None:
        """Stop every worker and free the shared memory this cluster created."""
        if self._closed:
            return
        self._closed = True
        with _interrupts_deferred():
            self._stop_workers(self._procs, self._conns)
            for sa in self._shared:
                sa.release()
            self._shared.clear()
            _sweep_segments_of(self._all_pids)

    @staticmethod
    def _stop_workers(procs, conns, graceful: bool = True) -> None:
        """Ask politely (graceful), then SIGTERM, then SIGKILL; always reap and close.

        Each step addresses every worker at once and waits for all of them together, so
        stopping 64 workers stuck in C code takes about a second, not a second each. The
        workers' lines are read all along (a worker blocked on a full Pipe could not exit)
        and to the end once the workers are gone: no line they sent is lost.
        """
        if graceful:
            for conn in conns:
                try:
                    conn.send(Stop())
                except Exception:
                    pass
            _wait_for_exits(procs, _STOP_GRACE_S, conns)
        for p in _alive(procs):
            p.terminate()
        _wait_for_exits(procs, _TERMINATE_GRACE_S, conns)
        for p in _alive(procs):
            p.kill()
        _wait_for_exits(procs, 5.0, conns)
        _show_last_lines(conns, _LOG_DRAIN_S)
        for conn in conns:
            conn.close()
        for p in procs:
            try:
                p.close()
            except ValueError:
                pass
        procs.clear()
        conns.clear()

    def restart(self) -> None:
        """Replace every worker by a fresh one (used after a failed run)."""
        with _interrupts_deferred():
            self._stop_workers(self._procs, self._conns, graceful=False)
            _sweep_segments_of(self._all_pids)
            self._released.clear()  # new workers have mapped nothing yet
        self._start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else "running"
        return f"Cluster(n_workers={self.n_workers}, start_method={self.start_method!r}, {state})"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- shared memory --------------------------------------------------------
    def share(self, array) -> shm.SharedArray:
        """Copy ``array`` into shared memory owned by this cluster (freed on close)."""
        if self._closed:
            raise RuntimeError("this Cluster is closed: share() would make shared memory that nothing "
                               "frees; create a new Cluster, or use SharedArray.from_array(array)")
        sa = shm.SharedArray.from_array(array)
        self._shared.append(sa)
        return sa

    def _on_segment_released(self, name: str) -> None:
        """The parent released a segment: workers must unmap it too, or its memory stays in use.

        Told now if no run is going on (a message between runs is safe), else with the next run.
        Never blocks: this may be called by the garbage collector in the middle of a run.
        """
        self._released.append(name)
        if self._closed or not self._control_lock.acquire(blocking=False):
            return
        try:
            names, self._released[:] = tuple(self._released), []
            for conn in self._conns:
                try:
                    conn.send(DropSegments(names))
                except OSError:
                    self._needs_restart = True  # a dead worker: the next run replaces it
        finally:
            self._control_lock.release()

    # -- running --------------------------------------------------------------
    def run(self, fn, /, *args, network: Network | None = CLUSTER_SETTING, slow: dict | None = CLUSTER_SETTING,
            faults: dict | None = CLUSTER_SETTING, timeout: float | None = CLUSTER_SETTING,
            on_failure: str = CLUSTER_SETTING, **kwargs) -> RunResult:
        """Run ``fn(comm, *args, **kwargs)`` on every rank; return results by rank.

        The run's own options, keyword-only, override the cluster's setting for this run only
        (left out: the cluster's, as given to :class:`Cluster`):
          network: :class:`Network` to emulate latency and bandwidth (None: no emulation)
          slow: {rank: factor}, that rank's compute phases take ``factor`` times longer
          faults: {rank: Fault(kind, step)}, make that rank fail at a compute step
          timeout: seconds the run may take before :class:`WorkerTimeout` (None: no limit)
          on_failure: "raise" (stop everything) or "continue" (record the failure, let the others finish)

        These five are never passed to ``fn``; every other keyword is. A ``fn`` that takes
        ``**kwargs`` gets none of them: given here, they are the run's. A ``fn`` with a parameter
        of one of these names, given by keyword here, is refused with a TypeError before the run
        starts, as the keyword could be meant for either: rename the parameter, or bind its value
        with ``functools.partial(fn, timeout=...)`` (a keyword the partial binds is the function's).
        Where ``fn``'s signature cannot be read (some builtins), nothing is checked.
        """
        if self._closed:
            raise RuntimeError("this Cluster is closed; create a new one")
        if not callable(fn):
            raise TypeError(f"run() needs a function fn(comm, ...), got {type(fn).__name__}")
        options = dict(network=network, slow=slow, faults=faults, timeout=timeout, on_failure=on_failure)
        given = {name: value for name, value in options.items() if value is not CLUSTER_SETTING}
        collisions = sorted(set(given) & _keyword_parameters(fn, n_positional=1 + len(args)))
        if collisions:
            raise TypeError(_collision_message(fn, collisions))
        knobs = self._check_knobs({**self._defaults, **given})
        try:
            # with the modules that registered algorithms here, which a spawned worker imports first
            payload = cloudpickle.dumps((registry.providers(), fn, args, kwargs))
        except Exception as exc:
            raise TypeError(f"cannot send fn and its arguments to the workers: {exc}") from exc
        with self._control_lock:
            if self._needs_restart or not self._procs or any(not p.is_alive() for p in self._procs):
                self.restart()
                self._needs_restart = False
            return self._run_locked(payload, knobs)

    def _run_locked(self, payload: bytes, knobs: dict) -> RunResult:
        self._run_id += 1
        t0 = time.perf_counter()
        dropped, self._released[:] = tuple(self._released), []
        start = StartRun(self._run_id, t0, knobs["network"], knobs["slow"], knobs["faults"], self.trace, dropped)
        bar = _ProgressBar()
        try:
            for conn in self._conns:
                conn.send(start)
                conn.send_bytes(payload)
            return self._collect(_RunState(self.n_workers, t0, knobs), bar)
        except BaseException:
            # Some workers may be blocked on a peer that failed: stop them all now;
            # the next run() starts fresh ones.
            with _interrupts_deferred():
                self._stop_workers(self._procs, self._conns, graceful=False)
                _sweep_segments_of(self._all_pids)
            raise
        finally:
            bar.close()

    def _collect(self, state: "_RunState", bar: "_ProgressBar") -> RunResult:
        """Serve barriers and progress, gather results and failures until every rank is done."""
        while state.running and not state.failure_reported():
            self._check_deadline(state)
            for rank, msg in self._ready_messages(state.running, state.wait_s()):
                if rank in state.running:
                    self._handle(state, rank, msg, bar)
        if state.errors and state.on_failure == "raise":
            raise _primary(state.errors)
        # A failed rank exits (or is dead): the next run needs fresh workers, even if the
        # process has not quite finished exiting yet.
        self._needs_restart = bool(state.errors)
        out = RunResult(state.results, state.stats, Timeline(state.events), time.perf_counter() - state.t0,
                        state.failures)
        out.progress = state.progress
        return out

    def _check_deadline(self, state: "_RunState") -> None:
        if state.deadline is None or time.perf_counter() <= state.deadline:
            return
        stuck = sorted(state.running)
        at_barrier = f" (waiting at barrier: {sorted(state.at_barrier)})" if state.at_barrier else ""
        raise WorkerTimeout(f"run timed out after {state.timeout} s; still running: ranks {stuck}{at_barrier}",
                            stuck[0], stuck)

    def _handle(self, state: "_RunState", rank: int, msg, bar: "_ProgressBar") -> None:
        if isinstance(msg, Progress):
            state.progress[rank] = (msg.done, msg.total)
            bar.update(state.progress)
        elif isinstance(msg, BarrierArrived):
            state.at_barrier.add(rank)
            self._serve_barrier(state)
        elif isinstance(msg, RunDone):
            state.stats.merge(msg.stats)
            state.events.extend(msg.events)
            state.returned.add(rank)  # even if its result cannot be loaded: it will call no barrier
            try:
                state.results[rank] = cloudpickle.loads(msg.result)
                state.running.discard(rank)
            except Exception as exc:
                self._fail(state, rank, _unloadable_result_error(rank, msg, exc))
            self._serve_barrier(state)
        elif isinstance(msg, RunFailed):
            state.stats.merge(msg.stats)
            state.events.extend(msg.events)
            self._fail(state, rank, _raised_error(rank, msg))
        else:  # None: the process is gone (or sent something unknown)
            self._procs[rank].join(0.5)
            self._fail(state, rank, self._death_error(rank))

    def _fail(self, state: "_RunState", rank: int, err: WorkerError) -> None:
        state.running.discard(rank)
        state.at_barrier.discard(rank)
        state.errors.append(err)
        state.failures[rank] = err
        if state.first_error_at is None:
            state.first_error_at = time.perf_counter()
        if state.on_failure == "continue":
            self._serve_barrier(state)

    def _serve_barrier(self, state: "_RunState") -> None:
        """Answer the ranks waiting at the barrier once the answer is known: BarrierFailed as soon as
        a rank's function has returned in this run (it will never arrive, whether it returned before
        or after the others came), BarrierRelease once every running rank is there. Ranks that
        raised are not waited for under on_failure="continue" (they are no longer running)."""
        if not state.at_barrier:
            return
        if state.returned:
            reply = BarrierFailed(tuple(sorted(state.returned)))
        elif state.at_barrier >= state.running:
            reply = BarrierRelease()
        else:
            return
        for r in state.at_barrier:
            self._conns[r].send(reply)
        state.at_barrier.clear()

    def _death_error(self, rank: int, while_starting: bool = False) -> WorkerError:
        code = self._procs[rank].exitcode
        what = f"worker {rank} failed while starting: it" if while_starting else f"rank {rank}"
        hint = _main_guard_hint(self.start_method) if while_starting else ""
        return WorkerError(f"{what} {_describe_exit(code)} (no Python traceback: the process vanished){hint}",
                           rank, [rank], "", code, exc_type="ProcessDied")


def _keyword_parameters(fn, n_positional: int) -> set[str]:
    """The names ``fn`` would take from a keyword argument, once ``n_positional`` arguments (the
    communicator, then ``*args``) have filled its first positional parameters: not ``**kwargs``,
    not a positional-only parameter, not a keyword a ``functools.partial`` already binds (its
    value is the function's). Empty when the signature cannot be read (some builtins)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return set()
    bound: set[str] = set()
    inner = fn
    while isinstance(inner, functools.partial):
        bound.update(inner.keywords)
        inner = inner.func
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_keyword = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return by_keyword - bound - set(positional[:n_positional])


def _collision_message(fn, names: list[str]) -> str:
    """Why run() refuses: which of its options ``fn`` also takes, and the two ways out."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    label = getattr(inner, "__qualname__", None) or type(inner).__name__
    quoted = ", ".join(f"`{n}`" for n in names)
    first = names[0]
    return (f"{quoted}: an option of Cluster.run (its own keywords: {', '.join(RUN_OPTIONS)}) and also a "
            f"parameter of the worker function {label}, so run() cannot tell which one {first}=... is meant "
            f"for (it never passes its options to the function). Rename the function's parameter, or bind "
            f"the function's value with functools.partial({label}, {first}=...) and pass the partial to run(); "
            f"a {first} for the run itself then stays a keyword of run().")


class _RunState:
    """What the parent knows about one run while it collects it."""

    def __init__(self, n: int, t0: float, knobs: dict):
        self.t0 = t0
        self.timeout = knobs["timeout"]
        self.on_failure = knobs["on_failure"]
        self.deadline = None if self.timeout is None else t0 + self.timeout
        self.results: list = [None] * n
        self.failures: dict[int, WorkerError] = {}
        self.errors: list[WorkerError] = []
        self.first_error_at: float | None = None
        self.stats, self.events = Stats(n), []
        self.running = set(range(n))
        self.at_barrier: set[int] = set()
        self.returned: set[int] = set()  # ranks whose function returned: a barrier can no longer complete
        self.progress: dict[int, tuple[int, int]] = {}  # rank -> (done, total) from comm.progress()

    def failure_reported(self) -> bool:
        """Under on_failure="raise", stop collecting a moment after the first failure.

        The moment lets the other ranks report, so the root cause can be named.
        """
        return (self.on_failure == "raise" and self.first_error_at is not None
                and time.perf_counter() - self.first_error_at > _REPORT_WINDOW_S)

    def wait_s(self) -> float:
        wait = 0.1 if self.errors else 0.5
        if self.deadline is not None:
            wait = max(0.0, min(wait, self.deadline - time.perf_counter()))
        return wait


def _raised_error(rank: int, msg: RunFailed) -> WorkerError:
    return WorkerError(f"rank {rank} raised {msg.exc_type}: {msg.message}\n\n"
                       f"--- traceback from rank {rank} ---\n{msg.traceback}", rank, [rank], msg.traceback,
                       exc_type=msg.exc_type)


def _unloadable_result_error(rank: int, msg: RunDone, exc: Exception) -> WorkerError:
    detail = f"{type(exc).__name__}: {safe_str(exc)}"
    return WorkerError(f"rank {rank} returned a {msg.result_type} that the parent cannot unpickle ({detail}). "
                       "Return plain data (numbers, strings, numpy arrays, lists, dicts) from the worker "
                       "function.", rank, [rank], traceback.format_exc(), exc_type="UnpicklableResult")


# What usually sends these signals: named in the report, so a student knows where to look.
_SIGNAL_CAUSES = {
    "SIGKILL": "nothing can catch SIGKILL: the kernel's out-of-memory killer (see `dmesg`) or a user's "
               "`kill -9`",
    "SIGTERM": "something outside the course runtime asked it to stop: a user's `kill`/`pkill`, a job "
               "scheduler or container shutdown (the out-of-memory killer sends SIGKILL, not SIGTERM)",
    "SIGSEGV": "a crash in C code, e.g. a numpy array made over freed memory",
    "SIGBUS": "access to shared memory that is gone or full (/dev/shm out of space?)",
}


def _describe_exit(code) -> str:
    """"was terminated by SIGTERM (...likely cause...)" rather than a bare exit code."""
    if code is None:
        return "is gone (exit code not known yet)"
    signum = -code if code < 0 else (code - 128 if 128 < code < 160 else None)
    try:
        name = signal.Signals(signum).name if signum else None
    except ValueError:
        name = None
    if name is None:
        return f"exited unexpectedly with code {code}"
    how = (f"was terminated by {name}" if code < 0
           else f"exited with code {code} (= 128 + {name}: it received {name} and exited)")
    cause = _SIGNAL_CAUSES.get(name)
    return how + (f"; likely cause: {cause}" if cause else "")


def _main_guard_hint(start_method: str) -> str:
    """Why a worker started from a script can die before it reports: the script has no guard.

    Under spawn and forkserver a new process imports the script that started it (as
    ``__mp_main__``), so code at its top level runs again there: a Cluster created there
    makes the new process start workers of its own, which multiprocessing refuses. Its
    error goes to the terminal's stderr, not to this process, hence the hint here.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if start_method == "fork" or not path or not str(path).endswith(".py"):
        return ""
    return (f"\nUnder {start_method}, every worker first imports the script that created the Cluster "
            f"({path}), so its top-level code runs again in each worker. Put the code that creates and "
            "runs the Cluster under `if __name__ == \"__main__\":` (see the worker's own error on stderr).")


def _forkserver_limit_note(start_method: str) -> str:
    if start_method != "forkserver":
        return ""
    return ("\n(Under forkserver, the fork server and its workers keep the limit that was in force when "
            "it started, with the first forkserver Cluster of this kernel: after raising the limit, "
            "restart the kernel so a new fork server starts with it.)")


class _ProgressBar:
    """A tqdm bar (a widget in Jupyter) over the steps that workers report with comm.progress().

    Only runs still going after ``delay`` seconds get a bar, so quick runs stay quiet; the
    bar stays in the output when the run ends (a closed widget would leave a dead output).
    """

    def __init__(self, delay: float = 1.0):
        self._bar = None
        self._start = time.perf_counter()
        self._delay = delay

    def update(self, progress: dict) -> None:
        done = sum(d for d, _ in progress.values())
        total = sum(t for _, t in progress.values())
        if self._bar is None:
            if time.perf_counter() - self._start < self._delay:
                return
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc="steps", unit="step", leave=True)
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _primary(errors: list[WorkerError]) -> WorkerError:
    """The root cause: a rank that raised or died beats ranks that only lost a peer, and among
    those the first the parent heard of (``errors`` is in arrival order): a server that gives up
    because its workers raised fails after them, and the workers' error is the one to read."""
    def secondary(e):
        # Death by SIGPIPE: it wrote to a Pipe whose reader had gone, i.e. it lost a peer too
        # (workers ignore SIGPIPE, but a run's code may have set it back to the default).
        return e.exc_type == "PeerLost" or (e.exc_type == "ProcessDied" and _died_of_sigpipe(e.exitcode))
    errors = sorted(errors, key=secondary)          # stable: arrival order within each kind
    first = errors[0]
    first.ranks = [e.rank for e in errors]
    first.others = errors[1:]
    if len(errors) > 1:
        others = ", ".join(f"rank {e.rank} ({e.exc_type})" for e in errors[1:])
        first.args = (first.args[0] + f"\n(also failed: {others})",)
    return first


def _died_of_sigpipe(exitcode) -> bool:
    sigpipe = getattr(signal, "SIGPIPE", None)
    return sigpipe is not None and exitcode in (-sigpipe, 128 + sigpipe)


def _alive(procs) -> list:
    return [p for p in procs if p.pid is not None and p.exitcode is None]


def _wait_for_exits(procs, timeout: float, conns=()) -> None:
    """Wait until every process in ``procs`` has exited, or ``timeout`` s in all; reap them.

    Meanwhile show the lines that arrive on the control Pipes ``conns`` (by rank) of
    workers that are stopping; their other messages no longer matter.
    """
    deadline = time.perf_counter() + timeout
    open_conns = {conn: rank for rank, conn in enumerate(conns) if not conn.closed}
    while True:
        alive = _alive(procs)  # .exitcode reaps a process that has exited
        remaining = deadline - time.perf_counter()
        if not alive or remaining <= 0:
            return
        for ready in wait_for([p.sentinel for p in alive] + list(open_conns), timeout=min(remaining, 0.1)):
            if ready in open_conns and _next_control_message(open_conns[ready], ready) is None:
                del open_conns[ready]  # at its end: nothing more will come


_ONLY_LOG_LINES = object()  # what _next_control_message returns when only lines were waiting


def _next_control_message(rank: int, conn):
    """The next message on a worker's control Pipe, after showing the log lines ahead of it.

    Returns ``_ONLY_LOG_LINES`` when nothing else is waiting yet, None at the end of the
    Pipe or at the marker ``LogEnd`` (the worker is gone or going). Reads what is there
    without waiting for more.
    """
    while True:
        try:
            if not conn.poll():
                return _ONLY_LOG_LINES
            msg = conn.recv()
        except (EOFError, OSError):
            return None
        if isinstance(msg, LogEnd):
            return None
        if not isinstance(msg, LogLine):
            return msg
        show(rank, msg)


def _show_last_lines(conns, timeout: float) -> None:
    """Show the lines left in the control Pipes of workers that have exited, up to each end."""
    deadline = time.perf_counter() + timeout
    for rank, conn in enumerate(conns):
        while not conn.closed and time.perf_counter() < deadline:
            if _next_control_message(rank, conn) in (None, _ONLY_LOG_LINES):
                break  # the marker, the end, or nothing more now (a grandchild may hold its end)


def _sweep_segments_of(pids) -> None:
    """Unlink segments created by our (now dead) workers, e.g. after SIGKILL."""
    for name in shm.list_segments():
        if shm.creator_pid(name) in pids:
            try:
                os.unlink(os.path.join(shm.SHM_DIR, name))
            except FileNotFoundError:
                pass
