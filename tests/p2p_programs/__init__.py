"""Small SPMD programs, each ``main(comm, MPI) -> list[str]`` (this rank's transcript).

Each runs unchanged on mpi4py (``mpiexec -n P python -m mpi4py run_mpi4py.py ...``) and on
course_lib (``Cluster(P).run(main, MPI)``); ``tests/test_p2p_mpi4py.py`` requires equal
transcripts. A transcript names special values (PROC_NULL, ANY_TAG, UNDEFINED) instead of
printing their numbers, which differ between MPI implementations, and every program is
deterministic: ANY_SOURCE receives are told apart by tags or by a fixed order.

Sends that could meet no posted receive use ``isend`` (then ``wait``): MPI lets a blocking
``send`` wait for its receive, and MPICH does so for a send to yourself on a communicator
of one process (on COMM_WORLD of two or more it buffers it; ``pairs`` checks that case).
"""
