"""Communication complexity and the cost model of one synchronous iteration.

Words (8-byte floats) per iteration with M workers, P = w.size parameters, N samples:

    down (broadcast w):            M * P
    up, reduce = sum or mean:      M * (P + 1)      (P gradient numbers + 1 loss number each)
    up, reduce = collect:          N * (P + 1)      (every per-sample gradient and loss)

Time per iteration on p workers, the source notes' model T(p) = T_compute / p + communication + sync,
with each message costing latency + bytes / bandwidth on the sender's link and on the
receiver's (lesson 00's emulated network). The server's one link sends p copies of w
(d = 8P bytes each) one after the other and receives the p answers (u bytes each) one after
the other: **incast**, many senders and one receiving link. A link sends and receives at
once, and the answers come back as staggered as the copies left (worker k gets w k d / B
after the first), so the busier direction sets the pace, after the first message of the
other (no answer exists before the first copy of w):

    server_link_time(p) = 2 * latency + (p * max(d, u) + min(d, u)) / bandwidth

Reduce by sum (u = 8(P + 1): P numbers and the loss) gives question ex01_4's

    communication(p) = 2 * latency + (8P + p * 8(P + 1)) / bandwidth + p * overhead

(the answers are the busier direction, by 8 bytes). Reduce by collect (u = 8 (N/p)(P + 1))
sends N(P + 1) words into the server whatever p is: incast makes its communication flat in p.
A network that charges the sender only (``Network(downlink=False)``) would instead give
2 * latency + (p * d + u) / bandwidth. The p latencies of one direction overlap (2 in total);
``overhead`` is the software cost of one message at the server (pickling, system calls).

With ``cores`` set (the machine's effective cores), p workers compute the map in
T_compute / min(p, cores): more workers than cores take turns on the same cores.

A straggler s times slower than the others (``slow={rank: s}``: it sleeps s - 1 times as
long as it computed, as a slower machine would take longer) maps its shard in s * T_compute / p
when its compute has a core of its own (p <= cores; with more workers than cores its compute
may also wait its turn, and the model is then a lower bound). Its sleep leaves the cores to
the others. An iteration ends when its slowest map ends:

    sync(p) = max(0, s * T_compute / p - T_compute / min(p, cores))

the time the others wait for it (0 when the straggler is not slower than the shared maps).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_lib.reference.ex00 import fit_latency_bandwidth  # noqa: F401  (lesson 00's fit, question ex00_2)
from course_lib.reference.ex01 import comm_time

from .serial import check_reduce

WORD = 8  # bytes of a float64


def words_per_iteration(n_workers: int, n_params: int, reduce: str = "sum", n_samples: int | None = None):
    """(words down, words up) in one iteration. ``n_samples`` is needed for ``collect``."""
    check_reduce(reduce)
    if n_workers < 1 or n_params < 1:
        raise ValueError("n_workers and n_params must be >= 1")
    down = n_workers * n_params
    if reduce == "collect":
        if n_samples is None:
            raise ValueError("reduce='collect' sends one row per sample: give n_samples")
        up = n_samples * (n_params + 1)
    else:
        up = n_workers * (n_params + 1)
    return down, up


def bytes_per_iteration(n_workers: int, n_params: int, reduce: str = "sum", n_samples: int | None = None) -> int:
    """Payload bytes per iteration (down + up), 8 bytes per word."""
    down, up = words_per_iteration(n_workers, n_params, reduce, n_samples)
    return WORD * (down + up)


def server_link_time(p, down_bytes, up_bytes, latency: float, bandwidth: float, downlink: bool = True):
    """Communication seconds of one iteration at the server's link (see the module doc):
    2 latency + (p max(d, u) + min(d, u)) / B with incast (``downlink``), else 2 latency + (p d + u) / B."""
    p = np.asarray(p, dtype=float)
    d, u = np.asarray(down_bytes, dtype=float), np.asarray(up_bytes, dtype=float)
    if downlink:
        return 2 * latency + (p * np.maximum(d, u) + np.minimum(d, u)) / bandwidth
    return 2 * latency + (p * d + u) / bandwidth


@dataclass
class SpeedupModel:
    """T(p) = T_compute / p + communication(p) + sync(p); all times in seconds.

    The speedup of one MapReduce iteration on p workers (lesson 01). Not to be confused with
    :class:`course_lib.costs.CostModel`, the alpha-beta-gamma model of one collective (lesson 02).

    t_compute: time of the whole map (all N rows) on one worker, per iteration.
    latency, bandwidth: of one message (lesson 00's fit); overhead: software cost per message.
    cores: the machine's effective cores; p workers compute at most min(p, cores) times faster.
    """

    t_compute: float
    latency: float = 0.0
    bandwidth: float = float("inf")
    overhead: float = 0.0
    n_params: int = 1
    cores: float = float("inf")

    def compute(self, p):
        return self.t_compute / np.minimum(np.asarray(p, dtype=float), self.cores)

    def communication(self, p):
        """comm_time(p, P, latency, bandwidth) (question ex01_4) plus the software overhead of p messages."""
        p = np.asarray(p, dtype=float)
        return comm_time(p, self.n_params, self.latency, self.bandwidth) + p * self.overhead

    def sync(self, p, slowest=1.0):
        """Waiting for a worker ``slowest`` = s times slower than the rest:
        max(0, s * T_compute / p - compute(p)) (see the module doc)."""
        if slowest < 1:
            raise ValueError(f"slowest must be >= 1, got {slowest!r}")
        if slowest == 1:
            return np.zeros_like(self.compute(p))
        straggler_map = slowest * self.t_compute / np.asarray(p, dtype=float)
        return np.maximum(0.0, straggler_map - self.compute(p))

    def time(self, p, slowest=1.0):
        """Seconds per iteration on p workers (one of them ``slowest`` times slower)."""
        return self.compute(p) + self.communication(p) + self.sync(p, slowest)

    def speedup(self, p, slowest=1.0):
        """T(1) / T(p), both with the same straggler."""
        return self.time(1, slowest) / self.time(p, slowest)
