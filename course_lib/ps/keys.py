"""Keys, values and slicing a request by key range.

A request is a sorted list of distinct keys (unsigned ints in ``[0, n_keys)``) and, for a
push, ``len(keys) * val_len`` values. It is cut into contiguous slices, one per arc of the
hash ring; the slices concatenate back to the request (keys after the last point belong to
arc 0 and form the last slice, so order is kept).
"""
from __future__ import annotations

import numpy as np

from .ring import arc_of


class BadRequest(ValueError):
    """A push or pull rejected at the worker, before anything is sent."""


def check_request(keys, values=None, n_keys: int = None, val_len: int = 1):
    """Validate and normalise ``(keys, values)``; raise :class:`BadRequest` with the reason."""
    k = np.asarray(keys)
    if k.ndim != 1:
        raise BadRequest(f"keys must be a 1-d list, got shape {k.shape}")
    if k.size and not np.issubdtype(k.dtype, np.integer):
        raise BadRequest(f"keys must be integers, got dtype {k.dtype}")
    k = k.astype(np.int64)
    if k.size > 1:
        d = np.diff(k)
        if np.any(d < 0):
            i = int(np.argmax(d < 0))
            raise BadRequest(f"keys must be sorted ascending: keys[{i}]={k[i]} > keys[{i + 1}]={k[i + 1]}")
        if np.any(d == 0):
            i = int(np.argmax(d == 0))
            raise BadRequest(f"duplicate key {k[i]} at positions {i} and {i + 1}: sum duplicates before pushing")
    if n_keys is not None and k.size and (k[0] < 0 or k[-1] >= n_keys):
        bad = k[0] if k[0] < 0 else k[-1]
        raise BadRequest(f"key {bad} is outside the key space [0, {n_keys})")
    if values is None:
        return k, None
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size != k.size * val_len:
        raise BadRequest(f"{k.size} keys with {val_len} value(s) each need {k.size * val_len} values, "
                         f"got {v.size}")
    return k, v


def slice_request(points, keys, values=None, val_len: int = 1):
    """Cut a sorted request by arc: ``[(arc, keys_slice, values_slice), ...]`` in key order.

    ``np.concatenate`` of the key slices gives back ``keys`` (and the same for values)."""
    keys = np.asarray(keys, dtype=np.int64)
    seg = arc_of(points, keys)          # sorted keys: arcs 0, 1, ..., then arc 0 again for the wrapping tail
    bounds = np.flatnonzero(np.diff(seg)) + 1
    starts = np.concatenate([[0], bounds]) if keys.size else np.zeros(0, dtype=int)
    ends = np.concatenate([bounds, [keys.size]]) if keys.size else np.zeros(0, dtype=int)
    out = []
    for a, b in zip(starts, ends):
        arc = int(seg[a]) % len(points)
        v = None if values is None else values[a * val_len:b * val_len]
        out.append((arc, keys[a:b], v))
    return out


def request_nbytes(keys, values=None) -> int:
    """Payload bytes of a request's arrays (what the wire counts for them)."""
    return int(np.asarray(keys).nbytes + (0 if values is None else np.asarray(values).nbytes))


__all__ = ["BadRequest", "check_request", "slice_request", "request_nbytes", "arc_of"]
