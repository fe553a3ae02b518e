"""A pre-loaded process that forks one grading runner per request (POSIX only).

Importing IPython, numpy and course_lib costs a couple of CPU seconds; a folder of 50
submissions would pay it 50 times. The zygote imports them once and then forks a runner for
each request, so a submission starts in milliseconds. Each forked runner calls ``setsid()``
(its own process group, killed whole at the end), sets its memory limit, writes its stdout and
stderr into a FIFO the grader drains, and exits with ``os._exit``.

Protocol on stdin/stdout, one JSON object per line::

    parent -> zygote: {"id": n, "spec": path, "output": fifo, "memory_mb": m, "env": {...}}
    zygote -> parent: {"id": n, "pid": pid}        then later {"exit": pid, "code": exitcode}
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

PRELOAD = ("numpy", "nbformat", "IPython.core.interactiveshell", "networkx", "cloudpickle", "course_lib",
           "course_lib.grading.runner")


def _child(req: dict, ctl_fd: int) -> None:
    try:
        os.setsid()
        os.close(ctl_fd)
        # Python's own defaults (SIGPIPE stays ignored, as Python sets it: a broken pipe is an exception)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if req.get("memory_mb"):
                lim = int(req["memory_mb"]) * 1024 * 1024
                resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        except (ImportError, ValueError, OSError):
            pass
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(req["output"], os.O_WRONLY)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.environ.update(req.get("env", {}))
        os.chdir(req.get("cwd", os.getcwd()))
        from course_lib.grading import runner

        runner.main(req["spec"])
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        os._exit(70)


def serve() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs time
            pass
    ctl_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints must not corrupt the control channel
    ctl = os.fdopen(ctl_fd, "w", buffering=1)
    lock = threading.Lock()

    def reply(obj):
        with lock:
            ctl.write(json.dumps(obj) + "\n")
            ctl.flush()

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.05)
                continue
            reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    threading.Thread(target=reap, daemon=True).start()
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if time.time() > req.get("deadline", float("inf")):
            reply({"id": req["id"], "pid": -1})  # the grader gave up on this request already
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        with lock:  # no fork while the reaper writes: the child must not inherit a held lock
            pid = os.fork()
        if pid == 0:
            _child(req, ctl_fd)
        reply({"id": req["id"], "pid": pid})
    os._exit(0)  # stdin closed: the grader is gone


class Zygote:
    """The grader's handle on a zygote process (see the module doc)."""

    def __init__(self, env: dict, cwd: str):
        import subprocess

        self.cwd = cwd
        self.proc = subprocess.Popen([sys.executable, "-m", "course_lib.grading.zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                                     start_new_session=True, text=True, bufsize=1)
        self.cond = threading.Condition()
        self.pids, self.exits, self.next_id = {}, {}, 0
        self.send_lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                if "exit" in msg:
                    self.exits[msg["exit"]] = msg["code"]
                else:
                    self.pids[msg["id"]] = msg["pid"]
                self.cond.notify_all()
        with self.cond:
            self.alive = False
            self.cond.notify_all()

    def spawn(self, spec: str, output: str, memory_mb, env: dict, timeout: float = 120.0) -> int:
        """Fork a runner for ``spec``; return its pid. Raises RuntimeError if the zygote is gone."""
        with self.send_lock:
            self.next_id += 1
            rid = self.next_id
            req = {"id": rid, "spec": spec, "output": output, "memory_mb": memory_mb, "env": env, "cwd": self.cwd,
                   "deadline": time.time() + timeout}
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as e:
                raise RuntimeError(f"the grading zygote is gone: {e}") from None
        deadline = time.monotonic() + timeout
        with self.cond:
            while rid not in self.pids:
                left = deadline - time.monotonic()
                if not self.alive or left <= 0:
                    raise RuntimeError("the grading zygote did not answer")
                self.cond.wait(left)
            pid = self.pids.pop(rid)
        if pid <= 0:
            raise RuntimeError("the grading zygote answered too late")
        return pid

    def exitcode(self, pid: int):
        with self.cond:
            if pid in self.exits:
                return self.exits[pid]
            if not self.alive:
                return -9
            return None

    def wait(self, pid: int, timeout: float):
        deadline = time.monotonic() + timeout
        with self.cond:
            while pid not in self.exits and self.alive and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            return self.exits.pop(pid, None)

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    serve()
