"""Allreduce through shared memory instead of messages: the fast path on one machine.

The algorithm (p ranks, vectors of n elements, a (p, n) shared array ``a``):

1. rank r writes its vector into row r;                          -- every row written
2. rank r reduces column block r over all rows, in rank order, and writes it into
   row 0 (a reduce-scatter done by reading memory);                -- every block reduced
3. every rank copies row 0, and announces it has (without waiting).

Cost per rank: step 1 copies n elements, step 2 reads n and writes n/p, step 3 copies n:
about 3n elements through memory and no byte through the kernel (a ring over Pipes sends
2(p-1)/p·n, each byte pickled and copied in and out of the kernel). What remains is
synchronisation: the two "every ..." points are barriers, and before rank 0 overwrites
row 0 in the *next* call it waits until everybody has copied the previous result out (the
announcement of step 3). Two barriers per call, not three: the third is split into an
announcement that nobody waits for and a wait that only rank 0 makes, one call later.

How ranks wait: with :class:`~course_lib.runtime.shm_sync.SpinBarrier` (sequence counters
in a small shared control segment that ranks poll, backing off to ``sched_yield`` and
short sleeps) on x86-64, so a call on a reused workspace sends **no message at all**; with
dissemination barriers over Pipes elsewhere (weakly ordered CPUs need memory fences Python
cannot issue; see that module) or with ``sync="pipes"`` (lesson 07 compares the two).

Workspaces. ``workspace=cluster.share(np.zeros((p, n)))`` is a segment the parent owns
and reuses across calls. The first call on it (per communicator) broadcasts the name of a
control segment that rank 0 creates; every later call finds it in this process's cache.
Rank 0's worker owns that segment: it is unlinked when the worker exits, by the Cluster's
sweep if the worker is killed (its name carries rank 0's pid), and at the next first call
on another workspace once its own workspace has been released (see
:func:`_forget_released_workspaces`). Without a workspace, rank 0 creates one segment per
call (data and control together), broadcasts its name and unlinks it at the end.
"""
from __future__ import annotations

import os

import numpy as np

from ..runtime import shm, shm_sync
from ..runtime.ops import SUM, as_op
from ._p2p import chunk_bounds, is_array


def _ufuncs():
    from ..runtime import ops

    return {ops._sum: np.add, ops._prod: np.multiply, ops._max: np.maximum, ops._min: np.minimum}


_UFUNCS = _ufuncs()
SYNC_CHOICES = ("auto", "spin", "pipes")


def allreduce_shm(comm, x, op=SUM, workspace=None, *, sync="auto"):
    """Allreduce of a numpy array through shared memory; every rank gets the reduction.

    ``op`` is applied in rank order (non-commutative ops are fine). ``sync`` chooses how
    ranks wait: "spin" (shared counters), "pipes" (dissemination barriers), or "auto"
    (spin where the CPU orders memory strongly enough: x86-64).
    """
    if not is_array(x):
        raise TypeError(f"allreduce_shm needs a numpy array, got {type(x).__name__}")
    if sync not in SYNC_CHOICES:
        raise ValueError(f"sync must be one of {SYNC_CHOICES}, got {sync!r}")
    op = as_op(op)
    spin = sync == "spin" or (sync == "auto" and shm_sync.ORDERED_MEMORY)
    if workspace is None:
        out = _allreduce_in_fresh_segment(comm, x, op, spin)
    else:
        out = _workspace_plan(comm, workspace, x, spin).run(x, op)
    if x.ndim != 1:
        out = out.reshape(x.shape)
    return out if op.finalize is None else op.apply_final(out, comm.size)


# -- the algorithm -------------------------------------------------------------
class _Plan:
    """Steps 1-3 of the module docstring on the (p, n) array ``rows``, views cut once.

    Two full waits per call plus one announcement; ``barrier`` is a SpinBarrier or a
    :class:`_PipeBarrier` (whose ``arrive`` is a whole barrier and ``wait`` a no-op).
    A plan is reused for every call on a workspace, so nothing here is sliced per call.
    """

    def __init__(self, rows, rank, barrier):
        p, n = rows.shape
        b = chunk_bounds(n, p)
        mine = slice(b[rank], b[rank + 1])
        self.rows, self.rank, self.barrier = rows, rank, barrier
        self.my_row, self.result_row = rows[rank], rows[0]
        self.my_block = [rows[i, mine] for i in range(p)]   # column block ``rank`` of every row

    def run(self, x, op):
        barrier = self.barrier
        if self.rank == 0:
            barrier.wait(barrier.seq)        # everybody copied the previous result out of row 0
        self.my_row[...] = x if x.ndim == 1 else x.reshape(-1)
        barrier.wait(barrier.arrive())       # every row written
        self._reduce_my_block(op)
        barrier.wait(barrier.arrive())       # every block reduced
        out = self.result_row.copy()
        barrier.arrive()                     # row 0 copied: rank 0 may overwrite it next call
        return out

    def _reduce_my_block(self, op):
        """Reduce my column block over all rows into row 0, in rank order."""
        first, *others = self.my_block
        ufunc = _UFUNCS.get(op.fn)
        if ufunc is not None:                # built-in ops: in place, no temporaries
            for block in others:
                ufunc(first, block, out=first)
            return
        acc = first.copy()
        for block in others:                 # lower ranks on the left: non-commutative ops work
            acc = op(acc, block)
        first[...] = acc                     # my block only: nobody else touches it now

    def close(self):
        self.barrier.close()
        self.rows = self.my_row = self.result_row = self.my_block = None


class _PipeBarrier:
    """The SpinBarrier interface over Pipes: each ``arrive`` is a whole dissemination barrier."""

    def __init__(self, comm):
        self._comm, self.seq = comm, 0

    def arrive(self) -> int:
        self._comm.barrier_with("dissemination")
        self.seq += 1
        return self.seq

    def wait(self, seq: int) -> None:
        pass                             # arrive() already waited for everybody

    def check_usable(self) -> None:
        pass

    def close(self) -> None:
        pass


# -- without a workspace: one segment per call ----------------------------------
def _allreduce_in_fresh_segment(comm, x, op, spin):
    """Rank 0 creates a segment (rows, then the counters), broadcasts its name, unlinks it."""
    p, r, n = comm.size, comm.rank, x.size
    data_bytes = -(-p * n * x.dtype.itemsize // 64) * 64    # counters on their own cache lines
    total = data_bytes + (shm_sync.control_nbytes(p) if spin else 0)
    owned = shm.SharedArray.create((total,), np.uint8) if r == 0 else None
    name = comm.bcast(owned.name if r == 0 else None, root=0)
    seg = None if r == 0 else _attach_untracked(name)
    raw = owned.array if r == 0 else np.frombuffer(seg.buf, dtype=np.uint8, count=total)
    rows = raw[:p * n * x.dtype.itemsize].view(x.dtype).reshape(p, n)
    barrier = shm_sync.SpinBarrier(raw[data_bytes:], p, r) if spin else _PipeBarrier(comm)
    plan = _Plan(rows, r, barrier)
    try:
        return plan.run(x, op)
    finally:
        plan.close()
        del raw, rows                    # no view may outlive the segment's close()
        if owned is not None:
            owned.release()              # close + unlink: the others attached before phase 1
        if seg is not None:
            seg.close()


# -- with a workspace: set up once, then no message per call ---------------------
class _WorkspacePlan(_Plan):
    """A plan kept per (workspace, communicator), with the segments it must close."""

    def __init__(self, rows, rank, barrier, workspace_name, owned_control=None, attached=()):
        super().__init__(rows, rank, barrier)
        self.workspace_name = workspace_name
        self.owned_control = owned_control       # rank 0's control SharedArray
        self.attached = list(attached)           # segments this process attached

    def close(self) -> None:
        super().close()
        if self.owned_control is not None:
            self.owned_control.release()
        for seg in self.attached:
            try:
                seg.close()
            except BufferError:                  # a view is still alive somewhere: keep mapping
                pass


_PLANS: dict = {}   # (workspace name, communicator context, size, rank, spin) -> _WorkspacePlan


def _workspace_plan(comm, workspace, x, spin):
    p, r = comm.size, comm.rank
    context = comm._coll_context() if hasattr(comm, "_coll_context") else None
    key = (workspace.name, context, p, r, spin)
    plan = _PLANS.get(key)
    if plan is None:
        _check_workspace(workspace, p, x)
        _forget_released_workspaces()
        plan = _PLANS[key] = _set_up_workspace(comm, workspace, spin)
    elif plan.result_row.size != x.size or plan.rows.dtype != x.dtype:
        _check_workspace(workspace, p, x)
    plan.barrier.check_usable()                  # a failed call poisons it for everybody
    return plan


def _check_workspace(workspace, p, x):
    if tuple(workspace.shape) != (p, x.size) or workspace.dtype != x.dtype:
        raise ValueError(f"allreduce_shm: workspace must have shape {(p, x.size)} and dtype {x.dtype}, "
                         f"got {tuple(workspace.shape)} {workspace.dtype}")


def _set_up_workspace(comm, workspace, spin):
    """First call on a workspace: map it and (spin) share rank 0's new control segment."""
    p, r = comm.size, comm.rank
    attached = []
    if getattr(workspace, "_owner", False):      # called in the process that created it
        rows = workspace.array
    else:                                        # a worker: attach outside the tracker
        seg = _attach_untracked(workspace.name)
        attached.append(seg)
        count = int(np.prod(workspace.shape, dtype=np.int64))
        rows = np.frombuffer(seg.buf, dtype=workspace.dtype, count=count).reshape(workspace.shape)
    if not spin:
        return _WorkspacePlan(rows, r, _PipeBarrier(comm), workspace.name, attached=attached)
    control = shm.SharedArray.create((shm_sync.control_words(p),), np.int64) if r == 0 else None
    name = comm.bcast(control.name if r == 0 else None, root=0)   # the only messages
    if r == 0:
        buf = control.array
    else:
        seg = _attach_untracked(name)
        attached.append(seg)
        buf = seg.buf
    barrier = shm_sync.SpinBarrier(buf, p, r)
    return _WorkspacePlan(rows, r, barrier, workspace.name, control, attached)


def _forget_released_workspaces():
    """Close (and on rank 0 unlink) what belongs to workspaces whose segment is gone.

    Linux only (other systems cannot list segments); elsewhere they go when the worker exits.
    """
    if not os.path.isdir(shm.SHM_DIR):
        return
    for key, plan in list(_PLANS.items()):
        if not os.path.exists(os.path.join(shm.SHM_DIR, plan.workspace_name)):
            del _PLANS[key]
            plan.close()


def _attach_untracked(name):
    """Attach without registering with this process's resource tracker (see :mod:`course_lib.runtime.shm`,
    which also opens the file-backed segments of a small /dev/shm)."""
    return shm._attach_untracked(name)
