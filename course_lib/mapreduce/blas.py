"""Pin numpy's BLAS to one thread, so a speedup measures processes and nothing else.

numpy's matrix products call a BLAS library (OpenBLAS in the pip wheels, MKL or Accelerate
elsewhere) that may start one thread per core on its own. Then the "1 worker" baseline
already uses every core, and 2 workers fight over the same cores: the speedup is hidden,
or faked when the baseline happens to be single-threaded and the parallel run is not.

The thread count is read from environment variables *when the BLAS library loads*, that is
when numpy is first imported in a process. So the variables must be set before that:

* in the notebook, in the very first cell, before ``import numpy``;
* workers started by spawn or forkserver inherit the environment and import numpy afresh;
* workers started by fork inherit the parent's already-loaded, already-pinned library.

(threadpoolctl can change the count at run time, but it is not a dependency of the course.)
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def pin_blas(threads: int = 1) -> bool:
    """Set the BLAS thread variables in ``os.environ``. Returns True if they can still act
    in this process (numpy not imported yet); children started afterwards inherit them."""
    for var in BLAS_VARS:
        os.environ[var] = str(int(threads))
    return "numpy" not in sys.modules


@contextmanager
def pinned_blas(threads: int = 1):
    """Within the block, the BLAS variables say ``threads``; after it, what they said before.

    For a benchmark or test in a process whose numpy is already loaded: the variables act only on
    the workers it *spawns* in the block (they import numpy afresh), and are restored so that what
    runs next in the process sees the environment it started with."""
    saved = {var: os.environ.get(var) for var in BLAS_VARS}
    pin_blas(threads)
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def blas_env() -> dict:
    """The BLAS thread variables as this process sees them (None when unset)."""
    return {var: os.environ.get(var) for var in BLAS_VARS}


def os_threads() -> int | None:
    """Threads of this process right now (Linux only, else None).

    With OpenBLAS and numpy imported, 1 means pinned: OpenBLAS starts its helper
    threads when it loads.
    """
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None
