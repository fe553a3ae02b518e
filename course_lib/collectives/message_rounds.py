"""Who sends what to whom, round by round: record an algorithm's messages and draw them.

:func:`record` runs an algorithm in the in-process simulator and stamps each message
with its *round* (a logical clock: a rank's send happens one round after the later of
its previous send and the last message it received), so a binomial tree shows its
doubling and a ring its p - 1 steps. :func:`draw_round` draws one round: ranks on a
circle, one arrow per message, labelled with the blocks or bytes it carries.

:func:`holdings` follows the data itself: rank r contributes ``2**r`` to every element
(plus the element's index, scaled out of the way), so a partial sum's value *is* the set
of ranks it contains. Decoding every message's payload gives, after each round, which
contributions each rank holds for each element; :func:`draw_round` draws that as one
row of chunk cells per rank, so a chunk can be followed around the ring.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..runtime.ops import SUM
from ..runtime.registry import lookup
from .sim import SimTransport, payload_bytes, simulate


class Message(NamedTuple):
    round: int
    src: int
    dst: int
    nbytes: int


class _Recording(SimTransport):
    """Stamps each message with its round; with ``payloads``, also keeps what it carried."""

    def __init__(self, base, log, payloads=None):
        self.__dict__.update(base.__dict__)
        self._log, self._payloads, self._clock = log, payloads, 0

    def send(self, obj, dest):
        self._clock += 1
        self._log.append(Message(self._clock, self.rank, dest, payload_bytes(obj)))
        if self._payloads is not None:
            self._payloads.append((self._clock, dest, obj))
        super().send((obj, self._clock), dest)

    def recv(self, source):
        obj, stamp = super().recv(source)
        self._clock = max(self._clock, stamp)
        return obj

    def sendrecv(self, obj, dest, source):
        self.send(obj, dest)
        return self.recv(source)


def record(collective: str, algorithm: str, p: int, n: int = 8, itemsize: int = 8, root: int = 0):
    """Messages of one call (vectors of n elements) as a list of :class:`Message`."""
    fn = lookup(collective, algorithm).run
    dtype = {1: np.uint8, 2: np.float16, 4: np.float32, 8: np.float64}[itemsize]
    xs = [np.full(n, r, dtype) for r in range(p)]
    log: list[Message] = []

    def body(t):
        t = _Recording(t, log)
        r = t.rank
        if collective == "barrier":
            return fn(t)
        if collective == "bcast":
            return fn(t, xs[r] if r == root else None, root)
        if collective == "scatter":
            return fn(t, np.stack(xs) if r == root else None, root)
        if collective == "gather":
            return fn(t, xs[r], root)
        if collective in ("allgather",):
            return fn(t, xs[r])
        if collective == "alltoall":
            return fn(t, [xs[r]] * p)
        if collective == "reduce":
            return fn(t, xs[r], SUM, root)
        return fn(t, xs[r], SUM)

    simulate(p, body)
    return sorted(log)


_INDEX_SHIFT = 20  # element index i is stored as i << 20, above any mask of up to 16 ranks


def _decode(values: np.ndarray):
    """(element indices, contributor masks) of a payload built by :func:`holdings`."""
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    mask = v & ((1 << _INDEX_SHIFT) - 1)
    count = np.array([bin(int(m)).count("1") for m in mask])
    return (v - mask) // (count << _INDEX_SHIFT), mask


def holdings(collective: str, algorithm: str, p: int, n: int = 12) -> np.ndarray:
    """``H[k, r, i]``: bit mask of the ranks whose contributions rank r holds for element i
    after round k (k = 0 is the start: every rank holds only its own).

    Runs the real algorithm (``allreduce``, ``reduce_scatter``, ``reduce`` or ``allgather``)
    in the simulator on int64 vectors whose values encode (index, contributors): a SUM of
    distinct powers of two is their union, a copy keeps it. Only what arrives in messages
    changes a rank's holdings, so this is what the messages carried, not what a model says."""
    if not 1 <= p <= 16:
        raise ValueError(f"holdings() draws up to 16 ranks, got p={p}")
    fn = lookup(collective, algorithm).run
    xs = [(np.arange(n, dtype=np.int64) << _INDEX_SHIFT) + (1 << r) for r in range(p)]
    log: list[Message] = []
    sent: list = []   # (round, destination, payload)

    def body(t):
        t = _Recording(t, log, sent)
        if collective == "allgather":
            return fn(t, xs[t.rank])
        if collective == "reduce":
            return fn(t, xs[t.rank], SUM, 0)
        return fn(t, xs[t.rank], SUM)

    simulate(p, body)
    n_rounds = rounds(log)
    H = np.zeros((n_rounds + 1, p, n), dtype=np.int64)
    H[0] = [[1 << r] * n for r in range(p)]
    for k in range(1, n_rounds + 1):
        H[k] = H[k - 1]
        for stamp, dest, obj in sent:
            if stamp == k and isinstance(obj, np.ndarray) and obj.size:
                index, mask = _decode(obj)
                H[k, dest, index % n] |= mask
    return H


def rounds(msgs) -> int:
    """Number of rounds in the messages of :func:`record` (0 if there are none)."""
    return max((m.round for m in msgs), default=0)


def draw_round(ax, msgs, p, rnd, title=None, held=None):
    """Ranks on a circle; arrows for the messages of round ``rnd`` (bytes on each arrow).

    With ``held`` (``holdings(...)[rnd]``, shape (p, n)), each rank also shows its p chunks
    as a row of cells, shaded and numbered by how many ranks' contributions it holds."""
    import matplotlib.patches as patches

    ang = np.pi / 2 - 2 * np.pi * np.arange(p) / p
    xy = np.c_[np.cos(ang), np.sin(ang)]
    ax.set_aspect("equal")
    ax.axis("off")
    room = 1.35 if held is None else 1.5 + p * 0.2
    ax.set_xlim(-room, room)
    ax.set_ylim(-room if held is None else -1.65, room if held is None else 1.65)
    for r in range(p):
        ax.add_patch(patches.Circle(xy[r], 0.14, color="#dde6f3", ec="#1f4e8c", zorder=3))
        ax.text(*xy[r], str(r), ha="center", va="center", fontsize=10, zorder=4)
        if held is not None:
            _draw_chunks(ax, xy[r], held[r], p)
    now = [m for m in msgs if m.round == rnd]
    for m in now:
        a, b = xy[m.src], xy[m.dst]
        d = b - a
        L = np.hypot(*d)
        a2, b2 = a + d / L * 0.16, b - d / L * 0.16
        ax.annotate("", xy=b2, xytext=a2, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color="#c0392b", lw=1.4, connectionstyle="arc3,rad=0.12"))
        # the label sits near the sender, not at the middle: arrows between opposite ranks
        # (recursive doubling, p >= 8) all cross the centre, where their labels would pile up
        near_src = a2 + 0.3 * (b2 - a2) + np.array([-d[1], d[0]]) / L * 0.08
        ax.text(*near_src, f"{m.nbytes}B", fontsize=7, color="#7b241c", ha="center", va="center",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 0.5})
    ax.set_title(title or f"round {rnd}: {len(now)} message(s)", fontsize=9)
    return ax


def _draw_chunks(ax, center, masks, p, w=0.2, h=0.2):
    """A row of p cells just outside a rank's circle: chunk c's shade and number are how
    many ranks' contributions the rank holds for it."""
    import matplotlib.patches as patches
    from matplotlib import cm

    u = center / np.hypot(*center)                        # outward, away from the arrows
    mid = center + u * (0.24 + abs(u[0]) * p * w / 2 + abs(u[1]) * h / 2)
    x0, y0 = mid[0] - p * w / 2, mid[1] - h / 2
    for c, idx in enumerate(np.array_split(np.arange(len(masks)), p)):
        k = min(bin(int(m)).count("1") for m in masks[idx])
        ax.add_patch(patches.Rectangle((x0 + c * w, y0), w, h, facecolor=cm.Blues(0.1 + 0.8 * k / p),
                                       edgecolor="#555555", lw=0.5, zorder=5))
        ax.text(x0 + (c + 0.5) * w, y0 + h / 2, str(k), fontsize=8, ha="center", va="center", zorder=6,
                color="white" if k > p / 2 else "black")
