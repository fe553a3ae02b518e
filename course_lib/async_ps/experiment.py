"""One call to train with the parameter server on real processes, and what it returns."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import networkx as nx
import numpy as np

from course_lib import validate

from .parameter_server import run_ps
from .settings import AsyncSettings

_RECORD_FIELDS = ("worker", "version", "staleness", "time", "applied", "lr")


@dataclass
class PSResult:
    """Everything a parameter-server run measured.

    ``records``: dict of arrays, one entry per gradient that reached the server
    (``worker, version, staleness, time, applied, lr, sent``): ``sent`` is the worker's clock
    when the gradient left, ``time`` the server's when it arrived (and was applied, if it was);
    ``updates``: arrays ``version`` (1, 2, ...) and ``time``, when the server reached each version;
    ``worker_sent``: {worker: the send time of every gradient it computed, including a last one
    the server no longer needed}; ``losses``: arrays ``time``, ``version``, ``loss``;
    ``waits``: seconds each synchronous round waited; ``dead``: workers the server saw die;
    ``run``: the cluster's RunResult (timeline, stats). All times are seconds on the run's clock
    (``comm.now()``), the clock of ``run.timeline``.
    """

    w: np.ndarray
    version: int
    records: dict
    losses: dict
    waits: np.ndarray
    dead: list
    reassigned: list
    policy: str
    n_workers: int
    wall_time: float
    run: object = None
    updates: dict = None
    worker_sent: dict = None

    def staleness_of(self, worker: int, applied_only: bool = False) -> np.ndarray:
        m = self.records["worker"] == worker
        if applied_only:
            m &= self.records["applied"]
        return self.records["staleness"][m]

    def mean_staleness(self) -> dict:
        """{worker: mean staleness of its gradients} (workers with no gradient left out)."""
        out = {}
        for r in range(1, self.n_workers + 1):
            s = self.staleness_of(r)
            if len(s):
                out[r] = float(s.mean())
        return out

    @property
    def final_loss(self) -> float:
        return float(self.losses["loss"][-1])

    @property
    def n_dropped(self) -> int:
        return int((~self.records["applied"]).sum())


def _records(rows, sent) -> dict:
    """The server's records as columns, with the workers' send times (one per record) as ``sent``."""
    if not rows:
        return {"worker": np.zeros(0, int), "version": np.zeros(0, int),
                "staleness": np.zeros(0, int), "time": np.zeros(0),
                "applied": np.zeros(0, bool), "lr": np.zeros(0), "sent": np.zeros(0)}
    cols = list(zip(*rows))
    dtypes = (np.int64, np.int64, np.int64, np.float64, bool, np.float64)
    out = {k: np.asarray(c, dtype=t) for k, c, t in zip(_RECORD_FIELDS, cols, dtypes)}
    if len(sent) != len(rows):  # an apply step that kept its own records: no send time to pair them with
        sent = np.full(len(rows), np.nan)
    out["sent"] = np.asarray(sent, dtype=np.float64)
    return out


def train_async(X, y, settings: AsyncSettings | None = None, *, cluster=None, **overrides) -> PSResult:
    """Train least squares on ``X, y`` with a parameter server and ``settings.n_workers`` workers.

    ``settings``: an :class:`AsyncSettings` (None: its defaults); keywords override its fields,
    so ``train_async(X, y, n_workers=3, policy="sync")`` and
    ``train_async(X, y, AsyncSettings(n_workers=3), policy="sync")`` run the same.
    Runs on ``cluster`` (size must be ``n_workers + 1``) or on a fresh
    ``Cluster(n_workers + 1)``. Ranks in ``slow`` / ``faults`` are cluster ranks, so
    workers are 1..n_workers (rank 0 is the server). With ``faults`` the run continues
    past a dead worker (``on_failure="continue"``).
    """
    import course_lib as cl

    settings = validate.settings_from(AsyncSettings, settings, overrides)
    n_workers = settings.n_workers
    X, y = _checked_data(X, y, n_workers)
    with contextlib.ExitStack() as stack:
        if cluster is None:
            # A star: workers have a Pipe to the server only, as in a real parameter server.
            cluster = stack.enter_context(cl.Cluster(n_workers + 1, start_method=settings.start_method,
                                                     graph=nx.star_graph(n_workers)))
        elif cluster.n_workers != n_workers + 1:
            raise ValueError(f"the cluster has {cluster.n_workers} ranks; a parameter server "
                             f"with {n_workers} workers needs n_workers + 1 = {n_workers + 1}")
        X_sa = stack.enter_context(cl.SharedArray.from_array(X))
        y_sa = stack.enter_context(cl.SharedArray.from_array(y))
        res = cluster.run(run_ps, X_sa, y_sa, settings, **_run_knobs(settings))
    return _result(res, settings)


def _checked_data(X, y, n_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """X (n, d) and y (n,) as contiguous float64, with at least one row per worker."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    if len(y) < n_workers:
        raise ValueError("need at least one row per worker")
    return X, y


def _run_knobs(settings: AsyncSettings) -> dict:
    """The ``cluster.run`` keywords: with faults, the server carries on past a dead worker."""
    knobs = dict(timeout=settings.timeout)
    if settings.slow:
        knobs["slow"] = settings.slow
    if settings.faults:
        knobs["faults"] = settings.faults
        knobs["on_failure"] = "continue"
    return knobs


def _result(res, settings: AsyncSettings) -> PSResult:
    """The server's (rank 0's) answer as a :class:`PSResult`."""
    out, n_workers = res[0], settings.n_workers
    if out is None:
        raise RuntimeError(f"the server (rank 0) failed: {res.failures.get(0)!r}")
    losses = np.asarray(out["losses"], dtype=np.float64)
    update_times = np.asarray(out["update_times"], dtype=np.float64)
    worker_sent = {r: np.asarray(res[r]["sent"]) for r in range(1, n_workers + 1)
                   if isinstance(res[r], dict) and "sent" in res[r]}
    return PSResult(w=out["w"], version=out["version"], records=_records(out["records"], out["sent"]),
                    losses={"time": losses[:, 0], "version": losses[:, 1].astype(int),
                            "loss": losses[:, 2]},
                    waits=np.asarray(out["waits"]), dead=list(out["dead"]),
                    reassigned=list(out["reassigned"]), policy=settings.policy, n_workers=n_workers,
                    wall_time=res.wall_time, run=res, worker_sent=worker_sent,
                    updates={"version": np.arange(1, len(update_times) + 1), "time": update_times})
