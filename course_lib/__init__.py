"""course_lib: distributed machine learning with real processes on your own machine.

Start here::

    from course_lib import Cluster
    with Cluster(4) as cluster:
        res = cluster.run(lambda comm: comm.rank)
    res, res.stats, res.timeline
"""
from .cluster import Cluster, RunResult, WorkerError, WorkerTimeout, default_start_method
from .comm import ANY_SOURCE, ANY_TAG, Comm, PeerLost, Request, Status
from .faults import Fault, InjectedFault
from .netem import Network
from .shm import SharedArray
from .trace import Event, Stats, Timeline

__all__ = [
    "Cluster", "RunResult", "WorkerError", "WorkerTimeout", "default_start_method",
    "ANY_SOURCE", "ANY_TAG", "Comm", "PeerLost", "Request", "Status",
    "Fault", "InjectedFault", "Network", "SharedArray", "Event", "Stats", "Timeline",
]
__version__ = "0.1.0"
