"""Grade one notebook in a sandboxed subprocess, whatever the student's code does.

The runner (:mod:`course_lib.grading.runner`) executes the notebook and grades it in its own
process group, under a memory limit (``RLIMIT_AS`` on Linux), with stdout and stderr drained
into a capped buffer. This side watches its progress events:

- a cell or question running past its time limit (plus a grace period) gets the whole process
  group killed, along with every descendant seen (workers that left the group included);
- when the runner dies (``os._exit``, a crash, the kill above), the culprit is read from the
  last event: a cell is skipped and the notebook re-run without it, a question scores zero with
  a message, and grading resumes with the questions left.

So every question always ends with a result and a message, and grading never hangs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from .checking import QuestionResult
from .registry import REPO_ROOT, Question

GRACE = 5.0            # seconds on top of a soft limit before the hard kill
STARTUP_LIMIT = 60.0   # seconds from launch to the first events (imports)
OUTPUT_CAP = 32 * 1024  # bytes of student output kept (head and tail each)


@dataclass
class Limits:
    cell_timeout: float = 120.0          # per code cell
    timeout: Optional[float] = None      # per question; None: each question's own timeout
    memory_mb: Optional[int] = 2048      # address-space limit per process; None: no limit
    total_timeout: float = 900.0         # per submission, all attempts together


@dataclass
class NotebookGrade:
    results: Dict[str, QuestionResult]
    notes: List[str] = field(default_factory=list)
    output: str = ""
    elapsed: float = 0.0
    attempts: int = 0


class _CappedOutput(threading.Thread):
    """Drain a pipe, keeping its head and tail: megabytes of prints cost nothing."""

    def __init__(self, pipe=None, fifo=None):
        super().__init__(daemon=True)
        self.pipe, self.fifo, self.head, self.tail, self.total = pipe, fifo, bytearray(), bytearray(), 0

    def run(self):
        try:
            if self.pipe is None:
                self.pipe = open(self.fifo, "rb", buffering=0)  # blocks until the runner opens it
            while True:
                chunk = self.pipe.read(65536)
                if not chunk:
                    break
                self.total += len(chunk)
                room = OUTPUT_CAP - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self.tail += chunk
                    del self.tail[:-OUTPUT_CAP]
        except (OSError, ValueError):
            pass
        finally:
            if self.pipe is not None:
                self.pipe.close()

    def unblock(self):
        """Release a reader still waiting for a writer on the FIFO (the runner never started)."""
        if self.fifo is not None:
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    def text(self) -> str:
        if self.total <= len(self.head) + len(self.tail):
            data = bytes(self.head + self.tail)
            return data.decode("utf-8", "replace")
        skipped = self.total - len(self.head) - len(self.tail)
        return (bytes(self.head).decode("utf-8", "replace")
                + f"\n[... {skipped} bytes of output skipped ...]\n"
                + bytes(self.tail).decode("utf-8", "replace"))


def _limit_resources(memory_mb):
    def preexec():
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if memory_mb:
                lim = int(memory_mb) * 1024 * 1024
                resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        except (ImportError, ValueError, OSError):
            pass
    return preexec


class _Tree:
    """Every process seen below the runner, to kill even those that left its process group."""

    def __init__(self, proc):
        self.proc, self.seen = proc, {}

    def scan(self, group: bool = False):
        """Record the runner's descendants (and, with ``group``, every member of its process group)."""
        try:
            import psutil

            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except Exception:  # noqa: BLE001 - the runner may be gone already
            procs = []
        if group and hasattr(os, "getpgid"):
            import psutil

            for pid in psutil.pids():
                try:
                    if os.getpgid(pid) == self.proc.pid:
                        procs.append(psutil.Process(pid))
                except (OSError, psutil.Error):
                    pass
        for p in procs:
            try:
                self.seen.setdefault(p.pid, p.create_time())
            except Exception:  # noqa: BLE001
                pass

    def kill(self):
        """Kill everything, but let multiprocessing's resource trackers exit by themselves first:
        once their clients are dead they unlink the semaphores and shared memory those left behind."""
        self.scan(group=True)
        trackers, others = [], []
        try:
            import psutil

            for pid, ctime in self.seen.items():
                try:
                    p = psutil.Process(pid)
                    if abs(p.create_time() - ctime) < 1e-3:
                        is_tracker = "resource_tracker" in " ".join(p.cmdline())
                        (trackers if is_tracker else others).append(p)
                except psutil.Error:
                    pass
            self.proc.kill()
            for p in others:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            if trackers:
                psutil.wait_procs(trackers, timeout=3)
        except ImportError:
            pass
        if os.name == "posix":
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        else:  # pragma: no cover - Windows
            self.proc.kill()
        for p in trackers:
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - gone already
                pass
        self.proc.wait(timeout=10)


class _PopenHandle:
    def __init__(self, popen):
        self.popen, self.pid = popen, popen.pid

    def poll(self):
        return self.popen.poll()

    def kill(self):
        self.popen.kill()

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover
            return None

    @property
    def returncode(self):
        return self.popen.returncode


class _ZygoteHandle:
    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.zygote.exitcode(self.pid)
        return self.returncode

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def wait(self, timeout):
        if self.returncode is None:
            self.returncode = self.zygote.wait(self.pid, timeout)
        return self.returncode


def _read_events(path: Path, offset: int):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events, offset + end


def _launch(spec: dict, limits: Limits, env: dict, questions: Dict[str, Question], workdir: Path,
            deadline: float, zygote=None):
    """Run the runner once; return (events, killed_reason, returncode, output)."""
    spec_path = workdir / f"spec{spec['attempt']}.json"
    events_path = Path(spec["events"])
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    proc = out = None
    if zygote is not None:
        fifo = workdir / f"out{spec['attempt']}.fifo"
        os.mkfifo(fifo)
        out = _CappedOutput(fifo=str(fifo))
        out.start()
        try:
            proc = _ZygoteHandle(zygote, zygote.spawn(str(spec_path), str(fifo), limits.memory_mb, env))
        except RuntimeError:
            out.unblock()
            proc = None
    if proc is None:
        kw = dict(start_new_session=True) if os.name == "posix" else {}
        if os.name == "posix":
            kw["preexec_fn"] = _limit_resources(limits.memory_mb)
        popen = subprocess.Popen([sys.executable, "-m", "course_lib.grading.runner", str(spec_path)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, cwd=str(REPO_ROOT), **kw)
        proc = _PopenHandle(popen)
        out = _CappedOutput(pipe=popen.stdout)
        out.start()
    tree = _Tree(proc)
    events, offset = [], 0
    phase_start, limit = time.monotonic(), STARTUP_LIMIT
    killed = None
    last_scan = 0.0
    while True:
        new, offset = _read_events(events_path, offset)
        for e in new:
            events.append(e)
            phase_start = time.monotonic()
            kind = e.get("event")
            if kind == "cell_start":
                limit = limits.cell_timeout + GRACE
            elif kind == "q_start":
                q = questions.get(e["qid"])
                t = limits.timeout or (q.timeout if q else 60.0)
                limit = t + GRACE
            else:
                limit = STARTUP_LIMIT
        if proc.poll() is not None:
            # read the last events written just before exit
            new, offset = _read_events(events_path, offset)
            events.extend(new)
            break
        now = time.monotonic()
        if now - last_scan > 0.5:
            tree.scan()
            last_scan = now
        if now - phase_start > limit:
            killed = f"ran past the time limit ({limit - GRACE:g} s) and was stopped"
            break
        if now > deadline:
            killed = "ran past the total time allowed for this submission and was stopped"
            break
        time.sleep(0.05)
    tree.kill()
    out.unblock()
    out.join(timeout=2)
    return events, killed, proc.returncode, out.text()


def _death(returncode, killed) -> str:
    if killed:
        return killed
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (out of memory?)" if name in ("SIGKILL", "SIGSEGV", "SIGABRT") else ""
        return f"ended the Python process with {name}{hint}"
    return f"ended the Python process (exit code {returncode}, e.g. os._exit)"


def _sweep_shm():
    try:
        from course_lib import shm

        shm.sweep()
    except Exception:  # noqa: BLE001 - the runtime may not provide it
        pass


def runner_env(seed: int = 0, start_method: Optional[str] = None) -> dict:
    """Environment of the grading subprocesses: quiet, single-threaded BLAS, seeded hashing."""
    env = dict(os.environ)
    env.update({"COURSE_GRADING": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": str(seed),
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
                    [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])})
    env.pop("MPLINLINE", None)
    if start_method:
        env["COURSE_START_METHOD"] = start_method
    return env


def start_zygote(seed: int = 0):
    """A zygote that forks pre-loaded runners (POSIX), or None where fork is unavailable."""
    if os.name != "posix" or not hasattr(os, "fork") or os.environ.get("COURSE_GRADING_NO_ZYGOTE"):
        return None
    from .zygote import Zygote

    return Zygote(runner_env(seed), str(REPO_ROOT))


def grade_notebook(notebook, lesson: str, questions: List[Question], limits: Limits = Limits(),
                   hidden_dir=None, seed: int = 0, start_method: Optional[str] = None,
                   hidden: bool = True, zygote=None) -> NotebookGrade:
    """Execute ``notebook`` and grade ``questions`` in sandboxed subprocesses (see module doc).

    ``zygote`` (from :func:`start_zygote`) makes each start cheap; without it every attempt is
    a fresh ``python -m course_lib.grading.runner``.
    """
    t0 = time.monotonic()
    deadline = t0 + limits.total_timeout
    qmap = {q.qid: q for q in questions}
    remaining = [q.qid for q in questions]
    results: Dict[str, QuestionResult] = {}
    notes: List[str] = []
    outputs: List[str] = []
    skip: List[int] = []
    env = runner_env(seed, start_method)

    def fail(qid, status, message, tb=""):
        q = qmap[qid]
        results[qid] = QuestionResult(qid, q.title, 0, q.points, status, message, tb)

    attempt = 0
    with tempfile.TemporaryDirectory(prefix="course_grade_") as tmp:
        tmp = Path(tmp)
        while remaining:
            attempt += 1
            if time.monotonic() > deadline:
                for qid in remaining:
                    fail(qid, "timeout", "Not graded: the submission used up its total time.")
                break
            spec = {"notebook": str(Path(notebook).resolve()), "lesson": lesson, "qids": remaining,
                    "skip_cells": skip, "events": str(tmp / f"events{attempt}.jsonl"), "attempt": attempt,
                    "hidden_dir": str(hidden_dir) if hidden_dir else None, "hidden": hidden,
                    "cell_timeout": limits.cell_timeout, "seed": seed,
                    "timeouts": {q: limits.timeout for q in remaining} if limits.timeout else {}}
            events, killed, rc, output = _launch(spec, limits, env, qmap, tmp, deadline, zygote)
            outputs.append(output)
            for e in events:
                if e.get("event") == "cell_end" and e.get("error"):
                    note = f"cell {e['index'] + 1}: {e['error']}"
                    if note not in notes:
                        notes.append(note)
                elif e.get("event") == "q_end" and e["qid"] in remaining:
                    r = e.get("result")
                    if r is None:
                        fail(e["qid"], "error", "unknown question")
                    else:
                        results[e["qid"]] = QuestionResult(**r)
                    remaining.remove(e["qid"])
            if not remaining or any(e.get("event") == "done" for e in events):
                break
            last = events[-1] if events else {}
            why = _death(rc, killed)
            kind = last.get("event")
            if kind == "fatal":
                for qid in remaining:
                    fail(qid, "crashed", f"Not graded: {last.get('message')}", last.get("traceback", ""))
                break
            if kind == "cell_start":
                k = last["index"]
                skip.append(k)
                notes.append(f"cell {k + 1} {why}; it was skipped and the notebook was run again without it.")
            elif kind == "q_start" and last["qid"] in remaining:
                qid = last["qid"]
                status = "timeout" if killed else "crashed"
                fail(qid, status, f"While checking {qid}, your code {why}.")
                remaining.remove(qid)
            else:
                msg = f"Not graded: the grading process {why} before it could start."
                for qid in remaining:
                    fail(qid, "crashed", msg, output[-2000:])
                break
    _sweep_shm()
    ordered = {q.qid: results[q.qid] for q in questions if q.qid in results}
    return NotebookGrade(ordered, notes, "\n".join(o for o in outputs if o), round(time.monotonic() - t0, 2), attempt)
