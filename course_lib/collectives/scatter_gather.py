"""ScatterGather(SrcIDRange, DstIDRange, UnitSize, TotalSize), the operation of the course's source notes (README).

Every non-reducing collective is "some sources send pieces of a buffer of TotalSize
elements to some destinations":

=====================  ==========================  ===================
sources                UnitSize == TotalSize       UnitSize < TotalSize
=====================  ==========================  ===================
one                    broadcast                   scatter
many, one destination  gather                      (gather of units)
many, many             allgather                   all-to-all
=====================  ==========================  ===================

With UnitSize < TotalSize a source cuts its buffer into TotalSize / UnitSize units and
sends unit j to the j-th destination. A destination returns what it got: the buffer
itself when there is one source, otherwise the list of pieces, one per source.
When the ranges cover the whole communicator, the matching collective (and its
algorithm) does the work; otherwise each source sends straight to each destination.
"""
from __future__ import annotations

import numpy as np


def classify(src, dst, unit_size, total_size) -> str:
    """Which collective a scatter-gather is: one source sends the whole (broadcast) or units (scatter);
    one destination receives the whole (gather) or units (gather_units); else allgather or alltoall."""
    src, dst = list(src), list(dst)
    whole = unit_size == total_size
    if len(src) == 1:
        return "broadcast" if whole else "scatter"
    if len(dst) == 1:
        return "gather" if whole else "gather_units"
    return "allgather" if whole else "alltoall"


def _validate(comm, data, src, dst, unit, total):
    for name, rng in (("src", src), ("dst", dst)):
        if not rng or any(not 0 <= r < comm.size for r in rng) or len(set(rng)) != len(rng):
            raise ValueError(f"scatter_gather: {name} must list distinct ranks of 0..{comm.size - 1}, got {rng}")
    if unit <= 0 or total % unit:
        raise ValueError(f"scatter_gather: TotalSize ({total}) must be a multiple of UnitSize ({unit})")
    if unit != total and total // unit != len(dst):
        raise ValueError(f"scatter_gather: TotalSize / UnitSize = {total // unit} units, but there are "
                         f"{len(dst)} destinations (one unit each)")
    if comm.rank in src:
        arr = np.asarray(data)
        if arr.size != total:
            raise ValueError(f"rank {comm.rank}: scatter_gather source buffer has {arr.size} elements, "
                             f"TotalSize says {total}")


def scatter_gather(comm, data, src, dst, unit_size, total_size):
    src, dst = [int(r) for r in src], [int(r) for r in dst]
    _validate(comm, data, src, dst, unit_size, total_size)
    kind = classify(src, dst, unit_size, total_size)
    everyone = list(range(comm.size))
    me = comm.rank
    buf = np.ascontiguousarray(data).reshape(-1) if me in src else None
    units = None if buf is None else [buf[j * unit_size:(j + 1) * unit_size] for j in range(len(dst))]
    if kind == "broadcast" and dst == everyone:
        return comm.bcast(buf, root=src[0])
    if kind == "scatter" and dst == everyone:
        return comm.scatter(units, root=src[0])
    if kind == "gather" and src == everyone:
        return comm.gather(buf, root=dst[0])
    if kind == "allgather" and src == dst == everyone:
        return comm.allgather(buf)
    if kind == "alltoall" and src == dst == everyone:
        return comm.alltoall(units)
    # general ranges: every source sends straight to every destination (through the
    # collective transport so that it is counted and checked like the others)
    t = comm._transport("scatter_gather", "flat", data=None)
    whole = unit_size == total_size
    if me in src:
        for j, d in enumerate(dst):
            if d != me:
                t.send(buf if whole else units[j], d)
    if me not in dst:
        return None
    j = dst.index(me)
    got = [(buf if whole else units[j]) if s == me else t.recv(s) for s in src]
    return got[0] if len(src) == 1 else got
