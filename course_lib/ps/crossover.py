"""Parameter server or allreduce? Bytes and time per step against the density of the gradient.

The course's source note on data, model and pipeline parallelism (README, "Source notes"): "a
parameter server suits sparse parameter updates; for most deep-learning models the decentralised
collectives are more efficient". One SGD step of ``p`` workers on a model of ``n`` weights, where
each worker's minibatch touches ``k`` keys (density ``d = k / n``), moves:

* on a key-range parameter server (``S`` servers, the busiest holding a share ``s`` of the keys,
  ``s = 1/S`` for even ranges), per worker: a pull (``k`` keys out, ``k`` values back) and a push
  (``k`` keys and ``k`` values out), so ``2 k (b_key + b_val)`` bytes through its network card
  (sent + received); the busiest server sees a share ``s`` of every worker's keys::

      PS busiest rank  =  2 k (b_key + b_val) max(1, p s)

* with a ring allreduce of the dense gradient (Patarasuk & Yuan 2009), every rank sends and
  receives ``2 (p-1)/p n`` values, whatever the density::

      ring, every rank  =  4 (p-1)/p n b_val

They are equal at the crossover density (question ex05_5)::

      d*  =  2 (p-1)/p b_val / ((b_key + b_val) max(1, p s))

Below ``d*`` the parameter server moves fewer bytes; above it the ring does (it sends no keys,
and no rank carries more than its ``2 (p-1)/p`` share). On top of the arrays every PS message
carries an envelope of about a hundred bytes (the pickled tuple of :mod:`.messages`):
:func:`ps_traffic` counts it exactly, message by message, without running anything.

Both ways train the same model: sparse logistic regression on hashed features
(:func:`.workload.minibatch_grad`), each worker's minibatch touching exactly ``k`` keys. With the
sequential model (``tau = 0``) a pull at clock ``t`` sees every update of the steps before ``t``,
which is what the allreduce gives every rank: the two final models agree to rounding.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from course_lib.collectives.sim import payload_bytes
from course_lib.reference.ex05 import crossover_density  # question ex05_5
from course_lib.runtime import registry
from course_lib.runtime.netem import Network

from .config import PSConfig
from .keys import slice_request
from .messages import Ack, Answer, Clock, Done, Pull, Push, Slice, SliceValues, encode
from .node import gather_store, ps_node
from .workload import minibatch_grad

KEY_BYTES = VALUE_BYTES = 8          # int64 keys, float64 values


@dataclass(frozen=True)
class Workload:
    """``steps`` SGD steps of ``p`` workers on ``n_keys`` weights; each worker's minibatch of ``batch``
    examples touches exactly ``touched`` keys at every step (drawn from ``seed``)."""
    n_keys: int
    touched: int
    batch: int = 8
    steps: int = 4
    eta: float = 0.5
    seed: int = 0

    @property
    def density(self) -> float:
        return self.touched / self.n_keys


def minibatch(work: Workload, worker: int, step: int):
    """Worker ``worker``'s minibatch at ``step``: ``(keys, idx, y)``, ``keys`` the sorted touched keys.

    Hashed features as in click logs: ``k = work.touched`` distinct keys are drawn, shuffled and dealt
    round-robin into ``batch`` examples of ``ceil(k / batch)`` features each, so the examples together
    touch exactly those ``k`` keys (an example never holds a key twice). Labels follow a fixed
    hidden model."""
    k, b = work.touched, work.batch
    rng = np.random.default_rng([work.seed, worker, step])
    keys = np.sort(rng.choice(work.n_keys, size=k, replace=False))
    nnz = -(-k // b)
    idx = np.resize(rng.permutation(keys), b * nnz).reshape(b, nnz)
    hidden = np.random.default_rng([work.seed, 1 << 20]).normal(0, 1, work.n_keys) / np.sqrt(nnz)
    y = (rng.random(b) < 1 / (1 + np.exp(-hidden[idx].sum(1)))).astype(float)
    return keys, idx, y


# ---------------------------------------------------------------------------- the two ways
def ps_sgd(kv, work: Workload) -> dict:
    """A worker of the parameter server: pull the touched keys, gradient, push ``-eta g``, next clock."""
    seconds = []
    for t in range(work.steps):
        start = time.perf_counter()
        keys, idx, y = minibatch(work, kv.w, t)
        w = kv.wait(kv.pull(keys))
        with kv.comm.compute("gradient"):
            g, _ = minibatch_grad(idx, y, keys, w)
        kv.push(keys, -work.eta * g)
        kv.advance()
        seconds.append(time.perf_counter() - start)
    return {"step_seconds": seconds}


def ring_sgd(comm, n_servers: int, work: Workload) -> dict:
    """The same steps with a ring allreduce of the dense gradient among the worker ranks.

    Ranks ``0 .. n_servers-1`` (the PS run's servers) stay out: every rank splits, the workers
    form their own communicator. Each rank returns its sent-bytes row right after the split, so
    the split's own messages can be taken off the run's counters."""
    sub = comm.Split(color=int(comm.rank >= n_servers), key=comm.rank)
    after_split = comm.stats.bytes[comm.rank].copy()
    if comm.rank < n_servers:
        return {"after_split": after_split}
    w, seconds = np.zeros(work.n_keys), []
    for t in range(work.steps):
        start = time.perf_counter()
        keys, idx, y = minibatch(work, sub.rank, t)
        with comm.compute("gradient"):
            g, _ = minibatch_grad(idx, y, keys, w[keys])
            dense = np.zeros(work.n_keys)
            dense[keys] = -work.eta * g
        w += sub.allreduce(dense, algorithm="ring")
        seconds.append(time.perf_counter() - start)
    return {"after_split": after_split, "w": w, "step_seconds": seconds}


@dataclass(frozen=True)
class Comparison:
    """One density, both ways: measured bytes per step at the busiest rank (sent + received, from the
    runtime's counters) and seconds per step (median over the workers' steps after the first), the
    final models, and the byte matrices of the two runs."""
    work: Workload
    p: int
    busiest_share: float
    ps_bytes: float
    ring_bytes: float
    ps_seconds: float
    ring_seconds: float
    ps_w: np.ndarray
    ring_w: np.ndarray
    ps_matrix: np.ndarray
    ring_matrix: np.ndarray

    @property
    def density(self) -> float:
        return self.work.density


def busiest_bytes(matrix: np.ndarray, ranks) -> int:
    """Bytes through the busiest of ``ranks``: what it sent plus what it received."""
    m = np.asarray(matrix)
    return int(max(m[r].sum() + m[:, r].sum() for r in ranks))


def compare(cluster, cfg: PSConfig, work: Workload, network: Network | None = None) -> Comparison:
    """Train ``work`` on the parameter server of ``cfg`` (sequential model), then with a ring allreduce
    among its ``cfg.n_workers`` worker ranks, on the same processes and the same (emulated) network."""
    if cfg.tau != 0 or cfg.n_keys != work.n_keys:
        raise ValueError("compare needs the sequential model (tau=0) and cfg.n_keys == work.n_keys")
    net = {} if network is None else {"network": network}
    S, p = cfg.n_servers, cfg.n_workers
    ps = cluster.run(ps_node, cfg, ps_sgd, work, **net)
    ring = cluster.run(ring_sgd, S, work, **net)
    ring_matrix = np.asarray(ring.stats.bytes) - np.stack([r["after_split"] for r in ring])
    load = cfg.ring().load()
    return Comparison(
        work=work, p=p, busiest_share=max(load.values()) / work.n_keys,
        ps_bytes=busiest_bytes(ps.stats.bytes, range(cfg.size)) / work.steps,
        ring_bytes=busiest_bytes(ring_matrix, range(S, S + p)) / work.steps,
        ps_seconds=_median_step(r["result"]["step_seconds"] for r in ps[S:]),
        ring_seconds=_median_step(r["step_seconds"] for r in ring[S:]),
        ps_w=gather_store(list(ps), cfg).ravel(), ring_w=ring[S]["w"],
        ps_matrix=np.asarray(ps.stats.bytes), ring_matrix=ring_matrix)


def _median_step(per_worker) -> float:
    """Median seconds per step over every worker's steps but its first (start-up); the median, because
    on a shared machine one step now and then waits for a core."""
    return float(np.median([x for s in per_worker for x in (s[1:] if len(s) > 1 else s)]))


def sweep(cluster, cfg: PSConfig, densities, network: Network | None = None, **work_kw) -> list[Comparison]:
    """:func:`compare` at each density (touched keys ``round(d n)``, at least one)."""
    out = []
    for d in densities:
        work = Workload(cfg.n_keys, max(1, round(d * cfg.n_keys)), **work_kw)
        out.append(compare(cluster, cfg, work, network))
    return out


# ---------------------------------------------------------------------------- the models
def ps_step_bytes(touched, p: int, busiest_share: float, key_bytes: int = KEY_BYTES,
                  value_bytes: int = VALUE_BYTES) -> float:
    """Arrays through the busiest PS rank per step: ``2 k (b_key + b_val) max(1, p s)`` (no envelopes)."""
    return 2 * np.asarray(touched) * (key_bytes + value_bytes) * max(1.0, p * busiest_share)


def ring_step_bytes(n_keys: int, p: int, value_bytes: int = VALUE_BYTES) -> float:
    """Bytes through every rank of a ring allreduce of ``n`` values: ``4 (p-1)/p n b_val``."""
    return 4 * (p - 1) / p * n_keys * value_bytes


def ring_step_seconds(n_keys: int, p: int, network: Network, value_bytes: int = VALUE_BYTES) -> float:
    """Lesson 02's ring row, ``2(p-1) alpha + 2(p-1)/p n beta``, on the emulated network."""
    row = registry.lookup("allreduce", "ring")
    return row.seconds(p, n_keys * value_bytes, network.latency, 1 / network.bandwidth, 0.0)


def ps_step_seconds(touched, p: int, busiest_share: float, network: Network, key_bytes: int = KEY_BYTES,
                    value_bytes: int = VALUE_BYTES) -> float:
    """One PS step on an emulated network (:mod:`netem`), charging each message's sender ``bytes / bandwidth``.

    The emulator also makes each receiver's link take one message at a time (incast: the pulls and
    pushes of the ``p`` workers reach the busiest server together); this model leaves that queue out,
    with the per-message cost of Python, so a measured step sits above it (lesson 05 prints by how much).

    The worker sends its pull (``k b_key``), the request crosses (``alpha``), the busiest server
    answers its ``p`` workers one after the other (``p s k b_val``), the answer crosses (``alpha``),
    then the worker sends its push (``k (b_key + b_val)``)::

        T_PS = 2 alpha + (k (2 b_key + b_val) + p s k b_val) beta"""
    k, beta = np.asarray(touched), 1 / network.bandwidth
    return 2 * network.latency + (k * (2 * key_bytes + value_bytes) + p * busiest_share * k * value_bytes) * beta


def measured_crossover(densities, ps_bytes, ring_bytes) -> float:
    """The density where the measured PS bytes cross the ring's: interpolated in log density between
    the last density where the PS is cheaper and the next (nan if they do not cross)."""
    d, r = np.log(np.asarray(densities, float)), np.log(np.asarray(ps_bytes) / np.asarray(ring_bytes))
    for i in range(len(d) - 1):
        if r[i] < 0 <= r[i + 1]:
            return float(np.exp(d[i] + (d[i + 1] - d[i]) * (0 - r[i]) / (r[i + 1] - r[i])))
    return float("nan")


# ---------------------------------------------------------------------------- exact PS traffic
@dataclass(frozen=True)
class Traffic:
    """Bytes each rank sends each rank (``[src, dst]``): the arrays alone, and arrays + envelopes."""
    arrays: np.ndarray
    total: np.ndarray
    messages: np.ndarray


def ps_traffic(cfg: PSConfig, work: Workload) -> Traffic:
    """The bytes :func:`ps_sgd` must send on the parameter server of ``cfg``, computed without running it.

    Per worker and step (timestamps ``2t`` for the pull, ``2t + 1`` for the push, clock ``t``): one
    :class:`.messages.Pull` to each server whose ranges the keys hit, one :class:`.messages.Answer`
    back, one :class:`.messages.Push` and one :class:`.messages.Ack`, then a :class:`.messages.Clock`
    to every server; at the end a :class:`.messages.Done` to every server. Each message counts as the
    runtime counts it (pickle plus out-of-band arrays)."""
    size, S = cfg.size, cfg.n_servers
    ring = cfg.ring()
    arrays = np.zeros((size, size), dtype=np.int64)
    total, messages = np.zeros_like(arrays), np.zeros_like(arrays)

    def count(src, dst, msg, array_bytes=0):
        total[src, dst] += payload_bytes(encode(msg))
        arrays[src, dst] += array_bytes
        messages[src, dst] += 1

    for w in range(cfg.n_workers):
        me = cfg.worker_rank(w)
        for t in range(work.steps):
            keys, _, _ = minibatch(work, w, t)
            values = np.zeros(len(keys))
            by_server: dict[int, list[Slice]] = {}
            for pid, (arc, ks, vs) in enumerate(slice_request(ring.points, keys, values)):
                by_server.setdefault(ring.chain(arc)[0], []).append(Slice(pid, arc, ks, vs))
            for server, mine in by_server.items():
                n_keys = sum(len(s.keys) for s in mine)
                count(me, server, Pull(w, 2 * t, t, [Slice(s.pid, s.arc, s.keys, None) for s in mine], 0),
                      n_keys * KEY_BYTES)
                count(server, me, Answer(2 * t, [SliceValues(s.pid, s.values) for s in mine]), n_keys * VALUE_BYTES)
                count(me, server, Push(w, 2 * t + 1, t, mine, 0), n_keys * (KEY_BYTES + VALUE_BYTES))
                count(server, me, Ack(2 * t + 1, [s.pid for s in mine]))
            for server in range(S):
                count(me, server, Clock(w, t + 1))
        for server in range(S):
            count(me, server, Done(w))
    return Traffic(arrays, total, messages)


__all__ = ["Workload", "minibatch", "ps_sgd", "ring_sgd", "Comparison", "compare", "sweep", "busiest_bytes",
           "ps_step_bytes", "ring_step_bytes", "ps_step_seconds", "ring_step_seconds", "crossover_density",
           "measured_crossover", "Traffic", "ps_traffic"]
