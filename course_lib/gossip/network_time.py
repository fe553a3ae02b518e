r"""Time per iteration on an emulated network: D-PSGD against a synchronous central server.

Lian et al. (2017), "Can decentralized algorithms outperform centralized algorithms?": per
iteration the busiest D-PSGD node moves :math:`2 \deg(i)\, m` bytes (m: the model's bytes), a
central server :math:`2 p m`. On a fast network both iterations cost about their computation;
on a slow one the server's link is the bottleneck, and D-PSGD wins in wall time.

**The alpha-beta model** (Hockney 1994), charged the way :mod:`course_lib.runtime.netem` charges
a message of m bytes on a link of latency :math:`\alpha` and bandwidth :math:`1/\beta`:

* the sender's **uplink** is busy :math:`m\beta`, one message after the other (blocking sends);
* the message reaches the receiver :math:`\alpha` after it left the uplink;
* when the network charges the receiver too (``Network.downlink``: incast), the receiver's
  **downlink** takes one message at a time, :math:`m\beta` each, in the order it reads them:
  a message ready at :math:`r` is delivered at :math:`\max(r, f + m\beta)`, f being when the
  previous one was delivered.

With c the time of one iteration on an instant network (computation and software overhead,
measured), the schedules below give

==========================  ===========================================  ===================
D-PSGD, node of degree d    :math:`c + d\, m\beta + \alpha`              downlink adds 0
server, p workers           :math:`c + (p + 1)\, m\beta + 2\alpha`       downlink adds 0
==========================  ===========================================  ===================

The downlink adds nothing in either, and the functions compute it rather than assume it:
D-PSGD exchanges in the rounds of :func:`~course_lib.gossip.topologies.exchange_order` (one
model arrives per round), and the server's p answers reach it :math:`m\beta` apart, because
its own sends to the workers left :math:`m\beta` apart. Had the p answers left at the same
moment, the downlink would add :math:`(p - 1)\, m\beta`: incast.
"""
from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import numpy as np

__all__ = ["IterationTime", "dpsgd_iteration_time", "server_iteration_time", "charges_receiver",
           "iteration_starts", "seconds_per_iteration", "dpsgd_busiest_bytes", "server_busiest_bytes",
           "STOP_MESSAGE_BYTES"]

# The server's last message to each worker is None (stop): its protocol-5 pickle, as counted.
STOP_MESSAGE_BYTES = len(pickle.dumps(None, protocol=5))


@dataclass(frozen=True)
class IterationTime:
    """Predicted seconds of one iteration: seconds = compute + transfer + latency + incast."""

    compute: float          # c: one iteration on an instant network (measured)
    transfer: float         # the m beta terms on the critical path
    latency: float          # the alpha terms on the critical path
    incast: float           # waiting on a downlink behind other messages (0 when not charged)
    charges_receiver: bool  # whether the network charges the receiver's downlink

    @property
    def seconds(self) -> float:
        return self.compute + self.transfer + self.latency + self.incast

    @property
    def directions(self) -> str:
        return "sender's uplink and receiver's downlink" if self.charges_receiver else "sender's uplink only"


def charges_receiver(network) -> bool:
    """Whether ``network`` charges the receiver's downlink too (incast); a finite network only."""
    return bool(getattr(network, "downlink", False)) and not network.is_instant


def _alpha_and_message_time(network, model_bytes: int) -> tuple[float, float]:
    if network.links:
        raise ValueError("the model assumes one latency and one bandwidth for every link")
    return network.latency, model_bytes / network.bandwidth   # m / inf = 0 on an instant network


def _delivered(ready: list[float], transmit: float) -> float:
    """When a downlink has delivered messages ready at ``ready`` (in read order), transmit s each."""
    free = -math.inf
    for r in ready:
        free = max(r, free + transmit)
    return free


def _queue(ready: list[float], transmit: float, receiver: bool) -> float:
    """Seconds the last message waits on the downlink behind the others (0 if it is not charged).
    Below a nanosecond it is the rounding of the sums, not a queue."""
    wait = _delivered(ready, transmit) - ready[-1] if receiver else 0.0
    return wait if wait > 1e-9 else 0.0


def dpsgd_iteration_time(degree: int, model_bytes: int, network, compute: float = 0.0) -> IterationTime:
    r"""One D-PSGD iteration of a node of degree d, exchanging in the rounds of ``exchange_order``.

    Round k = 1..d: the node puts its model on its uplink (:math:`m\beta`), and so does its
    round-k neighbour, whose model is ready at :math:`c + k\, m\beta + \alpha`. The last one
    gives :math:`c + d\, m\beta + \alpha`; the downlink, when charged, takes one per round.
    """
    alpha, t = _alpha_and_message_time(network, model_bytes)
    ready = [compute + k * t + alpha for k in range(1, degree + 1)]
    receiver = charges_receiver(network)
    return IterationTime(compute, degree * t, alpha, _queue(ready, t, receiver), receiver)


def server_iteration_time(p: int, model_bytes: int, network, compute: float = 0.0) -> IterationTime:
    r"""One iteration of the synchronous server of :func:`~course_lib.gossip.workers.centralised_sgd_worker`.

    The server sends w to workers 1..p one after the other on its uplink: worker k has it at
    :math:`k\, m\beta + \alpha`, computes, and its gradient (its own uplink, :math:`m\beta`)
    is ready at the server at :math:`c + (k + 1)\, m\beta + 2\alpha`. The server reads them in
    rank order; the last gives :math:`c + (p + 1)\, m\beta + 2\alpha`.
    """
    alpha, t = _alpha_and_message_time(network, model_bytes)
    ready = [compute + (k + 1) * t + 2 * alpha for k in range(1, p + 1)]
    receiver = charges_receiver(network)
    return IterationTime(compute, (p + 1) * t, 2 * alpha, _queue(ready, t, receiver), receiver)


def iteration_starts(run, ranks, label: str = "gradient") -> np.ndarray:
    """For each iteration t, the latest start over ``ranks`` of their t-th compute event named
    ``label`` (seconds since the run started, from the runtime's timeline): from then on every
    rank is computing with the model of iteration t."""
    timeline = run.result.timeline if hasattr(run, "result") else run.timeline
    per_rank = [[e.start for e in timeline.of(r, "compute") if e.label == label] for r in ranks]
    steps = {len(starts) for starts in per_rank}
    if len(steps) != 1 or not steps.pop():
        raise ValueError(f"the ranks traced different numbers of {label!r} events: "
                         f"{[len(s) for s in per_rank]}")
    return np.max(np.array(per_rank), axis=0)


def seconds_per_iteration(run, ranks, label: str = "gradient") -> float:
    """Median time between consecutive :func:`iteration_starts` (the median leaves out the first
    iteration's start-up and an iteration where the operating system ran someone else)."""
    return float(np.median(np.diff(iteration_starts(run, ranks, label))))


def dpsgd_busiest_bytes(G, model_bytes: int, steps: int) -> int:
    """Bytes sent + received by the busiest D-PSGD node: 2 max_i deg(i) m per iteration."""
    return 2 * max(d for _, d in G.degree) * model_bytes * steps


def server_busiest_bytes(p: int, model_bytes: int, steps: int) -> int:
    """Bytes sent + received by the server: 2 p m per iteration, plus p stop messages at the end."""
    return 2 * p * model_bytes * steps + p * STOP_MESSAGE_BYTES
