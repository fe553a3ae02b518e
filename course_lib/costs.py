"""Cost of collectives: exact traffic per rank, and the alpha-beta-gamma time model.

The model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005): a message of n bytes
costs ``alpha + n beta`` (alpha: latency per message, beta: seconds per byte, i.e.
1 / bandwidth), and reducing n bytes costs ``n gamma``. Summing along an algorithm's
critical path gives its time, e.g. with p ranks and an n-byte vector:

==========================  =====================================================
ring allreduce              2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
binomial broadcast          ceil(lg p) (alpha + n beta)
ring allgather              (p-1) alpha + (p-1)/p n beta   (n = gathered bytes)
==========================  =====================================================

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

from .collectives._p2p import chunk_sizes, fold_roles
from .measure import pingpong
from .reference.ex02 import ring_allreduce_time

__all__ = ["CostModel", "traffic", "rounds", "predict", "measure", "lg", "FORMULAS"]


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

    def __repr__(self):
        return (f"CostModel(alpha={self.alpha * 1e6:.1f} us, beta={self.beta * 1e9:.3f} ns/B "
                f"({1e-6 / self.beta if self.beta else math.inf:.0f} MB/s), gamma={self.gamma * 1e9:.3f} ns/B)")


# -- time: Thakur, Rabenseifner & Gropp (2005) ------------------------------------------
FORMULAS = {
    ("barrier", "token_ring"): "(2p-1) alpha",
    ("barrier", "dissemination"): "lg p alpha",
    ("bcast", "flat"): "(p-1)(alpha + n beta)",
    ("bcast", "binomial"): "lg p (alpha + n beta)",
    ("bcast", "scatter_allgather"): "(lg p + p - 1) alpha + 2 (p-1)/p n beta",
    ("scatter", "flat"): "(p-1) alpha + (p-1)/p n beta",
    ("scatter", "binomial"): "lg p alpha + (p-1)/p n beta",
    ("gather", "flat"): "(p-1) alpha + (p-1)/p n beta",
    ("gather", "binomial"): "lg p alpha + (p-1)/p n beta",
    ("allgather", "ring"): "(p-1) alpha + (p-1)/p n beta",
    ("allgather", "recursive_doubling"): "lg p alpha + (p-1)/p n beta",
    ("allgather", "bruck"): "lg p alpha + (p-1)/p n beta",
    ("alltoall", "pairwise"): "(p-1) alpha + (p-1)/p n beta",
    ("reduce", "flat"): "(p-1)(alpha + n beta + n gamma)",
    ("reduce", "binomial"): "lg p (alpha + n beta + n gamma)",
    ("reduce_scatter", "ring"): "(p-1) alpha + (p-1)/p n (beta + gamma)",
    ("reduce_scatter", "pairwise"): "(p-1) alpha + (p-1)/p n (beta + gamma)",
    ("reduce_scatter", "recursive_halving"): "lg p alpha + (p-1)/p n (beta + gamma)",
    ("allreduce", "reduce_bcast"): "2 lg p alpha + 2 lg p n beta + lg p n gamma",
    ("allreduce", "recursive_doubling"): "lg p (alpha + n beta + n gamma)",
    ("allreduce", "ring"): "2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    ("allreduce", "rabenseifner"): "2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    ("scan", "linear"): "(p-1)(alpha + n beta + n gamma)",
    ("scan", "recursive_doubling"): "lg p (alpha + n beta + n gamma)",
}


def predict(collective: str, algorithm: str, p: int, n: float, model: CostModel) -> float:
    """Predicted seconds for ``collective`` with ``algorithm`` on p ranks, n bytes.

    n is the vector each rank contributes (reductions, bcast), or the whole gathered /
    scattered buffer (allgather, scatter, gather, alltoall: p blocks). ``lg p`` is
    ceil(log2 p); for p not a power of two, recursive doubling and halving pay two more
    steps (fold and unfold, Thakur et al. 2005, section 4)."""
    key = (collective, algorithm)
    if key not in FORMULAS:
        raise ValueError(f"no formula for {collective}/{algorithm}; known: {sorted(FORMULAS)}")
    a, b, c = model.alpha, model.beta, model.gamma
    if key == ("allreduce", "ring"):
        return float(ring_allreduce_time(p, n, a, b, c))   # question ex02_4
    L = lg(p)
    f = (p - 1) / p
    pow2 = p & (p - 1) == 0
    t = {
        ("barrier", "token_ring"): (2 * p - 1) * a if p > 1 else 0.0,
        ("barrier", "dissemination"): L * a,
        ("bcast", "flat"): (p - 1) * (a + n * b),
        ("bcast", "binomial"): L * (a + n * b),
        ("bcast", "scatter_allgather"): (L + p - 1) * a + 2 * f * n * b if p > 1 else 0.0,
        ("scatter", "flat"): (p - 1) * a + f * n * b,
        ("scatter", "binomial"): L * a + f * n * b,
        ("gather", "flat"): (p - 1) * a + f * n * b,
        ("gather", "binomial"): L * a + f * n * b,
        ("allgather", "ring"): (p - 1) * a + f * n * b,
        ("allgather", "recursive_doubling"): L * a + f * n * b,
        ("allgather", "bruck"): L * a + f * n * b,
        ("alltoall", "pairwise"): (p - 1) * a + f * n * b,
        ("reduce", "flat"): (p - 1) * (a + n * b + n * c),
        ("reduce", "binomial"): L * (a + n * b + n * c),
        ("reduce_scatter", "ring"): (p - 1) * a + f * n * (b + c),
        ("reduce_scatter", "pairwise"): (p - 1) * a + f * n * (b + c),
        ("reduce_scatter", "recursive_halving"): L * a + f * n * (b + c),
        ("allreduce", "reduce_bcast"): 2 * L * a + 2 * L * n * b + L * n * c,
        ("allreduce", "recursive_doubling"): L * (a + n * b + n * c),
        ("allreduce", "rabenseifner"): 2 * L * a + 2 * f * n * b + f * n * c,
        ("scan", "linear"): (p - 1) * (a + n * b + n * c),
        ("scan", "recursive_doubling"): L * (a + n * b + n * c),
    }[key]
    if not pow2:
        # fold p down to p2 = 2^(L-1) ranks, run there, unfold (Thakur et al. 2005, sec. 4)
        L2 = L - 1
        fold = a + n * b + n * c
        folded = {
            ("allgather", "recursive_doubling"): L2 * a + f * n * b + (a + n / p * b) + (a + f * n * b),
            ("reduce_scatter", "recursive_halving"): L2 * a + f * n * (b + c) + fold + (a + n / p * b),
            ("allreduce", "recursive_doubling"): L2 * (a + n * b + n * c) + fold + (a + n * b),
            ("allreduce", "rabenseifner"): 2 * L2 * a + 2 * f * n * b + f * n * c + fold + (a + n * b),
        }
        t = folded.get(key, t)
    return float(t)


def rounds(collective: str, algorithm: str, p: int) -> int:
    """Communication rounds on the critical path: the longest chain of messages each of
    which waits for the one before it (what the ``alpha`` term counts).

    Defined for the algorithms whose chain does not depend on how a rank serializes its
    receives; :func:`course_lib.collectives.schedule.record` measures the same quantity."""
    if p == 1:
        return 0
    L = lg(p)
    p2 = 1 << (p.bit_length() - 1)
    lg2 = p2.bit_length() - 1
    fold = 0 if p == p2 else 2                       # fold in, unfold out
    table = {
        ("barrier", "token_ring"): 2 * p - 1, ("barrier", "dissemination"): L,
        ("bcast", "flat"): p - 1, ("bcast", "binomial"): L,
        ("scatter", "flat"): p - 1, ("scatter", "binomial"): L,
        ("allgather", "ring"): p - 1, ("allgather", "bruck"): L, ("allgather", "recursive_doubling"): lg2 + fold,
        ("alltoall", "pairwise"): p - 1,
        ("reduce_scatter", "ring"): p - 1, ("reduce_scatter", "pairwise"): p - 1,
        ("reduce_scatter", "recursive_halving"): lg2 + fold,
        ("allreduce", "ring"): 2 * (p - 1), ("allreduce", "recursive_doubling"): lg2 + fold,
        ("allreduce", "rabenseifner"): 2 * lg2 + fold,
        ("scan", "linear"): p - 1, ("scan", "recursive_doubling"): L,
    }
    try:
        return table[(collective, algorithm)]
    except KeyError:
        raise ValueError(f"no rounds formula for {collective}/{algorithm}") from None


# -- exact traffic ------------------------------------------------------------------------
def _children(vr: int, p: int) -> list[int]:
    """Children of relative rank vr in the binomial tree used by bcast/scatter."""
    if vr == 0:
        m = 1
        while m < p:
            m *= 2
    else:
        m = vr & -vr
    out, m = [], m // 2
    while m >= 1:
        if vr + m < p:
            out.append(vr + m)
        m //= 2
    return out


def _halving_ranges(v: int, p2: int):
    """(keep, give) virtual-rank ranges of v in each round of recursive halving."""
    lo, hi, m, out = 0, p2, p2 // 2, []
    while m >= 1:
        mid = lo + m
        keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
        out.append((keep, give))
        lo, hi = keep
        m //= 2
    return out


def traffic(collective: str, algorithm: str, p: int, n: int, itemsize: int = 1, root: int = 0, ndim: int = 1):
    """Exact (bytes_sent, messages_sent) per rank, as two int arrays of length p.

    n counts elements of ``itemsize`` bytes: the vector of each rank for reductions and
    bcast, one block per rank for allgather/gather (equal blocks), and one item per
    destination for scatter/alltoall (equal items). Chunks are cut as np.array_split.

    The binomial scatters inside ``bcast/scatter_allgather`` and ``scatter/binomial`` tell
    the non-roots what they receive with a header of (4 + ndim) int64 words per message
    (``ndim`` of the broadcast array, or of one scattered row)."""
    head = 8 * (4 + ndim)
    B = np.zeros(p, dtype=np.int64)
    M = np.zeros(p, dtype=np.int64)
    key = (collective, algorithm)

    def add(r, nbytes_elems, msgs=1):
        B[r] += nbytes_elems * itemsize
        M[r] += msgs

    c = chunk_sizes(n, p)
    if p == 1:
        return B, M
    if key == ("barrier", "token_ring"):
        M[:] = 2
        M[p - 1] = 1
    elif key == ("barrier", "dissemination"):
        M[:] = lg(p)
    elif key == ("bcast", "flat"):
        add(root, n * (p - 1), p - 1)
    elif key == ("bcast", "binomial"):
        for r in range(p):
            k = len(_children((r - root) % p, p))
            add(r, n * k, k)
    elif key == ("bcast", "scatter_allgather"):
        for r in range(p):
            vr = (r - root) % p
            for ch in _children(vr, p):                       # binomial scatter of subtrees
                low = ch & -ch
                add(r, sum(c[ch:min(ch + low, p)]))
                B[r] += head
            add(r, n - c[(vr + 1) % p], p - 1)                 # ring allgather
    elif key == ("scatter", "flat") or key == ("gather", "flat"):
        if collective == "scatter":
            add(root, n * (p - 1), p - 1)
        else:
            for r in range(p):
                if r != root:
                    add(r, n)
    elif key == ("gather", "binomial"):
        for r in range(p):
            vr = (r - root) % p
            if vr:
                low = vr & -vr
                add(r, n * (min(vr + low, p) - vr))
    elif key == ("scatter", "binomial"):                      # an array of p rows of n items
        for r in range(p):
            for ch in _children((r - root) % p, p):
                low = ch & -ch
                add(r, n * (min(ch + low, p) - ch))
                B[r] += head
    elif key in (("allgather", "ring"), ("allgather", "bruck")):
        for r in range(p):
            add(r, n * (p - 1), p - 1 if algorithm == "ring" else lg(p))
    elif key == ("allgather", "recursive_doubling"):
        p2, extra, virt, real = fold_roles(p)
        for r in range(p):
            if r < 2 * extra and r % 2 == 0:
                add(r, n)
                continue
            v, m = virt[r], 1
            while m < p2:                  # send every block held: those of my aligned group of m
                group = [u for u in range(p2) if u // m == v // m]
                add(r, n * sum(2 if u < extra else 1 for u in group))
                m *= 2
            if r < 2 * extra:
                add(r, n * (p - 1))        # unfold: everything but the partner's own block
    elif key == ("alltoall", "pairwise"):
        for r in range(p):
            add(r, n * (p - 1), p - 1)
    elif key in (("reduce", "binomial"), ("reduce", "flat")):
        for r in range(p):
            if r != root:
                add(r, n)
    elif key in (("reduce_scatter", "ring"), ("reduce_scatter", "pairwise")):
        for r in range(p):
            add(r, n - c[r], p - 1)
    elif key == ("reduce_scatter", "recursive_halving"):
        p2, extra, virt, real = fold_roles(p)
        bounds = np.cumsum([0] + c)

        def start(v):
            return int(bounds[2 * v if v < extra else v + extra])

        for r in range(p):
            if r < 2 * extra and r % 2 == 0:
                add(r, n)
                continue
            for keep, give in _halving_ranges(virt[r], p2):
                add(r, start(give[1]) - start(give[0]))
            if r < 2 * extra:
                add(r, c[r - 1])
    elif key == ("allreduce", "ring"):
        for r in range(p):
            add(r, 2 * n - c[r] - c[(r + 1) % p], 2 * (p - 1))
    elif key == ("allreduce", "recursive_doubling"):
        p2, extra, virt, real = fold_roles(p)
        for r in range(p):
            if r < 2 * extra and r % 2 == 0:
                add(r, n)
            else:
                k = lg(p2) + (1 if r < 2 * extra else 0)
                add(r, n * k, k)
    elif key == ("allreduce", "reduce_bcast"):
        for r in range(p):
            k = (1 if r != 0 else 0) + len(_children(r, p))
            add(r, n * k, k)
    elif key == ("allreduce", "rabenseifner"):
        p2, extra, virt, real = fold_roles(p)
        c2 = chunk_sizes(n, p2)
        for r in range(p):
            if r < 2 * extra and r % 2 == 0:
                add(r, n)
                continue
            for keep, give in _halving_ranges(virt[r], p2):
                add(r, sum(c2[give[0]:give[1]]))                # halving: send the other half
                add(r, sum(c2[keep[0]:keep[1]]))                # doubling: send what I kept
            if r < 2 * extra:
                add(r, n)
    elif key == ("scan", "linear"):
        for r in range(p - 1):
            add(r, n)
    elif key == ("scan", "recursive_doubling"):
        for r in range(p):
            d = 1
            while d < p:
                if r + d < p:
                    add(r, n)
                d *= 2
    else:
        raise ValueError(f"no traffic formula for {collective}/{algorithm}")
    return B, M


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
    """alpha and beta from a ping-pong between ranks 0 and 1 (least squares over sizes,
    best of ``repeats`` one-way times), gamma from timing ``np.add`` on 1 MiB."""
    m = pingpong(cluster, sizes, repeats, **run_kwargs)
    slope, intercept = np.polyfit(m["bytes"], m["seconds"], 1)
    return CostModel(alpha=max(float(intercept), 0.0), beta=max(float(slope), 1e-15), gamma=_gamma())
