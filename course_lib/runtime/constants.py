"""MPI's special values, numbered as in Open MPI (MPICH differs: compare by name, see mpi_names)."""
from __future__ import annotations

ANY_SOURCE = -1     # recv/probe: a message from any rank
ANY_TAG = -1        # recv/probe: a message with any tag
UNDEFINED = -32766  # Split(color=UNDEFINED): this rank joins no sub-communicator
MAX_TAG = 2 ** 31   # tags travel as 32-bit integers in the frame header (MPI guarantees only 32767)

# The runtime's time limits, in seconds (a Cluster's timeout= overrides the first)
RUN_TIMEOUT_S = 120.0   # a run that has not finished by then raises WorkerTimeout naming its ranks
WIRE_UP_TIMEOUT_S = 60.0  # starting and wiring every worker (spawn imports numpy in each: seconds)
PROC_NULL = -2      # the null process: a send to it does nothing, a recv from it returns None at once
