"""The same programs on MPI (mpiexec) and on the local backend give the same numbers.

Skipped with a message when the optional `mpi` extra (mpi4py + an MPI) is not installed.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from course_lib.allreduce_bench import mpiexec_path

from common import REPO as ROOT
from common import needs_mpi

EXAMPLES = ["collectives", "mapreduce_gd", "gossip"]

pytestmark = needs_mpi


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def _run(cmd, out, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd + ["--out", str(out)], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("example", EXAMPLES)
def test_mpi_equals_local(example, n, tmp_path):
    script = str(ROOT / "examples" / f"{example}.py")
    mpi = _run(
        [mpiexec_path(), "-n", str(n), sys.executable, "-m", "course_lib.run", script], tmp_path / "mpi.pkl", tmp_path
    )
    method = "spawn" if n == 2 else "forkserver"  # the program file is shipped by value to fresh interpreters
    local = _run([sys.executable, "-m", "course_lib.run", "--local", str(n), "--start-method", method, script],
                 tmp_path / "local.pkl", tmp_path)
    assert mpi["backend"] == "mpi" and local["backend"] == "local"
    assert mpi["size"] == local["size"] == n
    np.testing.assert_array_equal(mpi["bytes"], local["bytes"])  # the same traffic on every link
    assert mpi["bytes"].sum() > 0
    assert _same(mpi["results"], local["results"])  # bit-for-bit the same numbers


def test_runner_rejects_a_program_without_main(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    proc = subprocess.run([sys.executable, "-m", "course_lib.run", "--local", "2", str(bad)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and "must define main(comm)" in proc.stderr
