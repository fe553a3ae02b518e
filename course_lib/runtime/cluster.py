"""``Cluster``: real worker processes on this machine, wired by Pipes, run SPMD-style.

How the wiring works (and why):

* Each worker has one *control* Pipe to the launching process (tasks, results, barrier).
* Workers are wired to each other by duplex Pipes: the full mesh by default, or only the
  edges of a networkx graph. The Pipes are made *inside the workers* (each listens on a
  local socket, connects to its higher-ranked neighbours and accepts the lower ones), so
  no process ever holds every end: a 64-way full mesh needs 63 descriptors per worker,
  not 4032 in the parent (the default limit is 1024 on Linux, 256 on macOS).
* Failures are detected by watching the control Pipes *and* the process sentinels, so a
  worker that raises, is killed by a signal or hangs is reported with its rank within a
  fraction of a second, and every other worker is stopped: no orphans, no hangs.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Client, Listener
from multiprocessing.connection import wait as wait_for

import cloudpickle

from . import shm
from .comm import Comm, PeerLost
from .faults import as_fault, check_rank_map, check_slow
from .logs import LogRouter, setup_worker_logging
from .netem import Network
from .trace import Stats, Timeline

START_METHODS = ("fork", "spawn", "forkserver")
_RESERVED = ("network", "slow", "faults", "timeout", "on_failure")


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


class WorkerTimeout(WorkerError, TimeoutError):
    """The run did not finish within its timeout; ``ranks`` are those still running."""


class RunResult(list):
    """Results by rank (a list), plus ``stats``, ``timeline``, ``wall_time`` and ``failures``."""

    def __init__(self, results, stats: Stats, timeline: Timeline, wall_time: float, failures: dict):
        super().__init__(results)
        self.stats, self.timeline, self.wall_time, self.failures = stats, timeline, wall_time, failures


def default_start_method() -> str:
    env = os.environ.get("COURSE_START_METHOD")
    if env:
        if env not in START_METHODS:
            raise ValueError(f"COURSE_START_METHOD={env!r}; expected one of {START_METHODS}")
        return env
    return mp.get_start_method(allow_none=False)


def _normalise_graph(graph, n_workers):
    """Neighbour sets from a networkx graph whose nodes must be exactly 0..n-1."""
    if graph is None:
        return {r: set(range(n_workers)) - {r} for r in range(n_workers)}
    if not hasattr(graph, "nodes") or not hasattr(graph, "edges"):
        raise TypeError(f"graph must be a networkx graph, got {type(graph).__name__}")
    nodes = set(graph.nodes)
    if nodes != set(range(n_workers)):
        extra = sorted(map(repr, nodes - set(range(n_workers))))
        missing = sorted(set(range(n_workers)) - nodes)
        raise ValueError(
            f"graph nodes must be exactly the ranks 0..{n_workers - 1}; "
            f"missing {missing}, unexpected {extra[:10]} (use nx.convert_node_labels_to_integers)"
        )
    neigh = {r: set() for r in range(n_workers)}
    for u, v in graph.edges():
        if u != v:
            neigh[u].add(v)
            neigh[v].add(u)
    return neigh


class Cluster:
    """Start ``n_workers`` real processes; ``run(fn, ...)`` calls ``fn(comm, ...)`` on each.

    >>> with Cluster(4) as cluster:
    ...     res = cluster.run(lambda comm: comm.rank ** 2)
    >>> list(res)
    [0, 1, 4, 9]

    Parameters (each of network/slow/faults/timeout/on_failure can also be given per run):
      start_method: "fork" | "spawn" | "forkserver" (default: $COURSE_START_METHOD, else Python's default)
      graph: a networkx graph on nodes 0..n-1; Pipes exist only along its edges
      network: :class:`Network` to emulate latency and bandwidth
      slow: {rank: factor}, that rank's compute phases take ``factor`` times longer
      faults: {rank: Fault(kind, step)}, make that rank fail at a compute step
      timeout: seconds a run may take before :class:`WorkerTimeout`
      on_failure: "raise" (stop everything) or "continue" (record the failure, let the others finish)
      log_level: level of the worker loggers shown in the parent
    """

    def __init__(self, n_workers: int, start_method: str | None = None, graph=None, network: Network | None = None,
                 slow=None, faults=None, timeout: float | None = 120.0, on_failure: str = "raise",
                 log_level=logging.INFO, trace: bool = True):
        if isinstance(n_workers, bool) or not isinstance(n_workers, int):
            raise TypeError(f"n_workers must be an int, got {type(n_workers).__name__}")
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        start_method = start_method or default_start_method()
        if start_method not in START_METHODS:
            raise ValueError(f"unknown start_method {start_method!r}; expected one of {START_METHODS}")
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not available on this platform "
                             f"(available: {mp.get_all_start_methods()})")
        self.n_workers = n_workers
        self.start_method = start_method
        self._neighbors = _normalise_graph(graph, n_workers)
        self.graph = graph
        self._defaults = self._check_knobs(dict(network=network, slow=slow, faults=faults, timeout=timeout,
                                                on_failure=on_failure))
        self.log_level = log_level
        self.trace = trace
        self._ctx = mp.get_context(start_method)
        self._procs: list = []
        self._conns: list = []
        self._shared: list[shm.SharedArray] = []
        self._run_id = 0
        self._closed = False
        self._needs_restart = False
        self._logs = None
        shm.sweep()  # segments left behind by a kernel that was killed
        self._start()
        self._finalizer = weakref.finalize(self, Cluster._stop_workers, self._procs, self._conns)
        atexit.register(self._atexit_ref(), )

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
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if knobs["on_failure"] not in ("raise", "continue"):
            raise ValueError(f"on_failure must be 'raise' or 'continue', got {knobs['on_failure']!r}")
        return dict(network=network, slow=check_slow(knobs["slow"], self.n_workers), faults=faults,
                    timeout=timeout, on_failure=knobs["on_failure"])

    # -- lifecycle ------------------------------------------------------------
    def _start(self) -> None:
        t_start = time.perf_counter()
        self._logs = LogRouter(self._ctx, self.start_method)
        owner = os.getpid()
        for rank in range(self.n_workers):
            parent_end, child_end = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(
                target=_worker_entry,
                args=(rank, self.n_workers, child_end, self._logs.channel, owner, self.log_level),
                name=f"course-worker-{rank}", daemon=True,
            )
            proc.start()
            child_end.close()  # else the parent never sees EOF when this child dies
            self._procs.append(proc)
            self._conns.append(parent_end)
        try:
            self._wire_mesh(deadline=time.perf_counter() + 60)
        except BaseException:
            self._stop_workers(self._procs, self._conns)
            raise
        self.startup_time = time.perf_counter() - t_start

    def _wire_mesh(self, deadline: float) -> None:
        """Collect each worker's listening address, hand out neighbours' addresses, wait for 'wired'."""
        addresses = self._gather_control("address", deadline)
        for rank, conn in enumerate(self._conns):
            higher = {p: addresses[p] for p in self._neighbors[rank] if p > rank}
            lower = sorted(p for p in self._neighbors[rank] if p < rank)
            conn.send(("wire", higher, lower))
        self._gather_control("wired", deadline)

    def _gather_control(self, kind: str, deadline: float) -> list:
        out = [None] * self.n_workers
        waiting = set(range(self.n_workers))
        while waiting:
            conns = {self._conns[r]: r for r in waiting}
            sentinels = {self._procs[r].sentinel: r for r in waiting}
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise WorkerTimeout(f"workers {sorted(waiting)} did not start in time", min(waiting), waiting)
            for obj in wait_for(list(conns) + list(sentinels), timeout=min(remaining, 1.0)):
                rank = conns.get(obj, sentinels.get(obj))
                if rank not in waiting:
                    continue
                try:
                    msg = self._conns[rank].recv() if obj in conns else None
                except EOFError:
                    msg = None
                if msg is None or msg[0] == "error":
                    tb = msg[4] if msg else ""
                    self._procs[rank].join(1)
                    raise WorkerError(f"worker {rank} failed while starting (exit code "
                                      f"{self._procs[rank].exitcode})\n{tb}", rank, [rank], tb,
                                      self._procs[rank].exitcode)
                assert msg[0] == kind, msg
                out[rank] = msg[1] if len(msg) > 1 else None
                waiting.discard(rank)
        return out

    def close(self) -> None:
        """Stop every worker and free the shared memory this cluster created."""
        if self._closed:
            return
        self._closed = True
        pids = [p.pid for p in self._procs]
        self._stop_workers(self._procs, self._conns)
        for sa in self._shared:
            sa.release()
        self._shared.clear()
        if self._logs is not None:
            self._logs.close()
            self._logs = None
        _sweep_segments_of(pids)

    @staticmethod
    def _stop_workers(procs, conns, graceful: bool = True) -> None:
        """Ask politely (graceful), then SIGTERM, then SIGKILL; always reap and close."""
        if graceful:
            for conn in conns:
                try:
                    conn.send(("stop",))
                except Exception:
                    pass
            deadline = time.perf_counter() + 1.0
            for p in procs:
                p.join(max(0.0, deadline - time.perf_counter()))
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
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
        pids = [p.pid for p in self._procs]
        self._stop_workers(self._procs, self._conns, graceful=False)
        if self._logs is not None:
            self._logs.close(wait=0.3)
        _sweep_segments_of(pids)
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
        sa = shm.SharedArray.from_array(array)
        self._shared.append(sa)
        return sa

    # -- running --------------------------------------------------------------
    def run(self, fn, *args, **kwargs) -> RunResult:
        """Run ``fn(comm, *args, **kwargs)`` on every rank; return results by rank.

        The keywords network, slow, faults, timeout and on_failure override the
        cluster's settings for this run only.
        """
        if self._closed:
            raise RuntimeError("this Cluster is closed; create a new one")
        if not callable(fn):
            raise TypeError(f"run() needs a function fn(comm, ...), got {type(fn).__name__}")
        knobs = dict(self._defaults)
        knobs.update({k: kwargs.pop(k) for k in _RESERVED if k in kwargs})
        knobs = self._check_knobs(knobs)
        if self._needs_restart or not self._procs or any(not p.is_alive() for p in self._procs):
            self.restart()
            self._needs_restart = False
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise TypeError(f"cannot send fn and its arguments to the workers: {exc}") from exc
        self._run_id += 1
        t0 = time.perf_counter()
        config = (self._run_id, t0, knobs["network"], knobs["slow"], knobs["faults"], self.trace)
        for conn in self._conns:
            conn.send(("run", config))
            conn.send_bytes(payload)
        bar = _ProgressBar()
        try:
            return self._collect(t0, knobs, bar)
        except BaseException:
            # Some workers may be blocked on a peer that failed: stop them all now;
            # the next run() starts fresh ones.
            self._stop_workers(self._procs, self._conns, graceful=False)
            raise
        finally:
            bar.close()

    def _collect(self, t0: float, knobs: dict, bar: "_ProgressBar") -> RunResult:
        n = self.n_workers
        results, failures = [None] * n, {}
        stats, events = Stats(n), []
        running = set(range(n))
        at_barrier: set[int] = set()
        errors: list[WorkerError] = []
        deadline = None if knobs["timeout"] is None else t0 + knobs["timeout"]
        first_error_at = None
        progress: dict[int, tuple[int, int]] = {}  # rank -> (done, total) from comm.progress()
        while running:
            if errors and knobs["on_failure"] == "raise":
                # Give the others a moment to report, so the root cause can be named.
                if first_error_at is None:
                    first_error_at = time.perf_counter()
                elif time.perf_counter() - first_error_at > 0.3:
                    break
            now = time.perf_counter()
            if deadline is not None and now > deadline:
                stuck = sorted(running)
                raise WorkerTimeout(
                    f"run timed out after {knobs['timeout']} s; still running: ranks {stuck}"
                    + (f" (waiting at barrier: {sorted(at_barrier)})" if at_barrier else ""),
                    stuck[0], stuck)
            conns = {self._conns[r]: r for r in running}
            sentinels = {self._procs[r].sentinel: r for r in running}
            wait_s = 0.1 if errors else 0.5
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - now))
            for obj in wait_for(list(conns) + list(sentinels), timeout=wait_s):
                rank = conns.get(obj, sentinels.get(obj))
                if rank not in running:
                    continue
                msg = None
                if obj in conns or self._conns[rank].poll():
                    try:
                        msg = self._conns[rank].recv()
                    except (EOFError, OSError):
                        msg = None
                if msg is None:  # the process is gone
                    self._procs[rank].join(0.5)
                    err = self._death_error(rank)
                elif msg[0] == "progress":
                    progress[rank] = msg[2:]
                    bar.update(progress)
                    continue
                elif msg[0] == "barrier":
                    at_barrier.add(rank)
                    if at_barrier >= running:
                        for r in at_barrier:
                            self._conns[r].send(("barrier_go",))
                        at_barrier.clear()
                    continue
                elif msg[0] == "done":
                    _, run_id, result, wstats, wevents = msg
                    results[rank] = cloudpickle.loads(result)
                    stats.merge(wstats)
                    events.extend(wevents)
                    running.discard(rank)
                    continue
                else:  # ("error", run_id, exc_type, message, traceback, wstats, wevents)
                    _, run_id, exc_type, message, tb, wstats, wevents = msg
                    stats.merge(wstats)
                    events.extend(wevents)
                    err = WorkerError(f"rank {rank} raised {exc_type}: {message}\n\n"
                                      f"--- traceback from rank {rank} ---\n{tb}", rank, [rank], tb,
                                      exc_type=exc_type)
                running.discard(rank)
                at_barrier.discard(rank)
                errors.append(err)
                failures[rank] = err
                if knobs["on_failure"] == "continue" and at_barrier and at_barrier >= running:
                    for r in at_barrier:
                        self._conns[r].send(("barrier_go",))
                    at_barrier.clear()
        if errors and knobs["on_failure"] == "raise":
            raise _primary(errors)
        # A failed rank exits (or is dead): the next run needs fresh workers, even if the
        # process has not quite finished exiting yet.
        self._needs_restart = bool(errors)
        out = RunResult(results, stats, Timeline(events), time.perf_counter() - t0, failures)
        out.progress = progress
        return out

    def _death_error(self, rank: int) -> WorkerError:
        code = self._procs[rank].exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited unexpectedly with code {code}"
        return WorkerError(f"rank {rank} {how} (no Python traceback: the process vanished)", rank, [rank],
                           "", code, exc_type="ProcessDied")


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
    """The root cause: a rank that raised or died beats ranks that only lost a peer."""
    def secondary(e):
        return e.exc_type in ("PeerLost",)
    errors = sorted(errors, key=lambda e: (secondary(e), e.rank))
    first = errors[0]
    first.ranks = [e.rank for e in errors]
    if len(errors) > 1:
        others = ", ".join(f"rank {e.rank} ({e.exc_type})" for e in errors[1:])
        first.args = (first.args[0] + f"\n(also failed: {others})",)
    return first


def _sweep_segments_of(pids) -> None:
    """Unlink segments created by our (now dead) workers, e.g. after SIGKILL."""
    for name in shm.list_segments():
        try:
            pid = int(name[len(shm.PREFIX):].split("_")[0])
        except ValueError:
            continue
        if pid in pids:
            try:
                os.unlink(os.path.join(shm.SHM_DIR, name))
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------- worker side
def _watch_owner(owner_pid: int) -> None:
    """Exit if the launching process dies, so no worker outlives it."""
    import psutil

    while True:
        time.sleep(0.5)
        if not psutil.pid_exists(owner_pid):
            shm.release_all()
            os._exit(1)


def _connect_mesh(rank: int, control) -> dict:
    family = "AF_PIPE" if sys.platform == "win32" else "AF_UNIX"
    listener = Listener(family=family, backlog=128, authkey=mp.current_process().authkey)
    control.send(("address", listener.address))
    kind, higher, lower = control.recv()
    assert kind == "wire"
    links = {}
    for peer, address in sorted(higher.items()):
        conn = Client(address, family=family, authkey=mp.current_process().authkey)
        conn.send(rank)
        links[peer] = conn
    for _ in lower:
        conn = listener.accept()
        links[conn.recv()] = conn
    listener.close()
    control.send(("wired",))
    return links


def _worker_entry(rank, size, control, log_channel, owner_pid, log_level):
    """Main loop of a worker process: wire up, then run tasks until told to stop."""
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C / kernel interrupt
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    threading.Thread(target=_watch_owner, args=(owner_pid,), daemon=True).start()
    logger = setup_worker_logging(log_channel, rank, log_level)
    try:
        links = _connect_mesh(rank, control)
    except BaseException as exc:
        control.send(("error", 0, type(exc).__name__, str(exc), traceback.format_exc(), None, []))
        return
    comm = Comm(rank, size, links, control, logger)
    while True:
        try:
            msg = control.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "stop":
            break
        _, (run_id, t0, network, slow, faults, trace) = msg
        comm._begin_run(run_id, t0, network, slow, faults, trace)
        try:
            fn, args, kwargs = cloudpickle.loads(control.recv_bytes())
            result = cloudpickle.dumps(fn(comm, *args, **kwargs))
            reply = ("done", run_id, result, comm.stats, comm._tracer.events)
        except BaseException as exc:
            tb = traceback.format_exc()
            reply = ("error", run_id, type(exc).__name__, str(exc), tb, comm.stats, comm._tracer.events)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            control.send(reply)
        except (BrokenPipeError, OSError):
            break
        if reply[0] == "error":
            # Exit, closing every Pipe: peers blocked on this rank get PeerLost instead of
            # waiting for ever (under on_failure="continue"); the next run() starts a new worker.
            break
    sys.stdout.flush()
    shm.release_all()


def _on_sigterm(signum, frame):
    shm.release_all()
    os._exit(128 + signum)
