"""Jobs that share a machine: gang scheduling against uncoordinated time sharing.

A cluster is shared by many users (the course's source notes, Hao Zhang's *Intro to Distributed
Deep Learning Systems*, on resource management: "clusters are usually shared by many users; how do
we allocate resources to satisfy everyone while maximising utilisation?"). A synchronous
data-parallel job is a *gang*: every step ends with a collective (an allreduce, a barrier),
so a step takes as long as its slowest worker. Two ways to share cores between such jobs:

* **uncoordinated**: the operating system time-shares all processes independently. A worker
  may reach the collective while its partner is descheduled behind another job's process;
  it then waits, and if it waits by *polling* (as MPI and NCCL do, because a wake-up through
  the kernel costs more than a short wait) it burns the very core its partner needs.
* **gang scheduling** (co-scheduling, Ousterhout 1982; Feitelson & Rudolph 1992): the
  scheduler runs all workers of one job at once, in time slices, and pauses all of them
  together. A worker then never waits for a partner that is off the CPU.

Cluster managers apply the same rule at admission: a gang scheduler (Kubernetes' Volcano or
coscheduling plugin, YARN's gang scheduling, Slurm allocating all nodes of a job together)
starts a job only when all its workers can start. Otherwise a job whose workers start at
different times holds the cores of its first workers while they wait at the first collective
for the last one, and a worker that polls burns them.

Here the jobs are real :class:`~course_lib.Cluster` s and the gang scheduler is real: a thread
of the parent that pauses and resumes the workers' processes with SIGSTOP / SIGCONT
(:attr:`Cluster.pids`), one job per slice. A worker's compute is a fixed amount of work (not
a fixed time), so losing the core makes it take longer, as it would on a real node.

A job run "alone" is alone among these jobs only. On a machine where other processes run, its
two workers compete with them, each on its own core, and at a step one often waits at the
allreduce for a partner that is off its core. The gang scheduler resumes both workers of a job
with SIGCONT at the same instant, and a fair-share scheduler tends to run a process that was
paused ahead of those that kept running, so within a slice the two run together: it
co-schedules the job against the rest of the machine too. That is how, on a busy machine, two
gang-scheduled jobs can finish before the same two jobs run alone one after the other (measured
here under a load of about 20 on 2 cores, 2 x 60 steps of 2 ms: blocking workers 1.45 s
gang-scheduled against 2.15 s alone, the median wait per step 3.9 ms against 14.0 ms).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..reference.ex07 import next_group  # question ex07_4
from ..runtime import Cluster

__all__ = ["JobSpec", "JobRun", "GangScheduler", "sync_job", "calibrate_work", "run_jobs", "pin_ranks", "POLICIES"]

POLICIES = ("alone", "uncoordinated", "gang")
WAITS = ("spin", "block")


@dataclass(frozen=True)
class JobSpec:
    """A synchronous data-parallel job: ``steps`` steps of ``work`` units of compute, each
    followed by an allreduce of a small gradient; ``wait`` is how a worker waits for the
    others' messages ("spin": poll without giving up the core, like MPI and NCCL; "block":
    sleep in the kernel until a message arrives). ``start_delays[r]`` seconds pass before rank r
    begins (a worker placed later than the others); empty means all start together."""
    steps: int
    work: int
    wait: str = "spin"
    start_delays: tuple[float, ...] = ()

    def __post_init__(self):
        if self.wait not in WAITS:
            raise ValueError(f"wait must be one of {WAITS}, got {self.wait!r}")
        if self.steps < 1 or self.work < 1:
            raise ValueError("a job needs at least one step and one unit of work")


@dataclass
class JobRun:
    """What one job's workers recorded, on the machine-wide clock (``time.perf_counter``).

    ``arrive[r, k]``: rank r finished its compute of step k and reached the allreduce;
    ``done[r, k]``: the allreduce of step k returned on rank r; ``cpu_wait[r, k]``: CPU seconds
    rank r used between the two (a spinning worker burns the core while it waits)."""
    name: str
    spec: JobSpec
    launched: float                    # when the parent started the run
    begin: np.ndarray                  # [r]: rank r's first step began (after its start delay)
    arrive: np.ndarray                 # [r, k]
    done: np.ndarray                   # [r, k]
    cpu_wait: np.ndarray               # [r, k]
    messages: np.ndarray               # [src, dst]: messages the job's workers sent each other
    results: list = field(default_factory=list, repr=False)
    reported: float = float("nan")     # when the parent got the results (a gang scheduler then skips the job)

    @property
    def step_ends(self) -> np.ndarray:
        """When step k was over for the whole job: its last rank's allreduce returned."""
        return self.done.max(axis=0)

    @property
    def step_times(self) -> np.ndarray:
        """Seconds per step, the first measured from the first worker's start."""
        return np.diff(np.concatenate([[self.begin.min()], self.step_ends]))

    @property
    def elapsed(self) -> float:
        """Seconds from the run's launch to the job's last step."""
        return float(self.step_ends[-1] - self.launched)

    @property
    def first_begin(self) -> float:
        """When the job's first worker began its first step (after the run was dispatched)."""
        return float(self.begin.min())

    @property
    def last_end(self) -> float:
        return float(self.step_ends[-1])

    @property
    def wait(self) -> np.ndarray:
        """[r, k]: wall seconds rank r spent in the allreduce of step k."""
        return self.done - self.arrive

    def step_waits(self, slices=(), group: int | None = None) -> np.ndarray:
        """Per step, the longer wait of the ranks in its allreduce: how long the first rank to
        arrive waited for the last (plus the messages). With the gang scheduler's ``slices`` and
        this job's ``group``, only the steps that began and ended inside one of its slices: a
        step cut by a pause measures the pause, not the partner."""
        waits = self.wait.max(axis=0)
        if group is None:
            return waits
        mine = [(a, b) for g, a, b in slices if g == group]
        first, last = self.arrive.min(axis=0), self.done.max(axis=0)
        keep = [any(a <= f and t <= b for a, b in mine) for f, t in zip(first, last)]
        return waits[np.array(keep, dtype=bool)]

    def in_slices(self, slices, group: int, slack: float = 2e-3) -> float:
        """Share of this job's step ends that fell inside the gang scheduler's slices of ``group``
        (``slack`` seconds after a slice still count: SIGSTOP takes effect a little later)."""
        mine = [(a, b + slack) for g, a, b in slices if g == group]
        ends = self.step_ends
        inside = sum(any(a <= t <= b for a, b in mine) for t in ends)
        return inside / len(ends)

    def wasted_cpu(self) -> float:
        """CPU seconds all ranks burned inside allreduces (spinning, not computing)."""
        return float(self.cpu_wait.sum())


# -- the job's program ---------------------------------------------------------------------------
def compute(work: int) -> float:
    """``work`` units of busy computation (about 20 us each on a laptop core): fixed work,
    so a worker that loses its core takes longer, as on a real node."""
    x = 0.0
    for _ in range(work):
        for i in range(400):
            x += i * 0.5
    return x


def calibrate_work(seconds: float, repeats: int = 5) -> int:
    """Units of :func:`compute` that take about ``seconds`` on one free core (best of ``repeats``)."""
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        compute(50)
        best = min(best, time.perf_counter() - t0)
    return max(1, round(seconds / (best / 50)))


def _allreduce(comm, grad: np.ndarray, wait: str) -> np.ndarray:
    """Sum ``grad`` over the job's ranks by sending it to every other rank (p is small).
    With ``wait="spin"`` a rank polls for each message (iprobe in a loop, never yielding the
    core); with "block" it sleeps in recv until the message is there."""
    others = [r for r in range(comm.size) if r != comm.rank]
    for r in others:
        comm.send(grad, dest=r)
    total = grad.copy()
    for r in others:
        if wait == "spin":
            while not comm.iprobe(source=r):
                pass
        total += comm.recv(source=r)
    return total


def sync_job(comm, spec: JobSpec) -> dict:
    """The SPMD program of one worker: ``spec.steps`` steps of compute then allreduce.

    Returns its clock readings (machine-wide ``time.perf_counter``) and the CPU time it used
    inside each allreduce (``time.process_time``)."""
    delay = spec.start_delays[comm.rank] if spec.start_delays else 0.0
    if delay:
        time.sleep(delay)             # this worker was placed later than the others
    begin = time.perf_counter()
    arrive, done, cpu_wait = [], [], []
    grad = np.full(64, float(comm.rank))   # this rank's gradient; the allreduce averages it
    for _ in range(spec.steps):
        compute(spec.work)                  # the step's forward and backward pass
        arrive.append(time.perf_counter())
        cpu0 = time.process_time()
        grad = _allreduce(comm, grad, spec.wait) / comm.size
        cpu_wait.append(time.process_time() - cpu0)
        done.append(time.perf_counter())
    return {"begin": begin, "arrive": arrive, "done": done, "cpu_wait": cpu_wait, "pid": os.getpid(),
            "grad": grad}


# -- the gang scheduler ----------------------------------------------------------------------------
class GangScheduler:
    """Run one group of processes at a time, in turn, for ``slice_s`` seconds each: the others
    are paused with SIGSTOP and resumed with SIGCONT (Ousterhout's co-scheduling, 1982).

    ``rule(current, finished, n_groups)`` names the group of the next slice (None: every job is
    over); by default round robin over the groups whose job is not finished
    (:func:`course_lib.reference.ex07.next_group`, question ex07_4), so a finished job's slices
    go to the others. ``slices`` records (group, start, end) on the ``time.perf_counter`` clock,
    ``finished_at`` when each group's job was reported over. Use as a context manager: on exit
    every process is resumed (and an error of the rule is raised there)."""

    def __init__(self, groups: list[list[int]], slice_s: float = 0.02, rule=None):
        self.groups = [list(g) for g in groups]
        self.slice_s = slice_s
        self.rule = rule if rule is not None else next_group
        self.finished_at: dict[int, float] = {}
        self.slices: list[tuple[int, float, float]] = []
        self.running: int | None = None          # the group resumed at the last switch
        self.switches = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def finished(self) -> frozenset[int]:
        return frozenset(self.finished_at)

    def _signal(self, group: int, sig) -> None:
        for pid in self.groups[group]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _next(self, current: int | None) -> int | None:
        group = self.rule(current, self.finished, len(self.groups))
        if group is not None and (isinstance(group, bool) or group not in range(len(self.groups))):
            raise ValueError(f"the scheduling rule chose group {group!r}; there are {len(self.groups)} groups")
        return group

    def _loop(self) -> None:
        """Switch groups every ``slice_s``. A slice is timed from the moment the other groups
        have been sent SIGSTOP to the moment its own group is (so slices tile the run, and a
        step that ends in a slice ended while its group had the cores). When the rule names no
        group, or fails, every group is resumed so that the jobs can end; an error is kept for
        :meth:`stop`."""
        current, since = None, 0.0
        try:
            while not self._stop.is_set():
                group = self._next(current)
                if group is None:
                    break
                for other in range(len(self.groups)):
                    if other != group and other not in self.finished_at:
                        self._signal(other, signal.SIGSTOP)
                now = time.perf_counter()
                if current is not None:
                    self.slices.append((current, since, now))
                self._signal(group, signal.SIGCONT)
                current, since = group, now
                self.running, self.switches = group, self.switches + 1
                self._stop.wait(self.slice_s)
        except BaseException as exc:    # noqa: BLE001  (re-raised by stop())
            self.error = exc
        if current is not None:
            self.slices.append((current, since, time.perf_counter()))
        for g in range(len(self.groups)):   # no slice left to give: no process stays paused
            self._signal(g, signal.SIGCONT)

    def start(self) -> None:
        for g in range(1, len(self.groups)):       # only group 0 may run before the first slice
            self._signal(g, signal.SIGSTOP)
        self._thread.start()

    def finish(self, group: int) -> None:
        """Group ``group``'s job is over: from the next switch on, the rule gives its slices to the others."""
        self.finished_at.setdefault(group, time.perf_counter())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for g in range(len(self.groups)):
            self._signal(g, signal.SIGCONT)
        if self.error is not None:
            raise self.error

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


# -- running jobs side by side -----------------------------------------------------------------------
def _job_run(name: str, spec: JobSpec, launched: float, res, reported: float) -> JobRun:
    rows = list(res)
    return JobRun(name, spec, launched,
                  begin=np.array([r["begin"] for r in rows]),
                  arrive=np.array([r["arrive"] for r in rows]),
                  done=np.array([r["done"] for r in rows]),
                  cpu_wait=np.array([r["cpu_wait"] for r in rows]),
                  messages=np.asarray(res.stats.messages), results=rows, reported=reported)


def pin_ranks(pids: list[int]) -> None:
    """Bind rank r to core r mod (usable cores), as ``mpiexec -bind-to core`` does: every job
    then has one worker per core, like one worker per node, and each core's scheduler decides
    alone which job's worker runs on it."""
    cores = sorted(os.sched_getaffinity(0))
    for rank, pid in enumerate(pids):
        os.sched_setaffinity(pid, {cores[rank % len(cores)]})


def run_jobs(specs: dict[str, JobSpec], policy: str, workers: int = 2, slice_s: float = 0.02,
             pin: bool = True, rule=None, timeout: float | None = None) -> tuple[dict[str, JobRun], list]:
    """Run the jobs ``specs`` (name -> spec), each on its own Cluster of ``workers`` processes.

    ``policy``: "alone" runs them one after the other (each has the cores to itself among these
    jobs; other processes on the machine still compete for them);
    "uncoordinated" runs them at once and lets the OS interleave every process; "gang" runs
    them at once under a :class:`GangScheduler` with ``slice_s`` time slices. Returns the
    jobs' records and the gang scheduler's slices (empty unless "gang"). With ``pin`` (Linux),
    rank r of every job is bound to core r mod cores (:func:`pin_ranks`). ``rule``: the gang
    scheduler's choice of the next group (see :class:`GangScheduler`); ``timeout``: seconds a
    job may take (None: the runtime's default)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    names = list(specs)
    knobs = {} if timeout is None else {"timeout": timeout}
    clusters = [Cluster(workers, **knobs) for _ in names]
    try:
        if pin and hasattr(os, "sched_setaffinity"):
            for cluster in clusters:
                pin_ranks(cluster.pids)
        if policy == "alone":
            out = {}
            for name, cluster in zip(names, clusters):
                launched = time.perf_counter()
                res = cluster.run(sync_job, specs[name])
                out[name] = _job_run(name, specs[name], launched, res, time.perf_counter())
            return out, []
        return _run_together(names, specs, clusters, policy, slice_s, rule)
    finally:
        for cluster in clusters:
            cluster.close()


def _run_together(names, specs, clusters, policy, slice_s, rule=None):
    gang = GangScheduler([c.pids for c in clusters], slice_s, rule) if policy == "gang" else None
    results: dict[str, object] = {}
    reported: dict[str, float] = {}
    errors: list[BaseException] = []

    def run(i: int, name: str) -> None:
        try:
            results[name] = clusters[i].run(sync_job, specs[name])
        except BaseException as exc:      # re-raised in the caller's thread
            errors.append(exc)
        finally:
            reported[name] = time.perf_counter()
            if gang is not None:
                gang.finish(i)

    threads = [threading.Thread(target=run, args=(i, name)) for i, name in enumerate(names)]
    launched = time.perf_counter()
    if gang is not None:
        gang.start()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if gang is not None:
            gang.stop()
    if errors:
        raise errors[0]
    runs = {name: _job_run(name, specs[name], launched, results[name], reported[name]) for name in names}
    return runs, (gang.slices if gang is not None else [])
