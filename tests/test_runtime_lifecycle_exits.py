"""How workers end: the real error leads the report, a script's mistakes are named, and workers
never outlive the process that started them, even one that stays a zombie.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from course_lib import Cluster, WorkerError
from course_lib.runtime.cluster import _primary

from runtime_checks import PROMISE_S, assert_clean

METHODS = ["fork", "spawn", "forkserver"]
PYTHON = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_to_a_closed_pipe(comm):
    if comm.rank == 1:
        read_end, write_end = os.pipe()
        os.close(read_end)
        os.write(write_end, b"nobody reads this")
    return comm.rank


@pytest.fixture
def sigpipe_at_default():
    """As in a script that sets SIGPIPE back to its default (to die quietly when piped into `head`)."""
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGPIPE, previous)


@pytest.mark.parametrize("start_method", METHODS)
def test_a_write_to_a_closed_pipe_is_reported_as_broken_pipe_not_a_vanished_process(start_method,
                                                                                    sigpipe_at_default):
    with Cluster(2, start_method=start_method, timeout=60) as c:
        with pytest.raises(WorkerError) as info:
            c.run(write_to_a_closed_pipe)
    err = info.value
    assert (err.rank, err.exc_type) == (1, "BrokenPipeError"), str(err)
    assert "os.write(write_end" in err.remote_traceback  # the line that failed, with a traceback
    assert_clean()


def test_a_rank_killed_by_sigpipe_never_leads_the_report():
    """It wrote to a peer that had gone: the peer's own error is the one to read first."""
    died = WorkerError("rank 0 was terminated by SIGPIPE", 0, exitcode=-signal.SIGPIPE, exc_type="ProcessDied")
    raised = WorkerError("rank 1 raised ValueError: the real error", 1, exc_type="ValueError")
    first = _primary([died, raised])  # the parent heard of the death first
    assert first.rank == 1 and first.ranks == [1, 0]
    assert str(first).startswith("rank 1 raised ValueError") and "also failed: rank 0 (ProcessDied)" in str(first)


def run_script(tmp_path, source: str, timeout: float, env=None) -> tuple[float, subprocess.CompletedProcess]:
    """(seconds, result) of running ``source`` as a script, as a caller would with capture_output."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    t0 = time.perf_counter()
    done = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)
    return time.perf_counter() - t0, done


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_an_unguarded_script_is_told_about_the_main_guard(tmp_path, start_method):
    _, done = run_script(tmp_path, f"""
        from course_lib import Cluster, WorkerError
        try:
            with Cluster(2, start_method="{start_method}", timeout=30) as c:
                c.run(lambda comm: comm.rank)
        except WorkerError as err:
            print("REPORT:", err)
        """, timeout=90)
    report = done.stdout[done.stdout.index("REPORT:"):]  # the parent's error, not a worker's stderr
    assert "failed while starting" in report
    assert 'if __name__ == "__main__":' in report and "script.py" in report


def processes_marked(marker: str) -> list[psutil.Process]:
    """Processes (of any parent) whose environment carries ``marker``: a script's workers, orphaned or not."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("COURSE_LIFECYCLE_TEST") == marker and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


SCRIPT_THAT_STARTS_A_CLUSTER = """
    import os, signal
    from course_lib import Cluster

    if __name__ == "__main__":
        c = Cluster(3, start_method="{start_method}", timeout=30)
        print(list(c.run(lambda comm: comm.rank)), flush=True)
        {ending}
    """


@pytest.mark.parametrize("start_method", METHODS)
def test_a_script_killed_with_sigkill_does_not_leave_its_caller_waiting(tmp_path, start_method):
    marker = uuid.uuid4().hex
    env = dict(os.environ, COURSE_LIFECYCLE_TEST=marker)
    try:
        # Baseline, measured here: the same script closing its Cluster and exiting normally.
        honest, done = run_script(tmp_path, SCRIPT_THAT_STARTS_A_CLUSTER.format(
            start_method=start_method, ending="c.close()"), timeout=120, env=env)
        assert done.returncode == 0 and "[0, 1, 2]" in done.stdout, done.stderr
        # The script dies by SIGKILL: it is a zombie until subprocess.run reaps it, which it does
        # only once every holder of the script's stdout (its workers) has closed it.
        killed, done = run_script(tmp_path, SCRIPT_THAT_STARTS_A_CLUSTER.format(
            start_method=start_method, ending="os.kill(os.getpid(), signal.SIGKILL)"),
            timeout=honest + 30, env=env)
        assert done.returncode == -signal.SIGKILL and "[0, 1, 2]" in done.stdout, done.stderr
        assert killed < honest + PROMISE_S, f"the caller waited {killed:.2f} s (a normal exit: {honest:.2f} s)"
        deadline = time.perf_counter() + PROMISE_S
        while processes_marked(marker) and time.perf_counter() < deadline:
            time.sleep(0.05)
        assert not processes_marked(marker), "workers outlived the script that started them"
    finally:
        for p in processes_marked(marker):
            p.kill()
