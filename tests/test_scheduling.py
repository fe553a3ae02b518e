"""course_lib.beyond_one_machine.gang_scheduling: synchronous jobs on real processes, the gang
scheduler's SIGSTOP/SIGCONT slices, and the records lesson 07 draws (step ends, waits, CPU burned
while waiting).

Checked on processes: the allreduce of each step gives the mean of the ranks' vectors (against
the value computed here), every step sends one message per ordered pair of ranks (counted by the
runtime), the gang scheduler keeps one group running and the other stopped, and under it a job's
steps end inside its own slices. Timing only with wide margins (the machine is shared).
"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from course_lib.beyond_one_machine import GangScheduler, JobSpec, calibrate_work, run_jobs
from course_lib.beyond_one_machine.gang_scheduling import compute


def test_job_spec_is_validated():
    with pytest.raises(ValueError, match="wait"):
        JobSpec(steps=1, work=1, wait="sleep")
    with pytest.raises(ValueError, match="at least one"):
        JobSpec(steps=0, work=1)
    with pytest.raises(ValueError, match="policy"):
        run_jobs({"A": JobSpec(1, 1)}, "fifo")


@pytest.mark.parametrize("wait", ["spin", "block"])
def test_a_job_alone_reduces_every_step_and_sends_one_message_per_pair(wait):
    steps = 7
    runs, slices = run_jobs({"A": JobSpec(steps=steps, work=5, wait=wait)}, "alone", workers=3)
    job = runs["A"]
    assert slices == []
    # the mean of the ranks' vectors (0, 1, 2) after the first step, and it stays there
    for row in job.results:
        assert np.allclose(row["grad"], 1.0)
    assert len({row["pid"] for row in job.results}) == 3
    # each step: every rank sends its vector to each other rank, once
    want = np.full((3, 3), steps)
    np.fill_diagonal(want, 0)
    assert np.array_equal(job.messages, want)
    # records: shapes, order, and a step ends only when every rank is done
    assert job.arrive.shape == job.done.shape == job.cpu_wait.shape == (3, steps)
    assert (job.done >= job.arrive).all() and (np.diff(job.step_ends) > 0).all()
    assert (job.arrive[:, 1:] >= job.done[:, :-1]).all()
    assert job.step_times.sum() == pytest.approx(job.step_ends[-1] - job.begin.min())
    assert job.elapsed >= job.step_ends[-1] - job.begin.min()


def test_a_late_worker_keeps_the_first_one_waiting_at_the_first_collective():
    delay = 0.25
    runs, _ = run_jobs({"late": JobSpec(steps=3, work=5, wait="block", start_delays=(0.0, delay))}, "alone")
    job = runs["late"]
    assert job.begin[1] - job.begin[0] >= 0.9 * delay
    assert job.wait[0, 0] >= 0.8 * delay          # rank 0 held its core for the late rank
    assert job.wait[1, 0] < job.wait[0, 0] / 2


def test_calibrated_work_takes_about_the_asked_time():
    work = calibrate_work(2e-3)
    t0 = time.process_time()
    compute(work * 10)
    cpu = time.process_time() - t0
    assert 0.005 < cpu < 0.2                       # 20 ms asked; CPU time, so load only slows it a little


def _busy_processes(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _cpu(pids):
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def test_gang_scheduler_runs_one_group_at_a_time_and_resumes_all():
    """Four busy processes in two groups: while one group's slice lasts, the other's CPU time
    does not grow (a stopped process cannot run, however loaded the machine); at the end every
    process is resumed."""
    procs = _busy_processes(4)
    try:
        groups = [[procs[0].pid, procs[1].pid], [procs[2].pid, procs[3].pid]]
        checked = 0
        with GangScheduler(groups, slice_s=0.2) as gang:
            deadline = time.perf_counter() + 2.0
            while time.perf_counter() < deadline:
                switches, running = gang.switches, gang.running
                if running is None:
                    time.sleep(0.005)
                    continue
                time.sleep(0.01)                 # let the stop take effect
                idle = groups[1 - running]
                before = _cpu(idle)
                time.sleep(0.08)
                after = _cpu(idle)
                if gang.switches == switches:    # still the same slice: the idle group did not run
                    # (CPU times tick in 10 ms: at most a tick per process, against 80 ms each if running)
                    assert after - before <= 0.021, (running, after - before)
                    checked += 1
            assert checked >= 3
        assert [g for g, _, _ in gang.slices[:4]] == [0, 1, 0, 1]
        assert all(end - start >= 0.19 for _, start, end in gang.slices[:-1])   # stop() cuts the last
        assert all(psutil.Process(p.pid).status() != psutil.STATUS_STOPPED for p in procs)
        t0 = _cpu(groups[0] + groups[1])
        time.sleep(0.1)
        assert _cpu(groups[0] + groups[1]) > t0   # resumed: they run again
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_under_gang_scheduling_each_jobs_steps_end_inside_its_own_slices():
    spec = JobSpec(steps=30, work=calibrate_work(2e-3), wait="block")
    runs, slices = run_jobs({"A": spec, "B": spec}, "gang", slice_s=0.03)
    assert {g for g, _, _ in slices} == {0, 1}
    for group, name in enumerate(("A", "B")):
        # every step ends in its own job's slice, or within 2 ms after it (SIGSTOP takes effect late)
        assert runs[name].in_slices(slices, group) > 0.9, name
        # the steps kept by step_waits lie inside one slice; most steps are
        job = runs[name]
        inside = job.step_waits(slices, group)
        assert 0.5 * spec.steps <= len(inside) <= spec.steps and (inside >= 0).all()
        assert len(job.step_waits(slices, 1 - group)) <= 2          # at most steps finishing in the slack
        assert np.array_equal(job.step_waits(), job.wait.max(axis=0))
        for row in runs[name].results:
            assert np.allclose(row["grad"], 0.5)


# -- how busy the machine is, before a measurement (lesson 07's verdicts read it) ---------------------
def test_busy_cores_counts_the_usable_cpus_not_idle_during_the_window(tmp_path, monkeypatch):
    """From two /proc/stat snapshots: per usable CPU, 1 - idle / total of the ticks in between
    (idle and iowait count as idle); CPUs this process may not use are left out."""
    import os

    from course_lib.beyond_one_machine import machine_load

    def stat(ticks):       # cpu number -> (user, idle, iowait)
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{c} {u} 0 0 {i} {w} 0 0 0 0 0" for c, (u, i, w) in ticks.items()]
        return "\n".join(lines) + "\nintr 0\n"

    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(stat({0: (100, 100, 0), 1: (100, 100, 0), 2: (0, 100, 0)}))
    # over the window: cpu0 75% busy, cpu1 idle (half of it iowait), cpu2 fully busy but not usable
    second.write_text(stat({0: (175, 125, 0), 1: (100, 150, 50), 2: (100, 100, 0)}))
    reads = iter([machine_load._cpu_ticks(first), machine_load._cpu_ticks(second)])
    monkeypatch.setattr(machine_load, "_cpu_ticks", lambda path: next(reads))
    monkeypatch.setattr(machine_load, "_usable_cpus", lambda: [0, 1])
    seen = machine_load.busy_cores(window=0.01)
    assert seen == {"busy": pytest.approx(0.75), "cpus": 2, "source": machine_load.STAT, "window": 0.01}

    monkeypatch.setattr(machine_load, "_cpu_ticks", lambda path: (_ for _ in ()).throw(OSError("no /proc")))
    fallback = machine_load.busy_cores(window=0.01)
    assert fallback["source"] == "load average" and fallback["busy"] <= fallback["cpus"]
    assert fallback["busy"] == pytest.approx(min(os.getloadavg()[0], 2), abs=0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_busy_cores_sees_a_process_that_spins_while_it_sleeps():
    """A process spinning on one usable CPU for the whole window shows as most of a core (on a
    shared machine others add to it, never take it away)."""
    import os

    from course_lib.beyond_one_machine import busy_cores

    cpu = sorted(os.sched_getaffinity(0))[0]
    spinner = subprocess.Popen([sys.executable, "-c", f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\n"
                                "t = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.5)
        seen = busy_cores(window=1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert seen["source"] == "/proc/stat" and seen["busy"] >= 0.8, seen
