"""Who sends what to whom, round by round: record an algorithm's messages and draw them.

:func:`record` runs an algorithm in the in-process simulator and stamps each message
with its *round* (a logical clock: a rank's send happens one round after the later of
its previous send and the last message it received), so a binomial tree shows its
doubling and a ring its p - 1 steps. :func:`draw_round` draws one round: ranks on a
circle, one arrow per message, labelled with the blocks or bytes it carries.
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
    def __init__(self, base, log):
        self.__dict__.update(base.__dict__)
        self._log, self._clock = log, 0

    def send(self, obj, dest):
        self._clock += 1
        self._log.append(Message(self._clock, self.rank, dest, payload_bytes(obj)))
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


def rounds(msgs) -> int:
    return max((m.round for m in msgs), default=0)


def draw_round(ax, msgs, p, rnd, title=None):
    """Ranks on a circle; arrows for the messages of round ``rnd`` (bytes on each arrow)."""
    ang = np.pi / 2 - 2 * np.pi * np.arange(p) / p
    xy = np.c_[np.cos(ang), np.sin(ang)]
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    for r in range(p):
        ax.add_patch(__import__("matplotlib").patches.Circle(xy[r], 0.14, color="#dde6f3", ec="#1f4e8c", zorder=3))
        ax.text(*xy[r], str(r), ha="center", va="center", fontsize=10, zorder=4)
    now = [m for m in msgs if m.round == rnd]
    for m in now:
        a, b = xy[m.src], xy[m.dst]
        d = b - a
        L = np.hypot(*d)
        a2, b2 = a + d / L * 0.16, b - d / L * 0.16
        ax.annotate("", xy=b2, xytext=a2, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color="#c0392b", lw=1.4, connectionstyle="arc3,rad=0.12"))
        mid = (a2 + b2) / 2 + np.array([-d[1], d[0]]) / L * 0.08
        ax.text(*mid, f"{m.nbytes}B", fontsize=7, color="#7b241c", ha="center", va="center")
    ax.set_title(title or f"round {rnd}: {len(now)} message(s)", fontsize=9)
    return ax
