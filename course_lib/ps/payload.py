"""Making a message's payload smaller: compressed values and cached key lists (Li et al., OSDI 2014, section 4.2).

* ``cfg.compress``: values travel zlib-compressed (lossless; the paper uses Snappy). Sparse models
  and their updates have many zeros.
* ``cfg.key_cache``: a worker that sends a server a key list it has sent it before sends only the
  list's 8-byte digest in its place; the server keeps ``(worker, digest) -> keys``. A pull followed
  by a push of the same keys (every SGD step) sends the keys once.
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import replace

import numpy as np

from .messages import Slice


def pack(values, on: bool):
    """Values as zlib-compressed bytes when ``on``; as they are otherwise (and None stays None)."""
    if not on or values is None:
        return values
    return zlib.compress(np.ascontiguousarray(values, dtype=np.float64).tobytes(), 1)


def unpack(values):
    """The float64 values that :func:`pack` compressed; anything else as it is."""
    if isinstance(values, bytes):
        return np.frombuffer(zlib.decompress(values), dtype=np.float64)
    return values


def key_digest(keys) -> bytes:
    """The 8-byte digest that stands for a key list a server has already seen."""
    return hashlib.blake2b(np.ascontiguousarray(keys, dtype=np.int64).tobytes(), digest_size=8).digest()


class SentKeyLists:
    """Worker side of key caching: the digests of the key lists each server has had from us."""

    def __init__(self):
        self.seen: dict[int, set[bytes]] = {}

    def shorten(self, server: int, s: Slice) -> Slice:
        """``s`` with its key list replaced by the list's digest if ``server`` has had the list from us."""
        digest = key_digest(s.keys)
        seen = self.seen.setdefault(server, set())
        if digest in seen:
            return replace(s, keys=digest)
        seen.add(digest)
        return s


class ReceivedKeyLists:
    """Server side of key caching: every key list a worker has sent, by its digest."""

    def __init__(self):
        self.known: dict[tuple[int, bytes], np.ndarray] = {}

    def restore(self, worker: int, s: Slice) -> Slice:
        """``s`` with its key list (a digest stands for a list this worker sent before)."""
        if isinstance(s.keys, bytes):
            return replace(s, keys=self.known[(worker, s.keys)])
        self.known[(worker, key_digest(s.keys))] = s.keys
        return s


__all__ = ["pack", "unpack", "key_digest", "SentKeyLists", "ReceivedKeyLists"]
