"""mpi4py's own unittest files run on a Cluster's communicator, unchanged, through an import shim.

``tests/mpi4py_suite/`` holds ``test_p2p_obj.py`` and ``test_cco_obj.py`` of mpi4py 4.1.2 with
their helpers ``mpiunittest.py`` and ``mpitestutil.py`` (BSD licence, ``LICENSE.rst``), as
released. In each worker, ``sys.modules["mpi4py.MPI"]`` becomes course_lib's ``MPI`` namespace
with ``COMM_WORLD`` the worker's communicator and ``COMM_SELF`` its own one-process
communicator; the test module is imported afresh (its classes read ``MPI.COMM_WORLD`` when they
are defined) and one test case runs on every rank, as under ``mpiexec``. Each case is its own
``Cluster.run``, so a case that deadlocks on course_lib costs its own time limit and is
reported as such, not the whole suite.
"""
from __future__ import annotations

import pathlib
import unittest

SUITE = pathlib.Path(__file__).resolve().parent / "mpi4py_suite"
MODULES = ("test_p2p_obj", "test_cco_obj")


def _install_shim(comm) -> None:
    """``from mpi4py import MPI`` gives course_lib's names, with this worker's world and self."""
    import sys
    import types

    from course_lib.runtime import mpi_names

    mpi = types.ModuleType("mpi4py.MPI")
    mpi.__dict__.update({k: v for k, v in vars(mpi_names).items() if not k.startswith("__")})
    mpi.COMM_WORLD, mpi.COMM_SELF = mpi_names.COMM_WORLD, mpi_names.COMM_SELF   # the worker's own
    package = types.ModuleType("mpi4py")
    package.__path__ = []
    package.MPI = mpi
    sys.modules["mpi4py"], sys.modules["mpi4py.MPI"] = package, mpi
    if str(SUITE) not in sys.path:
        sys.path.insert(0, str(SUITE))


def _fresh_module(name: str):
    import importlib
    import sys

    for stale in ("mpiunittest", "mpitestutil", name):
        sys.modules.pop(stale, None)
    return importlib.import_module(name)


def case_ids(module: str) -> list[str]:
    """The test ids of ``module`` (e.g. ``TestP2PObjWorld.testSendRecv``), loaded in this process
    through the same shim on a stand-in world of one rank."""
    from course_lib import Cluster

    with Cluster(1, timeout=60) as cluster:
        (ids,) = cluster.run(_list_cases, module)
    return ids


def _list_cases(comm, module: str) -> list[str]:
    _install_shim(comm)
    suite = unittest.defaultTestLoader.loadTestsFromModule(_fresh_module(module))
    return [t.id().split(".", 1)[1] for t in _flatten(suite)]


def _flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


def run_case(comm, module: str, case: str) -> str:
    """Run one test case on this rank; return ``ok``, ``skip: why``, ``fail: ...`` or ``error: ...``."""
    _install_shim(comm)
    mod = _fresh_module(module)
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromName(case, mod).run(result)
    if result.errors:
        return "error: " + result.errors[0][1].strip().splitlines()[-1][:300]
    if result.failures:
        return "fail: " + result.failures[0][1].strip().splitlines()[-1][:300]
    if result.skipped:
        return "skip: " + str(result.skipped[0][1])[:200]
    return "ok"


def run_module(module: str, p: int, start_method: str | None = None, timeout: float = 10.0) -> dict:
    """{case id: outcome} for every case of ``module`` on ``p`` ranks: ``ok`` when every rank passed,
    else the first rank's failure (``rank r: ...``), ``hang`` when the case ran past ``timeout``."""
    from course_lib import Cluster, WorkerError, WorkerTimeout

    outcomes = {}
    with Cluster(p, timeout=timeout, start_method=start_method) as cluster:
        for case in case_ids(module):
            try:
                per_rank = cluster.run(run_case, module, case)
            except WorkerTimeout:
                outcomes[case] = "hang"
                continue
            except WorkerError as exc:
                outcomes[case] = f"rank {exc.rank}: {str(exc).splitlines()[0][:300]}"
                continue
            bad = [(r, o) for r, o in enumerate(per_rank) if o != "ok" and not o.startswith("skip")]
            outcomes[case] = f"rank {bad[0][0]}: {bad[0][1]}" if bad else per_rank[0]
    return outcomes
