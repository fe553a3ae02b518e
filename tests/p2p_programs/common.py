"""What the transcripts are made of: payloads and statuses written out the same way on both."""
from __future__ import annotations

import numpy as np


def show(obj) -> str:
    """A payload as text: arrays with dtype (structured fields included) and shape."""
    if isinstance(obj, np.ndarray):
        return f"{type(obj).__name__}(dtype={obj.dtype!r}, shape={obj.shape}, {obj.tolist()!r})"
    return repr(obj)


def source_name(MPI, source: int) -> str:
    for name in ("PROC_NULL", "ANY_SOURCE"):
        if source == getattr(MPI, name):
            return name
    return str(source)


def tag_name(MPI, tag: int) -> str:
    return "ANY_TAG" if tag == MPI.ANY_TAG else str(tag)


def count_name(MPI, count: int) -> str:
    return "UNDEFINED" if count == MPI.UNDEFINED else str(count)


def status(MPI, st) -> str:
    """source, tag and byte count of a Status (and the count in INTs, which may be UNDEFINED)."""
    return (f"source={source_name(MPI, st.Get_source())} tag={tag_name(MPI, st.Get_tag())} "
            f"count={st.Get_count()} ints={count_name(MPI, st.Get_count(MPI.INT))} error={st.Get_error()}")


def payloads(rank: int) -> list:
    """Objects of many kinds, each a little different per sender."""
    rec = np.dtype([("a", "<i4"), ("b", "<f8")])
    return [
        None, rank, -3.5 * rank, f"from {rank}", {"rank": rank, "list": [1, 2, rank]}, (rank, "t"),
        b"bytes" * (rank + 1), list(range(rank + 2)),
        np.arange(5, dtype=np.float64) + rank,
        np.arange(6, dtype=np.int32).reshape(2, 3) * rank,
        np.array([(rank, 0.5), (2, 1.5)], dtype=rec),
        np.rec.array([(rank, 2.5)], dtype=rec),
        {"nested": np.full(3, rank, dtype=np.int16)},
        np.zeros(0),
    ]
