"""Cost of collectives: exact traffic per rank, and the alpha-beta-gamma time model.

The model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005): a message of n bytes
costs ``alpha + n beta`` (alpha: latency per message, beta: seconds per byte, i.e.
1 / bandwidth), and reducing n bytes costs ``n gamma``. Summing along an algorithm's
critical path gives its time, e.g. with p ranks and an n-byte vector:

==============================  =====================================================
recursive-doubling allreduce    lg p (alpha + n beta + n gamma)
binomial broadcast              ceil(lg p) (alpha + n beta)
ring allgather                  (p-1) alpha + (p-1)/p n beta   (n = gathered bytes)
==============================  =====================================================

Two kinds of functions live here:

* :func:`traffic` - bytes and messages each rank *sends*, exactly, for any p and any
  length n (also when p does not divide n); the tests check the runtime's counters
  against these numbers to the byte.
* :func:`predict` - seconds, from the formulas in Thakur et al. (2005), for plots.
  :func:`measure` estimates alpha, beta and gamma on this machine, and
  :meth:`CostModel.from_network` reads them off an emulated network.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from . import (
    collectives,  # noqa: F401  (registers lesson 02's variants and the ring allreduce's time, ex02_4)
    hardware,  # the links behind PRESETS
)
from .measure import pingpong
from .runtime import registry

__all__ = ["CostModel", "traffic", "rounds", "predict", "measure", "lg", "FORMULAS", "PRESETS", "preset"]


def lg(p: int) -> int:
    """ceil(log2 p): rounds of a doubling algorithm."""
    return (p - 1).bit_length()


@dataclass(frozen=True)
class CostModel:
    alpha: float = 1e-5     # seconds per message
    beta: float = 1e-9      # seconds per byte
    gamma: float = 0.0      # seconds per byte reduced

    @classmethod
    def from_network(cls, network, gamma: float = 0.0) -> "CostModel":
        """alpha and beta of an emulated :class:`course_lib.Network`."""
        return cls(network.latency, 1.0 / network.bandwidth, gamma)

    @classmethod
    def from_hardware(cls, key: str, gamma: float = 0.0) -> "CostModel":
        """alpha = latency and beta = 1 / bandwidth (per direction) of a link of
        :data:`course_lib.hardware.TABLE`, e.g. ``CostModel.from_hardware("100gbe")``."""
        row = hardware.get(key)
        if row.kind != "link":
            raise ValueError(f"{row.name} is a {row.kind}, not a link: it has no message cost")
        return cls(alpha=row.latency_s, beta=row.beta, gamma=gamma)

    def __repr__(self):
        return (f"CostModel(alpha={self.alpha * 1e6:.1f} us, beta={self.beta * 1e9:.3f} ns/B "
                f"({1e-6 / self.beta if self.beta else math.inf:.0f} MB/s), gamma={self.gamma * 1e9:.3f} ns/B)")


# -- named presets: one per link of the hardware table (its only source of numbers) ----------
PRESETS: dict[str, CostModel] = {row.key: CostModel.from_hardware(row.key) for row in hardware.links()}


def preset(key: str, gamma: float = 0.0) -> CostModel:
    """The cost model of a real link by its key in :data:`PRESETS` ("1gbe", "100gbe", "ib_ndr",
    "pcie4_x16", "nvlink4", ...), with ``gamma`` seconds per byte reduced."""
    if key not in PRESETS:
        raise KeyError(f"no preset {key!r}; known: {sorted(PRESETS)}")
    return CostModel(PRESETS[key].alpha, PRESETS[key].beta, gamma)


# -- the rows of the runtime and of lesson 02: one (formula, seconds, rounds, traffic) per algorithm --
# In-network aggregation (lesson 02): its switch is a process outside the hosts' communicator,
# so comm.allreduce cannot run it and it is not a registry row; it is priced and counted alike
# (its traffic arrays have p + 1 entries, the switch last).
IN_NETWORK = {("allreduce", "sharp"): collectives.sharp.ROW}


def _row(collective: str, algorithm: str, field: str):
    try:
        row = IN_NETWORK.get((collective, algorithm)) or registry.lookup(collective, algorithm)
    except ValueError:
        row = None
    value = getattr(row, field, None)
    if value is None:
        what = {"formula": "formula", "seconds": "formula", "rounds": "rounds formula",
                "traffic": "traffic formula"}[field]
        known = sorted((c, a) for c in registry.COLLECTIVES for a, r in registry.algorithms(c).items()
                       if getattr(r, field) is not None)
        raise ValueError(f"no {what} for {collective}/{algorithm}; known: {known}")
    return value


# {(collective, algorithm): the time formula as text}, from the runtime's rows and lesson 02's
FORMULAS = {(c, a): row.formula for c in registry.COLLECTIVES
            for a, row in sorted(registry.algorithms(c).items()) if row.formula}


def predict(collective: str, algorithm: str, p: int, n: float, model: CostModel) -> float:
    """Predicted seconds for ``collective`` with ``algorithm`` on p ranks, n bytes.

    n is the vector each rank contributes (reductions, bcast), or the whole gathered /
    scattered buffer (allgather, scatter, gather, alltoall: p blocks). ``lg p`` is
    ceil(log2 p); for p not a power of two, recursive doubling and halving pay two more
    steps (fold and unfold, Thakur et al. 2005, section 4)."""
    seconds = _row(collective, algorithm, "seconds")
    return float(seconds(p, n, model.alpha, model.beta, model.gamma))


def rounds(collective: str, algorithm: str, p: int) -> int:
    """Communication rounds on the critical path: the longest chain of messages each of
    which waits for the one before it (what the ``alpha`` term counts).

    Defined for the algorithms whose chain does not depend on how a rank serializes its
    receives; :func:`course_lib.collectives.message_rounds.record` measures the same quantity."""
    if p == 1 and (collective, algorithm) not in IN_NETWORK:   # no messages at all, whatever the algorithm
        registry.lookup(collective, algorithm)
        return 0
    return int(_row(collective, algorithm, "rounds")(p))


def traffic(collective: str, algorithm: str, p: int, n: int, itemsize: int = 1, root: int = 0, ndim: int = 1):
    """Exact (bytes_sent, messages_sent) per rank, as two int arrays of length p.

    n counts elements of ``itemsize`` bytes: the vector of each rank for reductions and
    bcast, one block per rank for allgather/gather (equal blocks), and one item per
    destination for scatter/alltoall (equal items). Chunks are cut as np.array_split.

    The binomial scatters inside ``bcast/scatter_allgather`` and ``scatter/binomial`` tell
    the non-roots what they receive with a header of (4 + ndim) int64 words per message
    (``ndim`` of the broadcast array, or of one scattered row). ``allreduce/sharp`` has p + 1
    entries: the p hosts, then the switch."""
    count = _row(collective, algorithm, "traffic")
    if p == 1 and (collective, algorithm) not in IN_NETWORK:
        return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return count(p, n, itemsize, root, ndim)


# -- measuring alpha, beta, gamma -----------------------------------------------------------
def _gamma(n=1 << 20, repeats=5, dtype=np.float64):
    a = np.ones(n // np.dtype(dtype).itemsize, dtype)
    b = np.ones_like(a)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.add(a, b)
        best = min(best, time.perf_counter() - t0)
    return best / n


def measure(cluster, sizes=(0, 1 << 10, 1 << 14, 1 << 17, 1 << 20), repeats: int = 5, **run_kwargs) -> CostModel:
    """alpha and beta from a ping-pong between ranks 0 and 1, gamma from timing ``np.add`` on 1 MiB.

    The line ``t(m) = alpha + m beta`` is fitted to the best of ``repeats`` one-way times by least
    squares on *relative* errors (weights 1 / t): a time's noise grows with the time, and a plain
    fit lets the megabyte messages' noise decide the intercept, which then comes out near 0 or
    negative even though an empty message takes microseconds. If the intercept is still not
    positive, alpha is the smallest message's time (an upper bound on the latency)."""
    m = pingpong(cluster, sizes, repeats, **run_kwargs)
    seconds = np.maximum(m["seconds"], 1e-9)
    slope, intercept = np.polyfit(m["bytes"], seconds, 1, w=1.0 / seconds)
    if intercept <= 0:
        intercept = float(seconds[np.argmin(m["bytes"])])
    return CostModel(alpha=float(intercept), beta=max(float(slope), 1e-15), gamma=_gamma())
