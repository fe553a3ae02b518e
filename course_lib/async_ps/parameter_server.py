"""The asynchronous parameter server: rank 0 serves, ranks 1..M are workers.

A worker loops: receive ``w`` (and the version it has), draw a minibatch from its rows,
compute the gradient, push ``(g, version)`` to the server. The server applies a gradient
the moment it arrives and answers with the current ``w``, so nobody waits for anybody.
The price is *staleness*: when the server applies a gradient computed on version ``v``
while it already holds version ``t``, the gradient is ``t - v`` updates old:

    staleness = server version when applied - version the gradient was computed on  (>= 0)

Policies (``AsyncSettings.policy``):

* ``"async"``: apply every gradient with step ``lr`` (Hogwild!-style PS; Dean et al. 2012).
* ``"staleness_aware"``: step ``lr / (staleness + 1)`` (Zhang et al. 2016).
* ``"drop"``: discard gradients with staleness above ``max_staleness``.
* ``"sync"``: synchronous SGD with ``n_backup`` backup workers (Chen et al. 2016): each
  round waits for the first ``N = M - n_backup`` fresh gradients, applies their mean,
  sends the new ``w`` to everybody; late gradients are dropped, and a worker still
  computing abandons its work when the new ``w`` arrives.

Every gradient carries the worker's clock reading when it was sent (``comm.now()``, seconds since
the run started: the clock of the run's timeline, shared by all ranks), and the server notes the
time of every update it applies, so staleness can be drawn against wall time, worker by worker.

A worker that dies (``Cluster(..., on_failure="continue")``) shows up at the server as
:class:`course_lib.PeerLost`; the server records it, hands the dead worker's rows to the
live worker with the fewest rows, and finishes with the others.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from course_lib.reference.ex03 import apply_update, staleness_aware_lr  # questions ex03_1, ex03_2

from .records import Record, constant_lr
from .settings import POLICIES, AsyncSettings
from .sgd_problems import batch_gradient, batch_rng, loss, shards

__all__ = ["POLICIES", "AsyncSettings", "Record", "ServerState", "apply_update", "constant_lr", "run_ps",
           "staleness_aware_lr"]


@dataclass
class ServerState:
    """What the server holds: the weights, their version, the step size, the records."""

    w: np.ndarray
    lr: float
    version: int = 0
    records: list = field(default_factory=list)


# ----------------------------------------------------------------------------- worker
def _pause(comm, seconds: float, interruptible: bool):
    """Emulated compute time. If interruptible, return a message that arrived meanwhile."""
    if seconds <= 0:
        return None
    if not interruptible:
        time.sleep(seconds)
        return None
    deadline = time.perf_counter() + seconds
    from course_lib import PeerLost

    while True:
        try:
            if comm.iprobe(source=0):
                return comm.recv(source=0)
        except PeerLost as e:  # another worker died (full mesh): not our business
            if e.rank == 0:
                raise
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        time.sleep(min(left, 0.0005))


def _worker(comm, X_sa, y_sa, settings: AsyncSettings):
    """Pull ``w``, push a minibatch gradient, until the server says stop; the worker's counters.

    Under ``"sync"`` the emulated compute is interruptible: a new round's ``w`` arriving meanwhile
    means this gradient came too late, and the worker drops it for the new round."""
    X, y = X_sa.array, y_sa.array
    rng = batch_rng(settings.seed, comm.rank)
    time_rng = np.random.default_rng([settings.seed, comm.rank, 1])
    interruptible = settings.policy == "sync"
    computed = abandoned = 0
    sent = []  # the run clock when each gradient left (the server gets the same number)
    msg = comm.recv(source=0)
    while msg[0] != "stop":
        _, version, w, rows = msg
        batch = rng.choice(rows, settings.batch_size)
        pause = settings.compute_time
        if settings.compute_dist == "exp":
            pause = time_rng.exponential(settings.compute_time)
        with comm.compute("gradient"):
            g = batch_gradient(X, y, batch, w)
            interrupt = _pause(comm, pause, interruptible)
        if interrupt is not None:  # sync round closed without us: drop this gradient
            abandoned += 1
            msg = interrupt
            continue
        computed += 1
        sent.append(comm.now())
        comm.send(("grad", g, version, sent[-1]), 0)
        msg = comm.recv(source=0)
    comm.send(("bye",), 0)
    return {"computed": computed, "abandoned": abandoned, "sent": sent}


# ----------------------------------------------------------------------------- server
class _Server:
    def __init__(self, comm, X, y, settings: AsyncSettings):
        self.comm, self.X, self.y, self.settings = comm, X, y, settings
        self.state = ServerState(w=np.zeros(X.shape[1]), lr=settings.lr)
        self.live = set(range(1, comm.size))
        self.dead: list[int] = []
        self.rows = {r: [s] for r, s in zip(sorted(self.live), shards(len(y), len(self.live)))}
        self.losses = [(comm.now(), 0, loss(X, y, self.state.w))]
        self.reassigned: list[tuple] = []
        self.sent: list[float] = []          # the worker's send time of each record, in record order
        self.update_times: list[float] = []  # when the server reached version 1, 2, ...

    def note_update(self):
        """The server just moved to a new version (or several, if an apply step bumped it so): note when."""
        while len(self.update_times) < self.state.version:
            self.update_times.append(self.comm.now())

    def rows_of(self, r):
        return np.concatenate(self.rows[r])

    def record_loss(self):
        v = self.state.version
        if v % self.settings.loss_every == 0:
            self.losses.append((self.comm.now(), v, loss(self.X, self.y, self.state.w)))

    def send_w(self, r):
        from course_lib import PeerLost
        try:
            self.comm.send(("w", self.state.version, self.state.w, self.rows_of(r)), r)
        except (PeerLost, OSError):
            self.lost(r)

    def lost(self, r):
        """Worker r died: record it and give its rows to the live worker with fewest rows."""
        if r not in self.live:
            return
        self.live.discard(r)
        self.dead.append(r)
        if self.live:
            heir = min(sorted(self.live), key=lambda k: sum(len(s) for s in self.rows[k]))
            self.rows[heir].extend(self.rows.pop(r))
            self.reassigned.append((r, heir, self.comm.now()))

    def recv(self):
        """Next message from any live worker, or None if a worker was lost meanwhile."""
        from course_lib import PeerLost
        try:
            return self.comm.recv_any()
        except PeerLost as e:
            self.lost(getattr(e, "rank", None))
            return None

    def finish(self):
        """Tell every live worker to stop and wait for its goodbye (drains the pipes)."""
        from course_lib import PeerLost
        for r in sorted(self.live):
            try:
                self.comm.send(("stop",), r)
            except (PeerLost, OSError):
                self.lost(r)
        pending = set(self.live)
        while pending:
            got = self.recv()
            if got is None:
                pending &= self.live
                continue
            src, msg = got
            if msg[0] == "bye":
                pending.discard(src)


def _serve_async(srv: _Server, step_size):
    """Apply each gradient as it comes (or drop it, if too stale under ``"drop"``) and answer its sender."""
    st, settings = srv.state, srv.settings
    for r in sorted(srv.live):
        srv.send_w(r)
    while st.version < settings.n_updates and srv.live:
        got = srv.recv()
        if got is None:
            continue
        src, (_, g, v, sent) = got
        t = srv.comm.now()
        srv.sent.append(sent)
        if settings.policy == "drop" and st.version - v > settings.max_staleness:
            st.records.append(Record(src, v, st.version - v, t, False, 0.0))
        else:
            settings.apply(st, g, v, src, t, step_size)
            srv.note_update()
            srv.record_loss()
        srv.send_w(src)


def _serve_sync(srv: _Server):
    """Rounds: send ``w`` to all, average the first ``live - n_backup`` fresh gradients; the rounds' waits."""
    st, settings = srv.state, srv.settings
    waits = []
    while st.version < settings.n_updates and srv.live:
        need = max(1, min(len(srv.live) - settings.n_backup, len(srv.live)))
        for r in sorted(srv.live):
            srv.send_w(r)
        start = srv.comm.now()
        accepted = {}
        while len(accepted) < need and srv.live:
            got = srv.recv()
            if got is None:
                need = min(need, len(srv.live))
                continue
            src, (_, g, v, sent) = got
            t = srv.comm.now()
            srv.sent.append(sent)
            if v == st.version:
                accepted[src] = g
                st.records.append(Record(src, v, 0, t, True, st.lr))
            else:  # a backup's gradient from an earlier round
                st.records.append(Record(src, v, st.version - v, t, False, 0.0))
        if not accepted:
            break
        waits.append(srv.comm.now() - start)
        g = np.mean([accepted[r] for r in sorted(accepted)], axis=0)
        st.w -= st.lr * g
        st.version += 1
        srv.note_update()
        srv.record_loss()
    return waits


def run_ps(comm, X_sa, y_sa, settings: AsyncSettings | None = None):
    """SPMD entry point for ``cluster.run``: rank 0 is the server, the others are workers.

    ``X_sa, y_sa``: :class:`course_lib.SharedArray` with the data (workers read their rows
    in place). ``settings``: the run's :class:`AsyncSettings`, whole (its ``slow``, ``faults``,
    ``start_method`` and ``timeout`` are the caller's business with the cluster; None: the defaults).
    Rank 0 returns a dict (see :class:`PSResult`), workers return their counters.
    """
    settings = AsyncSettings() if settings is None else settings
    if not isinstance(settings, AsyncSettings):
        raise TypeError(f"run_ps takes an AsyncSettings, got {type(settings).__name__}")
    comm.barrier()  # start together: a late-starting worker would look stale for no reason
    if comm.rank != 0:
        return _worker(comm, X_sa, y_sa, settings)
    X, y = X_sa.array, y_sa.array
    srv = _Server(comm, X, y, settings)
    waits = []
    if settings.policy == "sync":
        waits = _serve_sync(srv)
    else:
        step_size = settings.step_size
        if step_size is None:
            step_size = staleness_aware_lr if settings.policy == "staleness_aware" else constant_lr
        _serve_async(srv, step_size)
    if srv.losses[-1][1] != srv.state.version:
        srv.losses.append((comm.now(), srv.state.version, loss(X, y, srv.state.w)))
    srv.finish()
    return {"w": srv.state.w, "version": srv.state.version,
            "records": [tuple(r) for r in srv.state.records], "losses": srv.losses,
            "waits": waits, "dead": srv.dead, "reassigned": srv.reassigned,
            "sent": srv.sent, "update_times": srv.update_times}
