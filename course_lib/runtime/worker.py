"""The worker side of a ``Cluster``: wire up to the neighbours, then run what the parent sends.

Each worker process runs :func:`worker_main`: it connects its Pipes to its neighbours
(:func:`_connect_mesh`), then answers the parent's control messages (:mod:`.control`) until
told to stop. A run's result travels back pickled; what cannot be pickled, a failing
``__str__`` or a segment the worker made itself are reported by name instead of lost.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Client, Listener

import cloudpickle

from . import mpi_names, registry, shm
from .comm import Comm
from .control import DropSegments, Listening, RunDone, RunFailed, StartFailed, StartRun, Stop, Wired, WireUp
from .logs import ControlPipe, WorkerOutput, exit_when_parent_leaves, setup_worker_logging


def safe_str(exc: BaseException) -> str:
    """str(exc), even for an exception whose __str__ itself raises."""
    try:
        return str(exc)
    except BaseException as inner:
        return f"<str() of this {type(exc).__name__} raised {type(inner).__name__}>"


class UnpicklableResult(TypeError):
    """The worker function returned something that cannot travel to the parent."""


def _close_inherited(inherited) -> None:
    """Under fork: close the parent's ends of the elder siblings' Pipes and their sentinels.

    """
    if inherited is None:
        return
    conns, sentinels = inherited
    for conn in conns:
        conn.close()
    for fd in sentinels:
        try:
            os.close(fd)
        except OSError:
            pass


def _listen_address(family: str):
    """Where a worker listens for its peers. On Linux, a name in the abstract socket namespace: no
    file, so nothing to clean up and no length limit from the temporary folder (a socket path has
    at most 107 bytes, which a long TMPDIR, such as a test's, exceeded). Peers still prove they know
    the authkey. Elsewhere multiprocessing's default, a file in the temporary folder."""
    if family == "AF_UNIX" and sys.platform.startswith("linux"):
        return "\0course-" + secrets.token_hex(12)
    return None


def _connect_mesh(rank: int, control) -> dict:
    family = "AF_PIPE" if sys.platform == "win32" else "AF_UNIX"
    listener = Listener(_listen_address(family), family=family, backlog=128, authkey=mp.current_process().authkey)
    control.send(Listening(listener.address))
    wiring = control.recv()
    assert isinstance(wiring, WireUp), wiring
    links = {}
    for peer, address in sorted(wiring.higher.items()):
        conn = Client(address, family=family, authkey=mp.current_process().authkey)
        conn.send(rank)
        links[peer] = conn
    for _ in wiring.lower:
        conn = listener.accept()
        links[conn.recv()] = conn
    listener.close()
    control.send(Wired())
    return links


def worker_main(rank, size, control, log_level, inherited=None):
    """Main loop of a worker process: wire up, then run tasks until told to stop."""
    _set_signals()
    _close_inherited(inherited)
    threading.Thread(target=exit_when_parent_leaves, args=(shm.release_all,), name="course-parent-watch",
                     daemon=True).start()
    control = ControlPipe(control)  # print() from any thread sends on it too
    logger, output = setup_worker_logging(control, rank, log_level)
    try:
        links = _connect_mesh(rank, control)
    except BaseException as exc:
        output.flush()
        control.send(StartFailed(type(exc).__name__, safe_str(exc), traceback.format_exc(),
                                 getattr(exc, "errno", None)))
        return
    comm = Comm(rank, size, links, control, logger)
    mpi_names.bind_world(comm)      # MPI.COMM_WORLD and MPI.COMM_SELF, for code written for mpi4py
    _serve(comm, control, output)
    output.end()  # stopping: its last lines, then the marker, before this process exits
    shm.release_all()


def _set_signals() -> None:
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C / kernel interrupt
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    if hasattr(signal, "SIGPIPE"):
        # A write to a closed Pipe or socket raises BrokenPipeError (with a traceback the report
        # can show) instead of killing the worker silently. A forked worker would otherwise
        # inherit the parent's SIG_DFL (scripts piped into `head` often set it).
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _serve(comm: Comm, control, output: WorkerOutput) -> None:
    """Answer the parent's messages until Stop, a closed Pipe, or a failed run."""
    while True:
        try:
            msg = control.recv()
        except (EOFError, OSError):
            return
        if isinstance(msg, Stop):
            return
        if isinstance(msg, DropSegments):
            shm.detach(msg.names)
            continue
        shm.detach(msg.drop_segments)
        output.install()  # the previous run may have replaced or closed sys.stdout
        reply = _run_task(comm, control, msg)
        output.flush()  # every line of the run goes ahead of its result
        try:
            control.send(reply)
        except (BrokenPipeError, OSError):
            return
        if isinstance(reply, RunFailed):
            # Exit, closing every Pipe: peers blocked on this rank get PeerLost instead of
            # waiting for ever (under on_failure="continue"); the next run() starts a new worker.
            return


def _run_task(comm: Comm, control, start: StartRun):
    comm._begin_run(start.run_id, start.t0, start.network, start.slow, start.faults, start.trace)
    try:
        providers, fn, args, kwargs = cloudpickle.loads(control.recv_bytes())
        registry.import_providers(providers)   # the algorithms the launcher can name (registry.py)
        value = fn(comm, *args, **kwargs)
        unfinished = comm._end_nonblocking()
        if unfinished:
            raise RuntimeError(f"rank {comm.rank}: the function returned with {unfinished} non-blocking "
                               "collective(s) still in progress; wait() for every request before returning")
        return RunDone(start.run_id, _pickle_result(value), type_name(value), comm.stats, comm._tracer.events)
    except BaseException as exc:
        comm._end_nonblocking(failed=True)
        # format_exc never calls a failing __str__ twice: it prints "<exception str() failed>"
        return RunFailed(start.run_id, type(exc).__name__, safe_str(exc), traceback.format_exc(),
                         comm.stats, comm._tracer.events)


def _pickle_result(value) -> bytes:
    try:
        with shm.returning_to_parent():
            return cloudpickle.dumps(value)
    except shm.SharedArrayOwnershipError:
        raise
    except Exception as exc:
        where = _find_unpicklable(value, "the result")
        raise UnpicklableResult(
            f"the worker function returned a {type_name(value)}, which cannot be pickled to travel to "
            f"the parent: {where or 'it'} ({safe_str(exc)}). Return plain data (numbers, strings, "
            f"numpy arrays, lists, dicts) instead.") from exc


def _find_unpicklable(value, path: str, depth: int = 0) -> str | None:
    """Where inside ``value`` the first unpicklable object is, e.g. "the result['model'] (a _thread.lock)"."""
    if depth > 4:
        return None
    if isinstance(value, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        children = [(f"{path}.{k}", v) for k, v in getattr(value, "__dict__", {}).items()]
    for child_path, child in children:
        try:
            cloudpickle.dumps(child)
        except Exception:
            return _find_unpicklable(child, child_path, depth + 1) or f"{child_path} (a {type_name(child)})"
    return None


def type_name(value) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _on_sigterm(signum, frame):
    """Free what this worker owns, then die *by* SIGTERM, so the parent can say so."""
    shm.release_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached where the signal is delivered at once
