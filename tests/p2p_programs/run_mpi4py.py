"""Run programs of this folder under mpiexec: ``mpiexec -n P python -m mpi4py run_mpi4py.py BACKEND OUT NAME...``.

BACKEND ``mpi4py``: every rank runs each program's ``main(MPI.COMM_WORLD, MPI)`` with
mpi4py's own communicator and names; ``course_lib``: ``main(MPIComm(), course_lib.MPI)``,
course_lib's communicator on MPI (its mpi backend). Programs run in turn, a barrier
between them; rank 0 writes ``{name: [transcript of rank 0, rank 1, ...]}`` to OUT as JSON.
"""
import importlib
import json
import pathlib
import sys

from mpi4py import MPI

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: p2p_programs is a package there


def run(backend: str, out: str, names: list[str]) -> None:
    comm = MPI.COMM_WORLD
    if backend == "course_lib":
        import course_lib
        from course_lib.runtime.mpi_backend import MPIComm

        program_comm, names_module = MPIComm(), course_lib.MPI
    else:
        program_comm, names_module = comm, MPI
    transcripts = {}
    for name in names:
        program = importlib.import_module(f"p2p_programs.{name}")
        comm.Barrier()
        transcripts[name] = comm.gather(program.main(program_comm, names_module), root=0)
    if comm.rank == 0:
        pathlib.Path(out).write_text(json.dumps(transcripts))


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3:])
