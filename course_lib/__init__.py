"""course_lib: distributed machine learning with real processes on your own machine.

Start here::

    from course_lib import Cluster
    with Cluster(4) as cluster:
        res = cluster.run(lambda comm: comm.rank)
    res, res.stats, res.timeline

The runtime (:mod:`course_lib.runtime`) runs every collective with its own algorithms; a
lesson's package is imported where it is used (``from course_lib.collectives import ...``),
never here, so ``import course_lib`` loads no lesson (tests/test_layout.py checks it).
"""
from .replay import trace_answers_if_recording

trace_answers_if_recording()  # first: only while `make release` records the lessons (course_lib/replay.py)

from .runtime import (  # noqa: E402
    ANY_SOURCE,
    ANY_TAG,
    MAX,
    MAXLOC,
    MEAN,
    MIN,
    MINLOC,
    MPI,
    PROC_NULL,
    PROD,
    SUM,
    UNDEFINED,
    Cluster,
    Comm,
    Event,
    Fault,
    InjectedFault,
    Network,
    Op,
    PeerLost,
    Request,
    RunResult,
    SharedArray,
    Stats,
    Status,
    Timeline,
    WorkerError,
    WorkerTimeout,
    default_start_method,
)


def check(question_id: str, namespace: dict | None = None):
    """Run the visible checks of one exercise question on your code, e.g. ``check("ex00_1")``.

    (Imported lazily so worker processes, which import course_lib, stay light.)
    """
    import inspect

    from .grading import check as _check

    if namespace is None:  # the caller's globals: the notebook's namespace
        namespace = inspect.currentframe().f_back.f_globals
    return _check(question_id, namespace)

def lesson_status(number: str) -> None:
    """A lesson's status cell: prints the exercises it runs on, written or not (course_lib.replay)."""
    from .replay import lesson_status as _status

    _status(number)


__all__ = [
    "Cluster", "RunResult", "WorkerError", "WorkerTimeout", "default_start_method",
    "ANY_SOURCE", "ANY_TAG", "Comm", "PeerLost", "Request", "Status",
    "Fault", "InjectedFault", "Network", "SharedArray", "Event", "Stats", "Timeline",
    "SUM", "PROD", "MAX", "MIN", "MAXLOC", "MINLOC", "MEAN", "Op", "check",
    "MPI", "PROC_NULL", "UNDEFINED", "lesson_status",
]
__version__ = "0.1.0"
