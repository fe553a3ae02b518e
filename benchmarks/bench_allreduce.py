"""Allreduce at p = 2 and 4, 4 KB to 16 MB: course_lib shared memory vs MPICH vs memcpy.

Both engines are timed by the same procedure
(course_lib.beyond_one_machine.allreduce_benchmark.timed_tries) in one run: three rounds of 20
tries each, pooled, so a burst of load from other jobs on the machine hits both alike. Best and
median per call are printed, and the ratio MPI/shm (above 1: course_lib is faster).

Ranks are bound to cores for both engines (``mpiexec -bind-to core``; rank r on core r
mod cores for course_lib), as MPI launchers do on clusters; then a sweep without binding
at 4 KB and 64 KB shows what an unbound run gets on a busy machine (see
course_lib.beyond_one_machine.allreduce_benchmark for why the two differ).

Targets (lesson 07): within 3x of MPI_Allreduce at 4 KB and 64 KB (ratio >= 0.33), at
least as fast from 1 MB up (ratio >= 1.0). p = 4 runs on however many cores there are
(oversubscribed on a 2-core laptop, which is the case we care about).
"""
from __future__ import annotations

from course_lib.beyond_one_machine import SIZES, compare, format_table
from course_lib.runtime.mpi_backend import mpiexec_path

PS = (2, 4)
TRIES, ROUNDS = 20, 3


def targets(result) -> list[str]:
    """One line per (p, size): the ratio on best and on median times, and whether it is met."""
    lines = []
    for p in PS:
        for i, size in enumerate(result["sizes"]):
            shm, mpi = result[("shm", p)][i], result[("mpi", p)][i]
            need = 1 / 3 if size < 2 ** 20 else 1.0
            best, median = mpi["best"] / shm["best"], mpi["median"] / shm["median"]
            verdict = "met" if best >= need and median >= need else (
                "met on best only" if best >= need else "NOT met")
            lines.append(f"p={p} {size:>10,} B: mpi/shm {best:5.2f}x best, {median:5.2f}x median "
                         f"(target >= {need:.2f}x): {verdict}")
    return lines


def run() -> None:
    if mpiexec_path() is None:
        print("MPI_Allreduce: skipped (install the mpi extra: pip install '.[mpi]')")
        result = compare(PS, SIZES, TRIES, ("shm",), ROUNDS)
        print(format_table(result, "best"))
        return
    result = compare(PS, SIZES, TRIES, ("shm", "mpi"), ROUNDS, bind=True)
    print(f"course_lib allreduce_shm vs MPI_Allreduce ({result['library']}), float32 sum, "
          f"{ROUNDS} rounds x {TRIES} tries each")
    print(format_table(result, "best"))
    print(format_table(result, "median"))
    print("\n".join(targets(result)))
    unbound = compare(PS, SIZES[:2], TRIES, ("shm", "mpi"), 1, bind=False)
    print(format_table(unbound, "median"))


if __name__ == "__main__":
    run()
