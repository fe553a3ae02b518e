"""Lesson 07: beyond one machine, the same code on MPI and on a shared cluster.

* :mod:`.allreduce_benchmark`: allreduce timed side by side by one procedure: course_lib's
  engines (shared memory, ring over Pipes) on a Cluster, MPICH's ``MPI_Allreduce`` under
  ``mpiexec``, and memcpy of the same bytes as the ceiling on one machine.
* :mod:`.machine_load`: how many cores other processes kept busy just before a measurement
  (``/proc/stat`` over a short window), the load the lesson's verdicts are read against.
* :mod:`.gang_scheduling`: jobs sharing the cores: synchronous jobs on real Clusters, run alone,
  time-shared by the OS, or gang-scheduled (SIGSTOP / SIGCONT slices), with their waits recorded.

What the lesson also uses lives where other lessons find it: the launcher that runs one program
on either backend (``python -m course_lib.run``) and ``mpiexec_path`` with the runtime's MPI
backend (:mod:`course_lib.runtime.mpi_backend`), the table of real links in
:mod:`course_lib.hardware`, the cost model in :mod:`course_lib.costs`.
"""
from .allreduce_benchmark import (
    COURSE_ENGINES,
    ENGINE_COLORS,
    ENGINE_MARKERS,
    ENGINE_NAMES,
    SIZES,
    clearly_faster,
    compare,
    format_table,
    measure_course,
    measure_memcpy,
    measure_mpi,
)
from .gang_scheduling import (
    POLICIES,
    GangScheduler,
    JobRun,
    JobSpec,
    calibrate_work,
    pin_ranks,
    run_jobs,
    sync_job,
)
from .machine_load import busy_cores

__all__ = ["COURSE_ENGINES", "ENGINE_COLORS", "ENGINE_MARKERS", "ENGINE_NAMES", "SIZES", "busy_cores",
           "clearly_faster", "compare", "format_table", "measure_course", "measure_memcpy", "measure_mpi",
           "POLICIES", "GangScheduler", "JobRun", "JobSpec", "calibrate_work", "pin_ranks", "run_jobs", "sync_job"]
