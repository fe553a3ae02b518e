"""Groups and sub-communicators (MPI_Comm_split, MPI_Group_union / intersection).

A *group* is an ordered set of processes; a *sub-communicator* lets a group run every
collective among itself. Its traffic gets its own context id, so it never mixes with
the parent's messages, and ranks are renumbered 0..k-1 (translated to the parent's
ranks under the hood).

``comm.Split(color, key)`` (collective over comm): ranks with the same color form one
sub-communicator, ordered by (key, old rank); color ``None`` or ``UNDEFINED`` gets
``None`` back (mpi4py's COMM_NULL). ``Group.Union/Intersection/Difference`` combine
groups as the source notes describe (source note 002), and ``comm.Create_group(group)`` (collective over the
group only) makes its communicator. ``comm.Dup()`` (collective, no messages) gives
the same group a new context: its messages never match the original's.

Point-to-point on a sub-communicator names the group's ranks (0..k-1), everywhere:
dest, source, ``Status.source``, PROC_NULL and self-sends included (see :mod:`p2p`).
"""
from __future__ import annotations

import operator
import zlib

import numpy as np

from .collective_api import CollectivesMixin
from .constants import ANY_SOURCE, PROC_NULL, UNDEFINED
from .p2p import PointToPoint, as_rank


def _as_int(value, what: str) -> int:
    """``value`` as a plain int, as mpi4py takes it (numpy integers too, through ``__index__``).

    Floats are refused rather than truncated, and bools too: ``Split(rank > 2)`` is a mistake
    for ``Split(int(rank > 2))`` more often than a meant colour, and numpy refuses them as sizes.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})") from None


def _ctx(*parts) -> int:
    """A context id every member computes alike (crc32 is the same in every process)."""
    return 1000 + 2 * (zlib.crc32(repr(parts).encode()) % (1 << 29))   # the wire holds int32


class Group:
    """An ordered set of processes, named by world rank; ``rank`` is my position or UNDEFINED."""

    def __init__(self, members, me=None):
        self.members = tuple(_as_int(m, "a group member") for m in members)
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"a group lists each process once, got {self.members}")
        self._me = me

    @property
    def size(self):
        return len(self.members)

    @property
    def rank(self):
        return self.members.index(self._me) if self._me in self.members else UNDEFINED

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank

    def _position(self, rank, what: str) -> int:
        """A rank of this group, checked (a negative one would silently count from the end)."""
        rank = _as_int(rank, what)
        if not 0 <= rank < self.size:
            raise ValueError(f"{what} {rank} is not a rank of this group (0..{self.size - 1})")
        return rank

    def Incl(self, ranks):
        return Group([self.members[self._position(r, "Incl's rank")] for r in ranks], self._me)

    def Excl(self, ranks):
        drop = {self._position(r, "Excl's rank") for r in ranks}
        return Group([m for i, m in enumerate(self.members) if i not in drop], self._me)

    @staticmethod
    def Union(a, b):
        return Group(list(a.members) + [m for m in b.members if m not in a.members], a._me)

    @staticmethod
    def Intersection(a, b):
        return Group([m for m in a.members if m in b.members], a._me)

    @staticmethod
    def Difference(a, b):
        return Group([m for m in a.members if m not in b.members], a._me)

    def __or__(self, other):
        return Group.Union(self, other)

    def __and__(self, other):
        return Group.Intersection(self, other)

    def __sub__(self, other):
        return Group.Difference(self, other)

    def __eq__(self, other):
        return isinstance(other, Group) and self.members == other.members

    def __hash__(self):
        return hash(self.members)

    def __repr__(self):
        return f"Group({list(self.members)})"


class GroupMethods:
    """Split, Create_group and Get_group: what every communicator offers to make others."""

    def Split(self, color=0, key=0):
        return split(self, color, key)

    def Create_group(self, group, tag=0):
        return create_group(self, group)

    def Dup(self, info=None):
        """MPI_Comm_dup: the same group with a new context (collective; no messages needed,
        every member counts its Dup calls alike)."""
        n = self.__dict__.get("_n_dups", 0) + 1   # __dict__: a SubComm must not read the world's count
        self._n_dups = n
        ctx = _ctx(self._coll_context(), "dup", n)
        return SubComm(_world_of(self), self._world_ranks(), ctx)

    Clone = Dup

    def Get_group(self):
        return Group(self._world_ranks(), self._world_rank())

    def _world_ranks(self):
        return tuple(getattr(self, "_members", range(self.size)))

    def _world_rank(self):
        return self._world_ranks()[self.rank]


class SubComm(PointToPoint, CollectivesMixin, GroupMethods):
    """A communicator over some processes of the world communicator ``world``."""

    def __init__(self, world, members, ctx):
        self._world = self._engine = world
        self._members = tuple(members)
        self._group_rank_of = {w: r for r, w in enumerate(self._members)}
        self.rank = self._members.index(world.rank)
        self.size = len(self._members)
        self._ctx_p2p, self._ctx_coll = ctx, ctx + 1
        # per-communicator counters (set here so __getattr__ never hands out the world's)
        self._coll_run, self._coll_seq, self._n_splits, self._n_groups, self._n_dups = object(), 0, 0, {}, 0

    # what a collective needs -------------------------------------------------------
    @property
    def _run_id(self):
        return getattr(self._world, "_run_id", None)

    def _send(self, obj, dest, tag, context):
        self._world._send(obj, self._members[dest], tag, context)

    def _isend(self, obj, dest, tag, context):
        return self._world._isend(obj, self._members[dest], tag, context)

    def _recv(self, source, tag, context):
        wsrc = ANY_SOURCE if source == ANY_SOURCE else self._members[source]
        src, tag, obj = self._world._recv(wsrc, tag, context)
        return self._members.index(src), tag, obj

    def _coll_link(self, peer):
        self._world._coll_link(self._members[peer])

    # ranks of this communicator: group ranks, translated to world ranks for the engine ----
    def _to_world(self, peer, what, any_source=False):
        """Check a group rank given by the program; return the world rank it names."""
        if type(peer) is not int:
            peer = as_rank(peer, what, self.rank)
        if peer == PROC_NULL or (any_source and peer == ANY_SOURCE):
            return peer
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {what}={peer!r} is not a rank of this communicator "
                             f"(0..{self.size - 1})")
        world_rank = self._members[peer]
        if world_rank != self._world.rank:
            self._world._to_world(world_rank, what)  # a neighbour in the world's topology?
        return world_rank

    def _from_world(self, world_rank):
        return self._group_rank_of.get(world_rank, world_rank)

    def barrier(self):
        """Dissemination barrier among the members (the world's barrier would wait for all)."""
        self.barrier_with("dissemination")

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Free(self):
        """Nothing to release: a sub-communicator holds no resources of its own."""

    def __getattr__(self, name):
        # compute(), logger, stats, now(), step ... are the process's, shared with the world
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_world"], name)

    def __repr__(self):
        return f"SubComm(rank={self.rank}, size={self.size}, world ranks={list(self._members)})"


def _world_of(comm):
    return getattr(comm, "_world", comm)


def split(comm, color=0, key=0):
    """MPI_Comm_split: collective over ``comm``; costs one allgather of (color, key)."""
    if color is not None:
        color = _as_int(color, f"rank {comm.rank}: Split color")
        if color < 0 and color != UNDEFINED:
            raise ValueError(f"rank {comm.rank}: Split color must be >= 0 (or UNDEFINED), got {color}")
    key = _as_int(key, f"rank {comm.rank}: Split key")
    comm._n_splits = getattr(comm, "_n_splits", 0) + 1
    pairs = comm.allgather((None if color == UNDEFINED else color, key))
    if color is None or color == UNDEFINED:
        return None
    world_of_local = comm._world_ranks()
    same = sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)
    members = [world_of_local[r] for _, r in same]
    ctx = _ctx(comm._coll_context(), "split", comm._n_splits, color)
    return SubComm(_world_of(comm), members, ctx)


def create_group(comm, group: Group):
    """MPI_Comm_create_group: collective over the group's members only (no messages)."""
    world = _world_of(comm)
    if world.rank not in group.members:
        return None
    counts = comm.__dict__.setdefault("_n_groups", {})
    counts[group.members] = counts.get(group.members, 0) + 1
    ctx = _ctx(comm._coll_context(), "group", group.members, counts[group.members])
    return SubComm(world, group.members, ctx)
