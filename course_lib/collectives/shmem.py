"""Allreduce through shared memory instead of messages: the fast path on one machine.

Every rank writes its vector into row ``rank`` of a (p, n) shared array; after a
barrier, rank r reduces column block r over all rows (a reduce-scatter done by
reading memory) and writes it into row 0; after a second barrier every rank copies
row 0. No payload crosses a Pipe: only the barriers' empty tokens (and, when no
workspace is given, the segment's name). Rank 0 creates the segment and unlinks it
at the end; pass ``workspace=cluster.share(np.zeros((p, n)))`` to reuse one segment
owned by the parent across calls (no segment to create and no fresh pages to fault in on
every call: much faster for repeated calls).
"""
from __future__ import annotations

import sys
from multiprocessing import shared_memory

import numpy as np

from ..runtime import shm
from ..runtime.ops import SUM, as_op
from ._p2p import chunk_bounds, is_array


def _ufuncs():
    from ..runtime import ops

    return {ops._sum: np.add, ops._prod: np.multiply, ops._max: np.maximum, ops._min: np.minimum}


_UFUNCS = _ufuncs()


def allreduce_shm(comm, x, op=SUM, workspace=None):
    if not is_array(x):
        raise TypeError(f"allreduce_shm needs a numpy array, got {type(x).__name__}")
    op = as_op(op)
    p, r = comm.size, comm.rank
    n = x.size
    own = workspace is None
    seg = None
    if own:
        sa = shm.SharedArray.create((p, n), x.dtype) if r == 0 else None
        name = comm.bcast(sa.name if r == 0 else None, root=0)
        if r == 0:
            a = sa.array
        else:
            seg = _attach_untracked(name)
            a = np.frombuffer(seg.buf, dtype=x.dtype, count=p * n).reshape(p, n)
    else:
        sa = workspace
        if tuple(sa.shape) != (p, n) or sa.dtype != x.dtype:
            raise ValueError(f"allreduce_shm: workspace must have shape {(p, n)} and dtype {x.dtype}, "
                             f"got {tuple(sa.shape)} {sa.dtype}")
        if getattr(sa, "_owner", False):
            a = sa.array
        else:                                 # attach once per process, outside the tracker
            if sa.name not in _WORKSPACES:
                _WORKSPACES[sa.name] = _attach_untracked(sa.name)
            a = np.frombuffer(_WORKSPACES[sa.name].buf, dtype=x.dtype, count=p * n).reshape(p, n)
    a[r] = x.reshape(-1)
    comm.barrier_with("dissemination")        # every row written
    b = chunk_bounds(n, p)
    mine = slice(b[r], b[r + 1])
    ufunc = _UFUNCS.get(op.fn)
    if ufunc is not None:                      # built-in ops: reduce in place, no temporaries
        block = a[0, mine]
        for i in range(1, p):                  # rank order, as below
            ufunc(block, a[i, mine], out=block)
        del block                              # no view may outlive the segment's close()
        acc = None
    else:
        acc = a[0, mine].copy()
        for i in range(1, p):                  # rank order: fine for non-commutative ops
            acc = op(acc, a[i, mine])
        a[0, mine] = acc                       # my block only: nobody else reads it now
    comm.barrier_with("dissemination")        # every block reduced
    out = a[0].copy().reshape(x.shape)
    del a, acc
    comm.barrier_with("dissemination")        # everybody has copied: reuse or release
    if own and r == 0:
        sa.release()                          # close + unlink: the name is gone
    if seg is not None:
        seg.close()
    return op.apply_final(out, p)


_WORKSPACES: dict = {}   # workspace segments this process attached (mapped until it exits)


def _attach_untracked(name):
    """Attach without registering with this process's resource tracker (see :mod:`course_lib.runtime.shm`)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    return shm._attach_untracked(name)
