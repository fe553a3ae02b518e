"""The runtime: real worker processes, Pipes, shared memory, and what travels between them.

``cluster`` starts and watches the workers; ``comm`` is each rank's communicator
(point-to-point as in mpi4py); ``collective_api`` the collective methods, whose
algorithms are rows of ``registry``; ``groups`` sub-communicators; ``wire`` the frame
format; ``shm`` shared arrays; ``netem`` the emulated network; ``faults`` injected
failures; ``logs`` worker logging; ``trace`` traffic counters and timelines; ``ops``
reduction operators; ``mpi_backend`` the same communicator on a real MPI job.

Nothing here imports a lesson (``tests/test_layout.py`` checks the import graph).
"""
from . import mpi_names as MPI
from .cluster import Cluster, RunResult, WorkerError, WorkerTimeout, default_start_method
from .comm import ANY_SOURCE, ANY_TAG, Comm, PeerLost, Request, Status
from .constants import PROC_NULL, UNDEFINED
from .faults import Fault, InjectedFault
from .netem import Network
from .ops import MAX, MAXLOC, MEAN, MIN, MINLOC, PROD, SUM, Op
from .shm import SharedArray
from .trace import Event, Stats, Timeline

__all__ = [
    "Cluster", "RunResult", "WorkerError", "WorkerTimeout", "default_start_method",
    "ANY_SOURCE", "ANY_TAG", "Comm", "PeerLost", "Request", "Status",
    "Fault", "InjectedFault", "Network", "SharedArray", "Event", "Stats", "Timeline",
    "SUM", "PROD", "MAX", "MIN", "MAXLOC", "MINLOC", "MEAN", "Op",
    "PROC_NULL", "UNDEFINED", "MPI",
]
