"""Consistent hashing with virtual nodes (Karger et al. 1997), as the parameter server uses it.

Servers and keys live on one ring: the key space ``[0, K)`` itself (keys are already hashed
feature ids). Each server ``s`` puts ``v`` *virtual nodes* (points) on the ring. The point
``p_i`` owns the arc ``(p_{i-1}, p_i]``: a key ``k`` belongs to the first point ``>= k``
clockwise, wrapping around to ``p_0`` after the last point.

With ``S`` servers and many points each, a join moves only the new server's arcs, about
``K / (S + 1)`` keys (its share of ``S + 1`` servers), and a leave exactly the departed server's
keys (about ``K / S``), while going from ``hash(k) mod S`` to ``mod (S + 1)`` moves a fraction
``S / (S + 1)`` of all keys.
The arcs are the *key ranges* of Li et al. (OSDI 2014, section 4.3, consistent hashing): range
``i`` is replicated on the servers of the next points clockwise (chain replication, section 4.4).
"""
from __future__ import annotations

import hashlib

import numpy as np

from course_lib.reference.ex05 import ring_lookup  # question ex05_1


def _h(text: str, n_keys: int) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % n_keys


def arc_of(points, keys) -> np.ndarray:
    """Index of the arc (= of its point) each key belongs to, wrapping to 0: the lookup on a ring
    whose point i is owned by 'server' i."""
    return ring_lookup(points, np.arange(len(points)), keys)


class HashRing:
    """Servers with ``vnodes`` points each on the ring ``[0, n_keys)``."""

    def __init__(self, servers, n_keys: int, vnodes: int = 4):
        if n_keys < 1 or vnodes < 1:
            raise ValueError("n_keys and vnodes must be >= 1")
        self.n_keys, self.vnodes = int(n_keys), int(vnodes)
        self.servers = []
        self.points = np.zeros(0, dtype=np.int64)
        self.owners = np.zeros(0, dtype=np.int64)
        for s in servers:
            self.add(s)

    def _server_points(self, s, vnodes):
        pts = {_h(f"server-{s}-vnode-{j}", self.n_keys) for j in range(vnodes)}
        taken = set(self.points.tolist())
        return sorted(p for p in pts if p not in taken)   # a collision: skip that virtual node

    def add(self, s, vnodes: int = None) -> None:
        """Put server ``s`` on the ring with ``vnodes`` points (default: the ring's)."""
        if s in self.servers:
            raise ValueError(f"server {s} is already on the ring")
        pts = self._server_points(s, self.vnodes if vnodes is None else vnodes)
        self.servers.append(s)
        self.points = np.concatenate([self.points, np.asarray(pts, dtype=np.int64)])
        self.owners = np.concatenate([self.owners, np.full(len(pts), s, dtype=np.int64)])
        order = np.argsort(self.points, kind="stable")
        self.points, self.owners = self.points[order], self.owners[order]

    def remove(self, s) -> None:
        if s not in self.servers:
            raise ValueError(f"server {s} is not on the ring")
        self.servers.remove(s)
        keep = self.owners != s
        self.points, self.owners = self.points[keep], self.owners[keep]

    def copy(self) -> "HashRing":
        r = HashRing([], self.n_keys, self.vnodes)
        r.servers, r.points, r.owners = list(self.servers), self.points.copy(), self.owners.copy()
        return r

    def lookup(self, keys):
        """The server of a key, or of each key of an array."""
        return ring_lookup(self.points, self.owners, keys)

    def arcs(self, keys) -> np.ndarray:
        return arc_of(self.points, keys)

    def chain(self, arc: int, k: int = 0, dead=()) -> list:
        """Servers holding arc ``arc``: its owner then the next ``k`` distinct servers clockwise,
        minus the ``dead`` ones (replicas are placed once; a dead copy is not re-created here)."""
        out = []
        n = len(self.points)
        for j in range(n):
            s = int(self.owners[(arc + j) % n])
            if s not in out:
                out.append(s)
                if len(out) == k + 1:
                    break
        return [s for s in out if s not in dead]

    def arc_bounds(self, arc: int):
        """Keys of arc ``arc`` as ``[(lo, hi), ...]`` half-open intervals (two for the wrapping arc)."""
        p = self.points
        if arc == 0:
            parts = [(0, int(p[0]) + 1)]
            if p[-1] + 1 < self.n_keys:
                parts.append((int(p[-1]) + 1, self.n_keys))
            return parts
        return [(int(p[arc - 1]) + 1, int(p[arc]) + 1)]

    def load(self) -> dict:
        """Number of keys each server owns."""
        own = self.lookup(np.arange(self.n_keys))
        return {s: int(np.sum(own == s)) for s in self.servers}


def keys_moved(before, after, n_keys: int) -> int:
    """Keys whose owner differs between two owner functions ``f(keys) -> owners``."""
    k = np.arange(n_keys)
    return int(np.sum(before(k) != after(k)))


def modulo_owner(n_servers: int):
    """Naive placement ``server = hash(key) mod S`` (keys are already hashed)."""
    return lambda k: np.asarray(k) % n_servers
