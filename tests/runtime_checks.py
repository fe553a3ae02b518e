"""Helpers shared by the runtime tests: leak and orphan checks."""
from __future__ import annotations

import os
import time

import psutil

from course_lib.runtime import shm

# Python's own long-lived helpers are not orphans of ours.
_HELPERS = ("resource_tracker", "forkserver")
# Children alive when the current test began (a module fixture's cluster, say): not the test's
# to clean up. conftest.py refreshes it before every test.
ALIVE_BEFORE_TEST: set[int] = set()


def children_now() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def worker_children() -> list[psutil.Process]:
    """Child processes started during the current test and still alive (zombies and Python's
    own helpers aside)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        if p.pid in ALIVE_BEFORE_TEST:
            continue
        try:
            cmd = " ".join(p.cmdline())
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if not any(h in cmd for h in _HELPERS):
            out.append(p)
    return out


def our_segments(pids=None) -> list[str]:
    """Segments created by this process and no longer owned, or by one of ``pids`` now dead.

    (A pid that is alive again belongs to another process: pids are reused, and other
    test runs on the machine create course segments too.)
    """
    pids = set(pids or [])
    out = []
    for name in shm.list_segments():
        pid = shm.creator_pid(name)
        if pid is None:
            continue
        mine_and_unowned = pid == os.getpid() and name not in shm._owned  # owned = still in use
        if mine_and_unowned or (pid in pids and not psutil.pid_exists(pid)):
            out.append(name)
    return out


def assert_clean(pids=(), within: float = 3.0) -> None:
    """No worker process alive and no segment of ours or of ``pids`` left."""
    deadline = time.time() + within
    while time.time() < deadline:
        if not worker_children() and not our_segments(pids):
            return
        time.sleep(0.05)
    assert not worker_children(), f"orphan processes: {[(p.pid, p.cmdline()) for p in worker_children()]}"
    assert not our_segments(pids), f"leaked segments: {our_segments(pids)}"


def _shm_maps(pid: int, name: str) -> list[str]:
    """The lines of /proc/<pid>/smaps about /dev/shm/<name> (each mapping and its counters)."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            lines = f.readlines()
    except (FileNotFoundError, ProcessLookupError):
        return []
    out, inside = [], False
    for line in lines:
        first = line.split(" ", 1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            inside = f"/dev/shm/{name}" in line
        if inside:
            out.append(line)
    return out


def mapped_by(pid: int, name: str) -> bool:
    """Whether process ``pid`` maps the /dev/shm file ``name`` (even after it was unlinked)."""
    return bool(_shm_maps(pid, name))


def shm_rss_kb(pid: int, name: str) -> int:
    """Resident kB of ``pid``'s mappings of /dev/shm/<name>: the memory that mapping holds."""
    return sum(int(line.split()[1]) for line in _shm_maps(pid, name) if line.startswith("Rss:"))


def semaphores_mapped_by(pid: int) -> list[str]:
    """Names of the multiprocessing semaphores in /dev/shm that ``pid`` maps (matched by inode)."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "/dev/shm/sem." in line:
                inodes.add(int(line.split()[4]))
    names = []
    for name in os.listdir(shm.SHM_DIR):
        try:
            if name.startswith(shm.SEM_PREFIX) and os.stat(os.path.join(shm.SHM_DIR, name)).st_ino in inodes:
                names.append(name)
        except FileNotFoundError:
            pass
    return sorted(names)


#: The runtime's promise: a worker that raises, dies or hangs is reported within this many seconds.
PROMISE_S = 2.0


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def assert_within_promise(failure_s: float, baseline_s: float, what: str) -> None:
    """A failure reported within :data:`PROMISE_S` of what the same work takes when nothing fails,
    both measured in the calling test: on a loaded machine the honest run slows down too, so the
    promise is about the failure path (how long the runtime takes to notice and say so), not about
    the machine's speed."""
    print(f"{what}: the failure after {failure_s:.2f} s, the same run without it {baseline_s:.2f} s")
    assert failure_s <= baseline_s + PROMISE_S, (
        f"{what}: reported after {failure_s:.2f} s, more than {PROMISE_S:g} s past the {baseline_s:.2f} s of the "
        "same run without the failure")


def failure_and_baseline(cluster, fn) -> tuple[str, float, float]:
    """(the WorkerError's text, seconds until it came, seconds of a run doing nothing) on ``cluster``:
    a failing run and its baseline, measured in the same test."""
    import pytest

    from course_lib import WorkerError

    baseline, _ = timed(cluster.run, _nothing)
    start = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        cluster.run(fn)
    return str(info.value), time.perf_counter() - start, baseline


def _nothing(comm):
    return None
