r"""Federated averaging (McMahan et al., AISTATS 2017) on real processes: rank 0 is the server,
ranks 1..K are clients that each hold their own rows and never show them to anybody.

One round: the server sends the model :math:`w` to the clients; client k runs ``local_steps``
(E) steps of gradient descent on its own rows only (its whole shard per step: McMahan's
:math:`B = \infty`),

.. math:: w_k \leftarrow w_k - \eta \nabla f_k(w_k), \qquad
          f_k(w) = \tfrac{1}{2 n_k} \lVert X_k w - y_k \rVert^2 ,

and sends :math:`w_k` back; the server averages the models it got, weighted by data size,
:math:`w = \sum_k (n_k / n) w_k` (:func:`course_lib.reference.ex03.fedavg`, question ex03_5).
With E = 1 this is McMahan's FedSGD, synchronous SGD: :math:`\sum_k (n_k/n)(w - \eta \nabla f_k(w))
= w - \eta \nabla f(w)`. With E > 1 the clients talk E times less for the same number of steps;
on non-IID shards each client drifts towards its own optimum in between.

A slow client is the limit of lesson 03's slow worker. ``min_answers=None`` waits for every
client each round; ``min_answers=m`` closes a round as soon as m of the clients it sent the model
to have answered, leaves the others computing, and drops their answers when they come in
late (a round that proceeds with whoever answered, as a deadline does in Bonawitz et al.,
*Towards Federated Learning at Scale*, 2019). A client still computing is not sent a new model.

Every message is a bare float64 array of d values, so the runtime counts exactly
``d * 8`` bytes per model: a round in which p clients take part moves ``2 p d 8`` bytes. The
stop signal is an empty array (0 bytes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from course_lib import validate
from course_lib.datasets import contiguous_shards
from course_lib.reference.ex03 import fedavg  # question ex03_5

from .settings import FedAvgSettings
from .sgd_problems import loss

STOP = np.empty(0)  # the server's "no more rounds" (counted as 0 bytes)


def local_steps(w, X, y, n_steps: int, lr: float, compute_time: float = 0.0, comm=None):
    """E steps of gradient descent on one client's rows, from a copy of ``w``; returns the new model.

    ``comm`` (on a worker): each step runs inside ``comm.compute("local step")``, padded with
    ``compute_time`` seconds of emulated work, which a ``Cluster(slow=...)`` factor stretches."""
    w = np.array(w, dtype=np.float64)
    for _ in range(n_steps):
        with comm.compute("local step") if comm is not None else contextlib.nullcontext():
            w -= lr * (X.T @ (X @ w - y) / len(y))
            if compute_time > 0:
                time.sleep(compute_time)
    return w


# ------------------------------------------------------------------------------ the run
def _client(comm, X_sa, y_sa, settings: FedAvgSettings):
    """Client ``comm.rank``: E local steps on its own rows for every model the server sends, until the stop."""
    start, stop = settings.shard_ranges[comm.rank - 1]
    X, y = X_sa.array[start:stop], y_sa.array[start:stop]
    rounds = 0
    while True:
        w = comm.recv(source=0)
        if w.size == 0:
            return {"rounds": rounds}
        comm.send(local_steps(w, X, y, settings.local_steps, settings.lr, settings.compute_time, comm), 0)
        rounds += 1


@dataclass
class _ServerLog:
    """What the server keeps of each round."""

    models: list        # the model after each round (the first is the start, w = 0)
    times: list         # the run clock when each round closed
    answered: list      # the clients averaged in each round
    late: int = 0       # answers that came after their round had closed (dropped)
    models_sent: int = 0
    models_received: int = 0


def _serve(comm, d: int, settings: FedAvgSettings):
    """The server's rounds (see the module); what it saw of them."""
    sizes = [stop - start for start, stop in settings.shard_ranges]
    min_answers = settings.min_answers
    log = _ServerLog(models=[np.zeros(d)], times=[comm.now()], answered=[])
    w = log.models[0]
    idle, given = set(range(1, comm.size)), {}   # given: client -> the round it is computing
    for t in range(settings.n_rounds):
        for k in sorted(idle):
            comm.send(w, k)
            given[k] = t
            log.models_sent += 1
        idle.clear()
        this_round = sum(1 for r in given.values() if r == t)
        need = this_round if min_answers is None else min(min_answers, this_round)
        got = {}
        while len(got) < need:
            src, w_k = comm.recv_any()
            log.models_received += 1
            idle.add(src)
            if given.pop(src) == t:
                got[src] = w_k
            else:
                log.late += 1
        clients = sorted(got)
        w = np.asarray(settings.average([got[k] for k in clients], [sizes[k - 1] for k in clients]),
                       dtype=np.float64)
        log.models.append(w)
        log.times.append(comm.now())
        log.answered.append(tuple(clients))
    while given:  # the stragglers still computing: take their answers (dropped) before stopping
        src, _ = comm.recv_any()
        log.models_received += 1
        log.late += 1
        given.pop(src)
    for k in range(1, comm.size):
        comm.send(STOP, k)
    return log


def run_fedavg(comm, X_sa, y_sa, settings: FedAvgSettings):
    """SPMD entry point for ``cluster.run``: rank 0 serves, rank k is the client of ``settings.shard_ranges[k-1]``.

    ``settings``: the run's :class:`FedAvgSettings`, whole, with its ``shard_ranges`` given;
    ``settings.average(models, sizes)`` is the server's step (default :func:`fedavg`, question ex03_5)."""
    if not isinstance(settings, FedAvgSettings) or settings.shard_ranges is None:
        raise TypeError("run_fedavg takes a FedAvgSettings with its shard_ranges given")
    comm.barrier()
    if comm.rank != 0:
        return _client(comm, X_sa, y_sa, settings)
    return _serve(comm, X_sa.shape[1], settings)


@dataclass
class FedAvgResult:
    """A federated run, as the server saw it.

    ``models[t]``: the model after round t (``models[0]`` = 0); ``times[t]``: the run clock
    (``comm.now()``) when round t closed; ``answered[t-1]``: the clients averaged in round t;
    ``late``: answers dropped because their round had closed; ``models_sent`` / ``models_received``:
    the server's own count of the models it sent and got; ``run``: the cluster's RunResult."""

    models: np.ndarray
    times: np.ndarray
    answered: list
    late: int
    models_sent: int
    models_received: int
    sizes: tuple
    local_steps: int
    wall_time: float
    run: object = None

    @property
    def w(self) -> np.ndarray:
        return self.models[-1]

    @property
    def rounds(self) -> int:
        return len(self.answered)

    @property
    def model_bytes(self) -> int:
        return int(self.models.shape[1] * 8)

    @property
    def bytes_moved(self) -> int:
        """Payload bytes the runtime counted on every link during the run."""
        return int(self.run.stats.total_bytes)

    def losses(self, X, y) -> np.ndarray:
        """The loss on all the data (every client's rows) after each round, from round 0."""
        return np.array([loss(X, y, w) for w in self.models])

    def rounds_to(self, X, y, target: float):
        """The first round after which the loss is <= target, or None if it never got there."""
        hit = np.flatnonzero(self.losses(X, y) <= target)
        return int(hit[0]) if len(hit) else None

    def share_of(self, client: int) -> float:
        """The fraction of rounds whose average included ``client``."""
        return float(np.mean([client in a for a in self.answered]))


def train_fedavg(X, y, settings: FedAvgSettings | None = None, *, cluster=None, **overrides) -> FedAvgResult:
    """FedAvg with ``settings.n_clients`` clients on real processes (a star: clients talk to the server only).

    ``settings``: a :class:`FedAvgSettings` (None: its defaults); keywords override its fields, as in
    ``train_fedavg(X, y, n_clients=4, local_steps=5)``. Its ``shard_ranges`` default to the contiguous
    shards of :func:`course_lib.datasets.contiguous_shards`, the shards ``make_least_squares(n_shards=...,
    shard_shift=...)`` makes non-IID. Runs on ``cluster`` (``n_clients + 1`` ranks) or on a fresh one.
    """
    import course_lib as cl

    settings = validate.settings_from(FedAvgSettings, settings, overrides)
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    settings = _with_shards(settings, len(y))
    n_clients = settings.n_clients
    with contextlib.ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(cl.Cluster(n_clients + 1, graph=nx.star_graph(n_clients)))
        elif cluster.n_workers != n_clients + 1:
            raise ValueError(f"the cluster has {cluster.n_workers} ranks; {n_clients} clients need {n_clients + 1}")
        X_sa = stack.enter_context(cl.SharedArray.from_array(X))
        y_sa = stack.enter_context(cl.SharedArray.from_array(y))
        res = cluster.run(run_fedavg, X_sa, y_sa, settings, timeout=settings.timeout,
                          **({"slow": settings.slow} if settings.slow else {}))
    log = res[0]
    return FedAvgResult(models=np.array(log.models), times=np.array(log.times), answered=log.answered,
                        late=log.late, models_sent=log.models_sent, models_received=log.models_received,
                        sizes=tuple(stop - start for start, stop in settings.shard_ranges),
                        local_steps=settings.local_steps, wall_time=res.wall_time, run=res)


def _with_shards(settings: FedAvgSettings, n_rows: int) -> FedAvgSettings:
    """``settings`` with its clients' rows: the contiguous shards of the data unless given; all within the data."""
    if settings.shard_ranges is None:
        return dataclasses.replace(settings, shard_ranges=contiguous_shards(n_rows, settings.n_clients))
    if any(stop > n_rows for _, stop in settings.shard_ranges):
        raise ValueError(f"FedAvgSettings.shard_ranges {list(settings.shard_ranges)} go past the data's {n_rows} rows")
    return settings


def fedavg_serial(X, y, shard_ranges, n_rounds: int, n_steps: int, lr: float, answered=None) -> np.ndarray:
    """The same rounds in one process (the baseline the processes must equal bit for bit).

    ``answered``: the clients averaged in each round (default: all of them every round), e.g. a
    process run's ``FedAvgResult.answered``. Returns the models, round 0 included."""
    sizes = [stop - start for start, stop in shard_ranges]
    everyone = tuple(range(1, len(shard_ranges) + 1))
    models = [np.zeros(X.shape[1])]
    for t in range(n_rounds):
        clients = everyone if answered is None else answered[t]
        local = [local_steps(models[-1], X[slice(*shard_ranges[k - 1])], y[slice(*shard_ranges[k - 1])],
                             n_steps, lr) for k in clients]
        models.append(fedavg(local, [sizes[k - 1] for k in clients]))
    return np.array(models)
