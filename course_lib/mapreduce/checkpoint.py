"""Checkpoints: the server saves (w, iteration, losses so far) every k iterations.

Source note 001 (README, "Source notes") asks whether a crashed job must restart from the very
beginning. It need not:
gradient descent's whole state is (w_t, t), so a job restarted from the last checkpoint
computes exactly the same iterations again and ends at the same w, bit for bit.
Writes are atomic (write to a temporary file, then ``os.replace``), so a crash while
saving leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os

import numpy as np

FILENAME = "mapreduce_gd_checkpoint.npz"


def path_of(directory) -> str:
    return os.path.join(os.fspath(directory), FILENAME)


def save(directory, w, iteration: int, losses, meta: dict | None = None) -> str:
    """Save atomically; returns the file path."""
    os.makedirs(directory, exist_ok=True)
    final = path_of(directory)
    tmp = final + f".tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, w=np.asarray(w), iteration=np.int64(iteration), losses=np.asarray(losses, dtype=float),
                 meta=np.array(repr(sorted((meta or {}).items()))))
    os.replace(tmp, final)
    return final


def load(directory):
    """(w, iteration, losses, meta_repr) of the last checkpoint, or None if there is none."""
    p = path_of(directory)
    if not os.path.exists(p):
        return None
    with np.load(p) as z:
        return z["w"].copy(), int(z["iteration"]), z["losses"].copy(), str(z["meta"])


def clear(directory) -> None:
    p = path_of(directory)
    if os.path.exists(p):
        os.remove(p)
