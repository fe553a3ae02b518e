"""The collective methods every communicator gets (``Comm`` and ``SubComm`` inherit them).

Arguments and return values follow mpi4py's lowercase object methods, so an mpi4py
program runs unchanged; ``algorithm=`` picks the algorithm, a row of
:mod:`course_lib.runtime.registry`. Without it each collective runs the runtime's default
(:data:`~course_lib.runtime.base_collectives.DEFAULTS`), which needs no lesson; lesson 02
registers its teaching variants on top.

How collective traffic stays apart from user messages: it travels in its own
*context* (an MPI idea: the communicator's hidden id), so ``comm.recv()`` can never
take a collective's message and vice versa.

How misuse is caught without costing a byte: every collective message carries, in its
tag (part of the envelope, not counted as payload), a 31-bit *signature* of the call:
which collective, the call number on this communicator (mod 32), root, op, algorithm,
and a hash of the array's shape and dtype where they must agree. A rank that receives a
message whose signature differs from its own call raises :class:`CollectiveMismatch`,
naming both ranks, what it called and what the sender called (decoded from the tag),
and what the sender's message held. Where MPI would hang, this raises as soon as a
mismatched message arrives. A mismatch where no rank receives anything (say rank 0 waits
in ``bcast(root=1)`` while rank 1 waits in ``gather(root=1)``) is caught by setting
``comm.check_collectives = True``: each collective then first allgathers the full
signatures (Bruck, ceil(lg p) small messages per rank; these *are* counted in the
statistics, which is why the check is off by default and the byte formulas are checked
without it).
"""
from __future__ import annotations

import copy
import functools
import time
import zlib

import numpy as np

from . import registry
from .algorithm_helpers import is_array
from .base_collectives import DEFAULTS, allgather_bruck, allreduce_default
from .constants import ANY_TAG
from .mpi_errors import ERR_ROOT, MPIError
from .ops import SUM, Op, as_op

WORLD_COLL_CONTEXT = 1          # context of the world communicator's collective traffic
_SYNC_SEND = 1024               # smaller sends go straight into the Pipe buffer (8 KiB on macOS)



class CollectiveMismatch(RuntimeError):
    """Ranks disagree about a collective call (different collective, root, op, shape or dtype)."""




def _describe(x) -> str:
    if is_array(x):
        return f"array shape={x.shape} dtype={x.dtype}"
    if x is None:
        return "None"
    return type(x).__name__


# -- the signature in the tag: 31 bits -------------------------------------------------------
_COLL = ["", "barrier", "bcast", "scatter", "gather", "allgather", "alltoall", "reduce", "reduce_scatter",
         "allreduce", "scan", "exscan", "scatter_gather", "verify"]
_OPS = ["", "sum", "prod", "max", "min", "maxloc", "minloc", "mean"]
_FIELDS = (("coll", 16), ("alg", 8), ("op", 16), ("root", 64), ("seq", 32), ("sig", 512))


def _alg_index(name, algorithm):
    return registry.index(name, algorithm)


def encode_tag(name, seq, root=None, op=None, algorithm=None, sig=None) -> int:
    vals = {"coll": _COLL.index(name), "alg": _alg_index(name, algorithm),
            "op": 0 if op is None else (_OPS.index(op.name) if op.name in _OPS else 8),
            "root": 0 if root is None else root % 63 + 1, "seq": seq % 32,
            "sig": 0 if sig is None else zlib.crc32(repr(sig).encode()) % 511 + 1}
    tag = 0
    for field, size in _FIELDS:
        tag = tag * size + vals[field]
    return tag


def decode_tag(tag: int) -> dict:
    out = {}
    for field, size in reversed(_FIELDS):
        tag, out[field] = divmod(tag, size)
    return out


def describe_tag(tag: int) -> str:
    f = decode_tag(tag)
    if not 0 < f["coll"] < len(_COLL):
        return f"a message with tag {tag} (not a collective)"
    name = _COLL[f["coll"]]
    parts = []
    if f["root"]:
        parts.append(f"root={f['root'] - 1}")
    if f["op"]:
        parts.append(f"op={_OPS[f['op']].upper() if f['op'] < len(_OPS) else 'a user op'}")
    algs = sorted(registry.algorithms(name)) if name in registry.COLLECTIVES else []
    if f["alg"] and f["alg"] <= len(algs):
        parts.append(f"algorithm={algs[f['alg'] - 1]!r}")
    return f"{name}({', '.join(parts)}) [call #{f['seq']} mod 32]"


class _Transport:
    """Point-to-point for one collective call, with the call's signature as every tag."""

    def __init__(self, comm, tag, desc, like=None):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self._tag, self._desc, self._like = tag, desc, like
        self._ctx = comm._coll_context()

    def send(self, obj, dest):
        self.comm._coll_link(dest)
        self.comm._send(obj, dest, self._tag, self._ctx)

    def recv(self, source):
        self.comm._coll_link(source)
        src, tag, obj = self.comm._recv(source, ANY_TAG, self._ctx)
        if tag != self._tag:
            mine, theirs = decode_tag(self._tag), decode_tag(tag)
            what = describe_tag(tag)
            if {k: v for k, v in mine.items() if k != "sig"} == {k: v for k, v in theirs.items() if k != "sig"}:
                what += " with an array of another shape or dtype"
            raise CollectiveMismatch(
                f"collective mismatch between rank {self.rank} and rank {src}: "
                f"rank {self.rank} called {self._desc}, but rank {src} called {what} "
                f"(its message held: {_describe(obj)}). Every rank must call the same collectives in "
                "the same order, with the same root, op and algorithm, and (for reductions and the "
                "array fast path) arrays of the same shape and dtype.")
        return obj

    def sendrecv(self, obj, dest, source):
        self.comm._coll_link(dest)
        small = obj is None or (is_array(obj) and obj.nbytes < _SYNC_SEND)
        if small:
            self.comm._send(obj, dest, self._tag, self._ctx)
            return self.recv(source)
        if getattr(self.comm, "backend", "local") == "mpi":  # MPI_Isend: no thread needed
            req = self.comm._isend(obj, dest, self._tag, self._ctx)
            got = self.recv(source)
            req.wait()
            return got
        # the communicator's own non-blocking send: a thread on Pipes, MPI_Isend on MPI
        req = self.comm._isend(obj, dest, self._tag, self._ctx)
        try:
            got = self.recv(source)
        except BaseException:
            deadline = time.monotonic() + 0.2      # a failed send explains more than a blocked recv
            while not req.test() and time.monotonic() < deadline:
                time.sleep(0.005)
            if req.test():
                req.wait()
            raise
        req.wait()
        return got


class CollectivesMixin:
    """bcast, scatter, gather, allgather, alltoall, reduce, allreduce, reduce_scatter, scan,
    exscan, barrier_with, scatter_gather, allreduce_shm."""

    check_collectives = False

    # -- plumbing --------------------------------------------------------------
    def _coll_context(self):
        return getattr(self, "_ctx_coll", WORLD_COLL_CONTEXT)

    def _coll_link(self, peer):
        links = getattr(self, "_links", None)
        if links is not None and peer not in links:
            raise ValueError(f"rank {self.rank}: this collective needs a link to rank {peer}, but the "
                             f"topology has none (neighbours: {sorted(links)}); run collectives on a full mesh")

    def _next_call(self):
        run = getattr(self, "_run_id", None)
        if getattr(self, "_coll_run", object()) != run:   # a new run starts counting afresh
            self._coll_run, self._coll_seq = run, 0
        self._coll_seq += 1
        return self._coll_seq

    def _check_root(self, root, name):
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise MPIError(ERR_ROOT, f"rank {self.rank}: {name}: root={root!r} is not a rank of this communicator "
                                     f"(0..{self.size - 1})")
        return int(root)

    def _pick(self, name, algorithm):
        return registry.lookup(name, algorithm).run

    def _transport(self, name, algorithm, *, root=None, op=None, data=None, array_sig=False):
        self._engine._check_no_pending(name)       # before the call is counted (nonblocking.py)
        seq = self._next_call()
        sig = (data.shape, data.dtype.str) if array_sig and is_array(data) else None
        tag = encode_tag(name, seq, root, op, algorithm, sig)
        parts = [f"{name}(", _describe(data)]
        if root is not None:
            parts.append(f", root={root}")
        if op is not None:
            parts.append(f", op={op!r}")
        parts.append(f", algorithm={algorithm!r}) [call #{seq}]")
        desc = "".join(parts)
        if self.check_collectives and self.size > 1:
            self._verify(seq, (name, root, None if op is None else op.name, algorithm, sig), desc)
        return _Transport(self, tag, desc)

    def _verify(self, seq, key, desc):
        t = _Transport(self, encode_tag("verify", seq), f"signature check [call #{seq}]")
        sigs = allgather_bruck(t, (key, desc))       # ceil(lg p) messages, for any p
        if any(k != key for k, _ in sigs):
            lines = "; ".join(f"rank {r}: {d}" for r, (_, d) in enumerate(sigs))
            raise CollectiveMismatch(f"ranks called different collectives: {lines}")

    # -- barrier -----------------------------------------------------------------
    def barrier_with(self, algorithm="dissemination"):
        """A barrier built from messages: 'token_ring' (2p - 1 messages in a row) or
        'dissemination' (ceil(lg p) rounds). Tokens are empty: zero payload bytes."""
        fn = self._pick("barrier", algorithm)
        fn(self._transport("barrier", algorithm))

    # -- one to all / all to one ----------------------------------------------------
    def bcast(self, obj=None, root=0, algorithm=None):
        """Return the root's ``obj`` on every rank."""
        root = self._check_root(root, "bcast")
        algorithm = algorithm or DEFAULTS["bcast"]
        fn = self._pick("bcast", algorithm)
        return fn(self._transport("bcast", algorithm, root=root, data=obj if self.rank == root else None),
                  obj, root)

    def scatter(self, sendobj=None, root=0, algorithm=None):
        """The root passes p items; rank i returns item i."""
        root = self._check_root(root, "scatter")
        algorithm = algorithm or DEFAULTS["scatter"]
        fn = self._pick("scatter", algorithm)
        if self.rank == root and (sendobj is None or len(sendobj) != self.size):
            n = "None" if sendobj is None else f"{len(sendobj)} items"
            raise ValueError(f"rank {root}: scatter root must pass {self.size} items (one per rank), got {n}")
        return fn(self._transport("scatter", algorithm, root=root), sendobj, root)

    def gather(self, sendobj, root=0, algorithm=None):
        """The root returns the list of every rank's object (rank order); others return None.

        ``algorithm='binomial'`` sends whole subtrees at once; it needs numpy arrays of one
        shape and dtype on every rank (or non-array objects everywhere)."""
        root = self._check_root(root, "gather")
        algorithm = algorithm or DEFAULTS["gather"]
        fn = self._pick("gather", algorithm)
        return fn(self._transport("gather", algorithm, root=root, data=sendobj,
                                  array_sig=algorithm == "binomial"), sendobj, root)

    def allgather(self, sendobj, algorithm=None):
        """Every rank returns the list of every rank's object, in rank order.

        'bruck' and 'recursive_doubling' send several blocks per message; they need numpy
        arrays of one shape and dtype on every rank (or non-array objects everywhere).
        The default 'ring' forwards single blocks and accepts anything."""
        algorithm = algorithm or DEFAULTS["allgather"]
        fn = self._pick("allgather", algorithm)
        return fn(self._transport("allgather", algorithm, data=sendobj, array_sig=algorithm != "ring"), sendobj)

    def alltoall(self, sendobj, algorithm=None):
        """Rank r passes p items; item j goes to rank j; returns the items addressed to r."""
        algorithm = algorithm or DEFAULTS["alltoall"]
        fn = self._pick("alltoall", algorithm)
        if sendobj is None or len(sendobj) != self.size:
            n = "None" if sendobj is None else f"{len(sendobj)} items"
            raise ValueError(f"rank {self.rank}: alltoall needs {self.size} items (one per rank), got {n}")
        return fn(self._transport("alltoall", algorithm), sendobj)

    # -- reductions ------------------------------------------------------------------
    def reduce(self, sendobj, op=SUM, root=0, algorithm=None):
        """The root returns op over all ranks' objects (in rank order); others return None."""
        root = self._check_root(root, "reduce")
        op = as_op(op)
        algorithm = algorithm or DEFAULTS["reduce"]
        fn = self._pick("reduce", algorithm)
        t = self._transport("reduce", algorithm, root=root, op=op, data=sendobj, array_sig=True)
        res = fn(t, sendobj, op, root)
        return None if self.rank != root else op.apply_final(res, self.size)

    def allreduce(self, sendobj, op=SUM, algorithm=None, wire_dtype=None):
        """Every rank returns op over all ranks' objects.

        ``wire_dtype=np.float16`` sends float16 (half the bytes of float32) and
        accumulates each partial sum in float32 before rounding it again."""
        op = as_op(op)
        if wire_dtype is not None:
            return self._allreduce_lowp(sendobj, op, algorithm, np.dtype(wire_dtype))
        algorithm = algorithm or allreduce_default(sendobj, op)
        fn = self._pick("allreduce", algorithm)
        t = self._transport("allreduce", algorithm, op=op, data=sendobj, array_sig=True)
        return op.apply_final(fn(t, sendobj, op), self.size)

    def _allreduce_lowp(self, x, op, algorithm, wire):
        if not is_array(x):
            raise TypeError("wire_dtype needs a numpy array")
        acc = np.result_type(wire, np.float32)

        def low(a, b, _f=op.fn):
            return np.asarray(_f(a.astype(acc), b.astype(acc))).astype(wire)

        lowop = Op(low, op.commute, f"{op.name}@{wire.name}", op.finalize)
        algorithm = algorithm or allreduce_default(x.astype(wire), op)
        fn = self._pick("allreduce", algorithm)
        xw = x.astype(wire)
        t = self._transport("allreduce", algorithm, op=lowop, data=xw, array_sig=True)
        res = fn(t, xw, lowop).astype(x.dtype)
        return op.apply_final(res, self.size)

    def iallreduce(self, sendobj, op=SUM, algorithm=None):
        """Start an allreduce and return at once a :class:`Request`; ``wait()`` returns what
        :meth:`allreduce` would (``test()``: ``(done, value)``).

        The reduction runs in this rank's background thread, in the order the non-blocking
        collectives were started, with the same algorithms and bytes as :meth:`allreduce`;
        ``sendobj`` is copied now, so the caller may reuse it. mpi4py has only the buffer
        form ``Iallreduce``; this is its lowercase, object form. Until the request completes the
        caller may compute, start more and test/wait, but not communicate otherwise (see
        :mod:`course_lib.runtime.nonblocking`)."""
        op = as_op(op)
        data = np.array(sendobj, copy=True) if is_array(sendobj) else copy.deepcopy(sendobj)
        job = functools.partial(self.allreduce, data, op, algorithm)
        return self._engine._progress_thread().submit(job, f"iallreduce({_describe(data)})")

    def reduce_scatter(self, sendobj, op=SUM, algorithm=None):
        """Reduce the (flattened) arrays and return chunk ``rank`` of the result (chunks
        cut as ``np.array_split`` does: the first n % p chunks have one element more)."""
        op = as_op(op)
        algorithm = algorithm or DEFAULTS["reduce_scatter"]
        fn = self._pick("reduce_scatter", algorithm)
        t = self._transport("reduce_scatter", algorithm, op=op, data=sendobj, array_sig=True)
        return op.apply_final(fn(t, sendobj, op), self.size)

    def scan(self, sendobj, op=SUM, algorithm=None):
        """Rank r returns op over the objects of ranks 0..r."""
        op = as_op(op)
        algorithm = algorithm or DEFAULTS["scan"]
        fn = self._pick("scan", algorithm)
        t = self._transport("scan", algorithm, op=op, data=sendobj, array_sig=True)
        return op.apply_final(fn(t, sendobj, op), self.rank + 1)

    def exscan(self, sendobj, op=SUM, algorithm=None):
        """Rank r returns op over the objects of ranks 0..r-1 (None on rank 0)."""
        op = as_op(op)
        algorithm = algorithm or DEFAULTS["exscan"]
        fn = self._pick("exscan", algorithm)
        t = self._transport("exscan", algorithm, op=op, data=sendobj, array_sig=True)
        res = fn(t, sendobj, op, exclusive=True)
        return None if res is None else op.apply_final(res, self.rank)

    # -- lesson extensions: ScatterGather (lesson 02), shared memory (lesson 07) ----------------
    def scatter_gather(self, data, src, dst, unit_size, total_size):
        """ScatterGather of source note 002 (lesson 02): registered as the 'scatter_gather' extension."""
        return extension("scatter_gather")(self, data, src, dst, unit_size, total_size)

    def allreduce_shm(self, x, op=SUM, workspace=None, *, sync="auto"):
        """Allreduce through shared memory (lesson 07): registered as the 'allreduce_shm' extension.
        ``sync``: "spin" (counters in shared memory), "pipes" (barriers of messages) or "auto"."""
        return extension("allreduce_shm")(self, x, op, workspace, sync=sync)


_EXTENSIONS: dict = {}


def register_extension(name: str, fn) -> None:
    """A communicator method that a lesson provides (``comm.<name>(...)`` calls ``fn(comm, ...)``)."""
    _EXTENSIONS[name] = fn


def extension(name: str):
    if name not in _EXTENSIONS:
        raise RuntimeError(f"comm.{name} is provided by a lesson package that is not loaded: "
                           "import course_lib.collectives")
    return _EXTENSIONS[name]
