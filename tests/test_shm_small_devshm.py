"""A container's small /dev/shm (Docker and Binder give 64 MB): sharing more than fits must never
kill the notebook with SIGBUS. A SharedArray that does not fit lives in a file of the temporary
folder instead (said once, with the fix), workers attach to it under every start method, it is
freed and swept like the others; with no room anywhere, an OSError names /dev/shm, its size and
the fix (``docker run --shm-size``).

Each test runs its program in a private mount namespace (``unshare -m``, root only) where a 64 MB
tmpfs is mounted on /dev/shm and the temporary folder is a private one (sometimes a small tmpfs
too), so the machine's own /dev/shm and /tmp are never touched.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common import REPO

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="mounting a small /dev/shm in a private mount namespace needs root and unshare(1) on Linux")

METHODS = ["fork", "spawn", "forkserver"]
MIB = 2 ** 20

PRELUDE = """
import json, os, sys, warnings
import numpy as np
REPO = {repo!r}
sys.path.insert(0, REPO)
from course_lib import Cluster, SharedArray
from course_lib.runtime import shm

MIB = 2 ** 20
TMP = os.environ["TMPDIR"]

def leftovers():
    return {{"dev_shm": sorted(n for n in os.listdir("/dev/shm") if n.startswith("course_")),
             "tmp": sorted(n for n in os.listdir(TMP) if n.startswith("course_"))}}

def report(**values):
    print("REPORT " + json.dumps(values, default=str), flush=True)
"""


def short_tmp(tmp_path) -> Path:
    """The test's private TMPDIR, on a short path: Python 3.11's forkserver binds a socket in TMPDIR,
    and a socket path has at most 107 bytes, which pytest's temporary folders under xdist exceed."""
    return Path("/tmp") / f"cs-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"


def in_small_shm(tmp_path, body: str, shm_mb: int = 64, tmp_mb: int | None = None, timeout: float = 90):
    """Run ``body`` (after PRELUDE; it defines ``main()``) with a ``shm_mb`` MB /dev/shm and a
    private TMPDIR (a ``tmp_mb`` MB tmpfs if given); return the process and what it reported.

    The program runs in a session of its own, killed whole at the end: workers orphaned by a
    parent that SIGBUS killed must not outlive the test (nor hold its output pipe open)."""
    tmp = short_tmp(tmp_path)
    tmp.mkdir()
    script = tmp_path / "program.py"
    script.write_text(PRELUDE.format(repo=str(REPO)) + textwrap.dedent(body)
                      + '\nif __name__ == "__main__":\n    main()\n')
    mounts = f"mount -t tmpfs -o size={shm_mb}m tmpfs /dev/shm"
    if tmp_mb is not None:
        mounts += f" && mount -t tmpfs -o size={tmp_mb}m tmpfs {tmp}"
    # exec: the return code is the program's own (-7 when SIGBUS kills it)
    command = f"{mounts} && export TMPDIR={tmp} && exec {sys.executable} {script}"
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "bash", "-c", command], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[killed after {timeout} s]"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    reports = [json.loads(line[len("REPORT "):]) for line in out.splitlines() if line.startswith("REPORT ")]
    return r, {k: v for rep in reports for k, v in rep.items()}


def explain(r) -> str:
    return f"return code {r.returncode} (-7 is SIGBUS)\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}"


SHARE_100_MIB = """
def touch(comm, sa):
    a = sa.array
    total = float(a[comm.rank::comm.size].sum())
    a[comm.rank] = -1.0 - comm.rank          # a write every other process sees
    return total

def total(comm, sa):
    return float(sa.array.sum())

def main():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Cluster(2, start_method={method!r}, timeout=60) as c:
            data = np.arange(100 * MIB // 8, dtype=np.float64)
            sa = c.share(data)
            second = c.share(np.ones(70 * MIB // 8))
            report(name=sa.name, second=second.name, while_open=leftovers())
            sums = c.run(touch, sa)
            report(sums=list(sums), expected=[float(data[r::2].sum()) for r in range(2)],
                   head=sa.array[:3].tolist(), second_sum=c.run(total, second)[1])
    report(warnings=[str(w.message) for w in caught], after_close=leftovers())
"""


@pytest.mark.parametrize("start_method", METHODS)
def test_a_share_larger_than_dev_shm_lives_in_a_file_that_workers_attach(tmp_path, start_method):
    r, rep = in_small_shm(tmp_path, SHARE_100_MIB.format(method=start_method))
    assert r.returncode == 0, explain(r)
    tmp = str(short_tmp(tmp_path))
    assert rep["name"].startswith(tmp + "/course_") and rep["second"].startswith(tmp + "/course_"), rep
    assert len(rep["while_open"]["tmp"]) == 2, rep
    assert rep["sums"] == rep["expected"], rep
    assert rep["head"] == [-1.0, -2.0, 2.0], rep          # both workers wrote into the parent's array
    assert rep["second_sum"] == 70 * MIB // 8
    said = [w for w in rep["warnings"] if "/dev/shm" in w]
    assert len(said) == 1, rep["warnings"]                   # said once, not per array
    for words in ["64", "--shm-size", tmp]:
        assert words in said[0], (words, said[0])
    assert rep["after_close"] == {"dev_shm": [], "tmp": []}, rep


def test_what_fits_stays_in_dev_shm_and_the_rest_goes_to_a_file(tmp_path):
    r, rep = in_small_shm(tmp_path, """
        def main():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                small = SharedArray.create(40 * MIB // 8, fill=1.0)
                report(small=small.name, quiet=len(caught))
                big = SharedArray.create(40 * MIB // 8, fill=2.0)   # 80 MB in all: no longer fits
                report(big=big.name, sums=[float(small.array.sum()), float(big.array.sum())],
                       said=len(caught), open=leftovers())
                small.release()
                big.release()
            report(after=leftovers())
    """)
    assert r.returncode == 0, explain(r)
    assert "/" not in rep["small"] and rep["quiet"] == 0, rep
    assert rep["big"].startswith(str(short_tmp(tmp_path))), rep
    assert rep["sums"] == [40 * MIB // 8, 2 * 40 * MIB // 8] and rep["said"] == 1, rep
    assert len(rep["open"]["dev_shm"]) == 1 and len(rep["open"]["tmp"]) == 1, rep
    assert rep["after"] == {"dev_shm": [], "tmp": []}, rep


def test_no_room_anywhere_raises_an_oserror_naming_dev_shm_its_size_and_the_fix(tmp_path):
    r, rep = in_small_shm(tmp_path, """
        def main():
            import errno
            errors = []
            for make in (lambda: SharedArray.create(100 * MIB // 8),
                         lambda: Cluster(2, start_method="fork").share(np.zeros(100 * MIB // 8))):
                try:
                    make()
                    errors.append(None)
                except OSError as e:
                    errors.append([e.errno == errno.ENOSPC, str(e)])
            report(errors=errors, left=leftovers())
    """, tmp_mb=32)
    assert r.returncode == 0, explain(r)
    for got in rep["errors"]:
        assert got is not None, rep
        is_enospc, msg = got
        assert is_enospc, msg
        for words in ["/dev/shm", "64", "100", "--shm-size", str(short_tmp(tmp_path))]:
            assert words in msg, (words, msg)
    assert rep["left"] == {"dev_shm": [], "tmp": []}, rep


def test_dev_shm_filled_after_the_check_falls_back_instead_of_sigbus(tmp_path):
    """The free space read before creating can be gone when the pages are first written (another
    process took it): the memory is reserved at creation, so the write cannot fail later."""
    r, rep = in_small_shm(tmp_path, """
        def main():
            shm._free_bytes = lambda folder: 1 << 40     # the check is fooled: it says it fits
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sa = SharedArray.create(100 * MIB // 8, fill=3.0)
            report(name=sa.name, total=float(sa.array.sum()), said=len(caught), open=leftovers())
            sa.release()
            report(after=leftovers())
    """)
    assert r.returncode == 0, explain(r)
    assert rep["name"].startswith(str(short_tmp(tmp_path))), rep
    assert rep["total"] == 3.0 * (100 * MIB // 8) and rep["said"] == 1, rep
    assert rep["open"] == {"dev_shm": [], "tmp": [os.path.basename(rep["name"])]}, rep
    assert rep["after"] == {"dev_shm": [], "tmp": []}, rep


def test_a_killed_creator_s_file_segment_is_swept(tmp_path):
    """A kernel killed hard leaves its file segments as it leaves /dev/shm's: `make clean-shm`
    (and every new Cluster) removes them once their creator is dead."""
    r, rep = in_small_shm(tmp_path, """
        CHILD = ("import os, signal, sys, warnings; sys.path.insert(0, REPO); warnings.simplefilter('ignore');"
                 "from course_lib import SharedArray; sa = SharedArray.create(100 * 2 ** 20 // 8, fill=1.0);"
                 "print(sa.name, flush=True); os.kill(os.getpid(), signal.SIGKILL)")

        def main():
            import subprocess
            child = subprocess.run([sys.executable, "-c", CHILD.replace("REPO", repr(REPO))],
                                   capture_output=True, text=True)
            name = child.stdout.strip()
            report(child=child.returncode, name=name, listed=name in shm.list_segments(), left=leftovers())
            cleaner = subprocess.run([sys.executable, "-m", "course_lib.runtime.shm", "--sweep"],
                                     capture_output=True, text=True, cwd=REPO)
            report(swept=cleaner.stdout + cleaner.stderr, after=leftovers())
    """)
    assert r.returncode == 0, explain(r)
    assert rep["child"] == -9 and rep["name"].startswith(str(short_tmp(tmp_path))), rep
    assert rep["listed"] and len(rep["left"]["tmp"]) == 1, rep
    assert os.path.basename(rep["name"]) in rep["swept"], rep
    assert rep["after"] == {"dev_shm": [], "tmp": []}, rep


SHM_ALLREDUCE = """
import course_lib.collectives  # comm.allreduce_shm is lesson 02's (it registers it)

def reduce_both_ways(comm, workspace, n):
    x = np.full(n, comm.rank + 1.0)
    fresh = comm.allreduce_shm(x)                       # rank 0's worker makes the segment
    reused = [comm.allreduce_shm(x, workspace=workspace) for _ in range(2)]
    return [float(fresh[0]), float(fresh[-1])] + [float(v[-1]) for v in reused]

def main():
    n = 3 * MIB                                          # 24 MiB a vector, 48 MiB for 2 rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Cluster(2, start_method={method!r}, timeout=60) as c:
            filler = c.share(np.ones(30 * MIB // 8))     # fits, and leaves too little for the rest
            workspace = c.share(np.zeros((2, n)))
            report(filler=filler.name, workspace=workspace.name,
                   results=list(c.run(reduce_both_ways, workspace, n)))
    report(after=leftovers())
"""


@pytest.mark.parametrize("start_method", METHODS)
def test_shared_memory_allreduce_works_in_file_segments(tmp_path, start_method):
    """The runtime's own segments (allreduce_shm's, made by rank 0's worker) fall back too, and the
    other workers attach to them."""
    r, rep = in_small_shm(tmp_path, SHM_ALLREDUCE.format(method=start_method))
    assert r.returncode == 0, explain(r)
    assert "/" not in rep["filler"] and rep["workspace"].startswith(str(short_tmp(tmp_path))), rep
    assert rep["results"] == [[3.0] * 4] * 2, rep
    assert rep["after"] == {"dev_shm": [], "tmp": []}, rep
