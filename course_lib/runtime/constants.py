"""MPI's special values, with mpi4py's numbers, so a program can compare against either."""
from __future__ import annotations

ANY_SOURCE = -1     # recv/probe: a message from any rank
ANY_TAG = -1        # recv/probe: a message with any tag
UNDEFINED = -32766  # Split(color=UNDEFINED): this rank joins no sub-communicator
MAX_TAG = 2 ** 31   # tags travel as 32-bit integers in the frame header (MPI guarantees only 32767)
