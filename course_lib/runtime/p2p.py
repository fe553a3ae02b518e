"""Point-to-point as in mpi4py 4.1's lowercase (pickle-based) API, on every communicator.

:class:`PointToPoint` is the public face (``send``, ``recv``, ``sendrecv``, ``isend``,
``irecv``, ``ssend``, ``issend``, ``probe``, ``iprobe``); the world communicator
(``comm.Comm``) is the *engine* that moves messages, in world ranks. A communicator
plugs in with four members:

* ``_engine``: the world communicator of this process;
* ``_ctx_p2p``: the context of its user messages (its hidden id: a ``Dup`` or a
  ``Split`` gets a new one, so traffic of different communicators never mixes);
* ``_to_world(rank, what, any_source)``: check a rank of this communicator and return
  the world rank (``PROC_NULL`` and ``ANY_SOURCE`` pass through);
* ``_from_world(world_rank)``: the inverse, for ``Status.source``.

MPI semantics kept here: messages from one sender on one communicator are matched in
the order they were sent (non-overtaking); receives posted with ``irecv`` take
arriving messages before later receives do; a send to your own rank is buffered
(``send`` then ``recv`` on one rank works, as with mpi4py); ``PROC_NULL`` is the null
process (a send to it does nothing, a receive from it returns None at once with
``status.source == PROC_NULL`` and ``status.tag == ANY_TAG``); ``ssend``/``issend``
complete only once the receiver has matched the message.
"""
from __future__ import annotations

import operator
import warnings
from numbers import Integral

from . import wire
from .constants import ANY_SOURCE, ANY_TAG, MAX_TAG, PROC_NULL, UNDEFINED


# -- argument checks -------------------------------------------------------------------------
def send_tag(tag) -> int:
    """A tag to send with: an int (numpy ints too) in [0, MAX_TAG)."""
    if type(tag) is int and 0 <= tag < MAX_TAG:
        return tag
    tag = _as_int(tag, "tag")
    if not 0 <= tag < MAX_TAG:
        raise ValueError(f"tag must be an int in [0, {MAX_TAG}), got {tag!r}")
    return tag


def recv_tag(tag) -> int:
    """A tag to match: one to send with, or ANY_TAG."""
    if type(tag) is int and (0 <= tag < MAX_TAG or tag == ANY_TAG):
        return tag
    tag = _as_int(tag, "tag")
    if tag != ANY_TAG and not 0 <= tag < MAX_TAG:
        raise ValueError(f"tag must be an int in [0, {MAX_TAG}) or ANY_TAG ({ANY_TAG}), got {tag!r}")
    return tag


def as_rank(peer, what: str, rank: int) -> int:
    """``peer`` as a plain int: numpy integers are accepted (mpi4py takes them), bools are not."""
    if isinstance(peer, bool):
        raise TypeError(f"rank {rank}: {what} must be an int rank, got {peer!r}")
    try:
        return operator.index(peer)
    except TypeError:
        raise TypeError(f"rank {rank}: {what} must be an int rank, got {peer!r}") from None


def _as_int(value, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an int in [0, {MAX_TAG}), got {value!r}") from None


def _check_recv_buf(buf, warn: bool = False, source: int | None = None) -> None:
    """mpi4py's ``buf``: None, a writable buffer, or an int (the size of the buffer to allocate).
    course_lib needs no buffer and ignores it. ``recv`` with one warns, as mpi4py 4 does ("the 'buf'
    argument is deprecated"), and says where the source goes: ``comm.recv(1)`` receives from any
    source, not from rank 1, in mpi4py as here."""
    if buf is None:
        return
    if warn and isinstance(buf, Integral) and source == ANY_SOURCE:
        # recv(1) meant recv(source=1) far more often than "any source, into a buffer of 1 byte",
        # and it would wait for anyone (in mpi4py too): say so at once instead.
        raise TypeError(f"comm.recv({buf!r}) takes {buf!r} as a buffer size (mpi4py's first argument) and receives "
                        f"from any source; give the source by keyword: comm.recv(source={buf!r})")
    if isinstance(buf, bool) or not isinstance(buf, (bytearray, memoryview, Integral)):
        raise TypeError(f"recv's first argument is a receive buffer (mpi4py: a bytearray or a size), got "
                        f"{type(buf).__name__}; the source is the second: comm.recv(source=1)")
    if warn:
        warnings.warn("the 'buf' argument is deprecated (mpi4py); course_lib ignores it. The source is the second "
                      "argument: comm.recv(1) receives from any source, comm.recv(source=1) from rank 1.",
                      UserWarning, stacklevel=3)


# -- Status ------------------------------------------------------------------------------------
class Status:
    """What a receive or probe learnt about its message: ``source``, ``tag``, byte ``count``.

    ``Get_count()`` is the size in bytes of the message as mpi4py sends it: the in-band
    pickle (protocol 5) of the object, ``len(pickle.dumps(obj, 5))``. course_lib sends
    arrays as raw frames instead; for a message that held arrays the count is computed
    on first request by pickling the *received* object, which gives mpi4py's number when
    the sender's arrays were C-contiguous and writable (the usual case) and may differ
    for a non-contiguous or read-only array (its pickle differs in mpi4py too, and that
    layout does not survive the trip).
    """

    def __init__(self):
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        self.error = 0
        self.cancelled = False
        self._count = 0
        self._counted_obj = None  # the object whose pickle length is the count, until measured

    def _fill(self, source: int, tag: int, count: int | None, obj=None) -> None:
        self.source, self.tag, self.error = source, tag, 0
        self._count, self._counted_obj = count, (obj if count is None else None)

    @property
    def count(self) -> int:
        if self._count is None:
            self._count = len(wire.dumps(self._counted_obj))
            self._counted_obj = None
        return self._count

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_error(self) -> int:
        return self.error

    def Get_count(self, datatype=None) -> int:
        """Bytes received, or whole ``datatype`` items (UNDEFINED if they do not divide it)."""
        size = 1 if datatype is None else datatype.Get_size()
        count = self.count
        return count // size if count % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Is_cancelled(self) -> bool:
        return self.cancelled

    def Set_source(self, source: int) -> None:
        self.source = source

    def Set_tag(self, tag: int) -> None:
        self.tag = tag

    def Set_error(self, error: int) -> None:
        self.error = error

    def __repr__(self):
        return f"Status(source={self.source}, tag={self.tag}, count={self.count})"


def _fill_null(status: Status | None) -> None:
    """The status of a receive from PROC_NULL (MPI: source PROC_NULL, tag ANY_TAG, count 0)."""
    if status is not None:
        status._fill(PROC_NULL, ANY_TAG, 0)


def _fill_empty(status: Status | None) -> None:
    """The status MPI gives for a null request or a completed send: nothing to report."""
    if status is not None:
        status._fill(ANY_SOURCE, ANY_TAG, 0)


# -- requests ------------------------------------------------------------------------------
class _Operation:
    """What a :class:`Request` waits for.

    ``poll()`` makes progress without blocking and says whether the operation is done;
    ``block()`` returns once it is; then ``obj`` is its result and ``fill(status)`` says
    what it received.
    """

    engine = None  # the world communicator that makes progress, if waiting needs one
    obj = None

    def poll(self) -> bool:
        return True

    def block(self) -> None:
        pass

    def fill(self, status: Status) -> None:
        _fill_empty(status)


class _Completed(_Operation):
    """Done when created: a send to PROC_NULL or to yourself (buffered), a recv from PROC_NULL."""

    def __init__(self, from_null: bool = False):
        self._from_null = from_null

    def fill(self, status: Status) -> None:
        (_fill_null if self._from_null else _fill_empty)(status)


class _SendOp(_Operation):
    """A send running in the background; a synchronous one also waits for the receiver's ack."""

    def __init__(self, engine, handle, dest: int, sync_id: int | None):
        self.engine, self._handle, self._dest, self._sync_id = engine, handle, dest, sync_id
        self._done = False   # the engine hands over a synchronous send's ack once: remember it

    def poll(self) -> bool:
        if self._done:
            return True
        if not self._handle.test():
            return False
        self._handle.wait()  # re-raises what the background send hit (e.g. PeerLost)
        self._done = self._sync_id is None or self.engine._ack_arrived(self._sync_id, self._dest, block=False)
        return self._done

    def block(self) -> None:
        if self._done:
            return
        self._handle.wait()
        if self._sync_id is not None:
            self.engine._ack_arrived(self._sync_id, self._dest, block=True)
        self._done = True


class _RecvOp(_Operation):
    """A receive posted by ``irecv``: the engine hands it the first matching arrival."""

    def __init__(self, comm, posted):
        self.engine, self._comm, self._posted = comm._engine, comm, posted

    def poll(self) -> bool:
        return self.engine._posted_done(self._posted, block=False)

    def block(self) -> None:
        self.engine._posted_done(self._posted, block=True)

    @property
    def obj(self):
        return self._posted.msg.obj

    def fill(self, status: Status) -> None:
        msg = self._posted.msg
        status._fill(self._comm._from_world(msg.source), msg.tag, msg.pickled_size, msg.obj)


class Request:
    """A non-blocking operation, as mpi4py's ``Request`` for ``isend``/``irecv``/``issend``.

    ``wait(status)`` returns the received object (None for a send); ``test(status)``
    returns ``(flag, obj)``. Once complete the request is inactive (MPI's REQUEST_NULL):
    ``wait`` returns None and ``test`` returns ``(True, None)`` from then on.
    """

    def __init__(self, op: _Operation | None):
        self._op = op

    def _finish(self, status: Status | None):
        op, self._op = self._op, None
        if status is not None:
            op.fill(status)
        return op.obj

    def wait(self, status: Status | None = None):
        if self._op is None:
            _fill_empty(status)
            return None
        self._op.block()
        return self._finish(status)

    def test(self, status: Status | None = None) -> tuple[bool, object]:
        if self._op is None:
            _fill_empty(status)
            return True, None
        if not self._op.poll():
            return False, None
        return True, self._finish(status)

    def _done_now(self) -> bool:
        return self._op is None or self._op.poll()

    # mpi4py's capitalized spellings (MPI's own names): Wait and Test return no object.
    def Wait(self, status: Status | None = None) -> bool:
        self.wait(status)
        return True

    def Test(self, status: Status | None = None) -> bool:
        return self.test(status)[0]

    def get_status(self, status: Status | None = None) -> bool:
        """Whether the operation is complete, without completing the request (MPI_Request_get_status)."""
        if self._op is None:
            _fill_empty(status)
            return True
        if not self._op.poll():
            return False
        if status is not None:
            self._op.fill(status)
        return True

    Get_status = get_status

    def cancel(self) -> None:
        """MPI_Cancel: course_lib never cancels, which MPI allows (a cancel may fail): the operation
        completes as if it had not been called, and its status says it was not cancelled."""

    Cancel = cancel

    def Free(self) -> None:
        """MPI_Request_free: this handle becomes inactive; the operation goes on by itself."""
        self._op = None

    def __bool__(self):  # an inactive request is false, like mpi4py's REQUEST_NULL
        return self._op is not None

    # -- many requests at once (static, as MPI.Request.waitall etc.) -----------------------
    @staticmethod
    def waitall(requests, statuses: list | None = None) -> list:
        """Wait for all; return their objects in order."""
        statuses = _status_list(statuses, len(requests))
        return [r.wait(statuses[i] if statuses else None) for i, r in enumerate(requests)]

    @staticmethod
    def testall(requests, statuses: list | None = None) -> tuple[bool, list | None]:
        """All done: ``(True, objects)`` (and they complete); else ``(False, None)`` (none completes)."""
        if not all(r._done_now() for r in requests):
            return False, None
        return True, Request.waitall(requests, statuses)

    @staticmethod
    def waitany(requests, status: Status | None = None) -> tuple[int, object]:
        """Wait for one; return ``(index, obj)``, or ``(UNDEFINED, None)`` if none is active."""
        while True:
            index, flag, obj = Request.testany(requests, status)
            if flag:
                return index, obj
            _progress(requests)

    @staticmethod
    def testany(requests, status: Status | None = None) -> tuple[int, bool, object]:
        """``(index, True, obj)`` for the first done; ``(UNDEFINED, False, None)`` if none is;
        ``(UNDEFINED, True, None)`` if none is active."""
        active = [i for i, r in enumerate(requests) if r._op is not None]
        if not active:
            _fill_empty(status)
            return UNDEFINED, True, None
        for i in active:
            if requests[i]._op.poll():
                return i, True, requests[i]._finish(status)
        return UNDEFINED, False, None

    @staticmethod
    def waitsome(requests, statuses: list | None = None) -> tuple[list | None, list | None]:
        """Wait for at least one; return ``(indices, objects)`` of all that are done."""
        while True:
            indices, objs = Request.testsome(requests, statuses)
            if indices is None or indices:
                return indices, objs
            _progress(requests)

    @staticmethod
    def testsome(requests, statuses: list | None = None) -> tuple[list | None, list | None]:
        """``(indices, objects)`` of the requests done now; ``(None, None)`` if none is active."""
        if all(r._op is None for r in requests):
            return None, None
        done = [i for i, r in enumerate(requests) if r._op is not None and r._op.poll()]
        statuses = _status_list(statuses, len(done))
        return done, [requests[i]._finish(statuses[k] if statuses else None) for k, i in enumerate(done)]


def _capitalized(request_cls) -> None:
    """mpi4py's ``Request.Waitall``, ``Testall``, ...: MPI's spellings, which return no objects."""
    def Waitall(requests, statuses=None) -> bool:
        request_cls.waitall(requests, statuses)
        return True

    def Testall(requests, statuses=None) -> bool:
        return request_cls.testall(requests, statuses)[0]

    def Waitany(requests, status=None) -> int:
        return request_cls.waitany(requests, status)[0]

    def Testany(requests, status=None) -> tuple[int, bool]:
        index, flag, _ = request_cls.testany(requests, status)
        return index, flag

    def Waitsome(requests, statuses=None):
        return request_cls.waitsome(requests, statuses)[0]

    def Testsome(requests, statuses=None):
        return request_cls.testsome(requests, statuses)[0]

    for fn in (Waitall, Testall, Waitany, Testany, Waitsome, Testsome):
        setattr(request_cls, fn.__name__, staticmethod(fn))


_capitalized(Request)


def _status_list(statuses: list | None, n: int) -> list | None:
    """mpi4py's convention: a statuses list is extended with fresh Status objects as needed."""
    if statuses is not None:
        statuses.extend(Status() for _ in range(n - len(statuses)))
    return statuses


def _progress(requests) -> None:
    """Let some time pass usefully: read what has arrived (a background send needs nothing)."""
    engine = next((r._op.engine for r in requests if r._op is not None and r._op.engine is not None), None)
    if engine is not None:
        engine._progress(timeout=1e-3)


# -- the public methods --------------------------------------------------------------------
class PointToPoint:
    """mpi4py's lowercase point-to-point methods, for any communicator (see the module doc)."""

    # -- blocking --------------------------------------------------------------------------
    def send(self, obj, dest: int, tag: int = 0) -> None:
        """Send ``obj`` to ``dest`` (returns once the bytes are in the Pipe, or buffered for yourself)."""
        engine = self._engine
        dest = self._to_world(dest, "dest")
        if type(tag) is not int or not 0 <= tag < MAX_TAG:
            tag = send_tag(tag)
        if dest in engine._links:
            engine._send(obj, dest, tag, self._ctx_p2p)
        elif dest == engine.rank:
            engine._send_to_self(obj, tag, self._ctx_p2p, None)
        # else PROC_NULL: nothing happens

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None):
        """Receive the next message from ``source`` with ``tag`` (either may be ANY_*)."""
        if buf is not None:
            _check_recv_buf(buf, warn=True, source=source)
        source = self._to_world(source, "source", any_source=True)
        if type(tag) is not int or not (0 <= tag < MAX_TAG or tag == ANY_TAG):
            tag = recv_tag(tag)
        if source == PROC_NULL:
            _fill_null(status)
            return None
        msg = self._engine._recv_message(source, tag, self._ctx_p2p)
        if status is not None:
            status._fill(self._from_world(msg.source), msg.tag, msg.pickled_size, msg.obj)
        return msg.obj

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None):
        """Send to ``dest`` and receive from ``source`` at once, without deadlock."""
        _check_recv_buf(recvbuf)
        world_dest = self._to_world(dest, "dest")
        sendtag, recvtag = send_tag(sendtag), recv_tag(recvtag)
        self._to_world(source, "source", any_source=True)  # reject a bad source before sending
        engine = self._engine
        req = None
        if world_dest in engine._links:  # in the background: both sides may send at once
            req = engine._isend(sendobj, world_dest, sendtag, self._ctx_p2p)
        elif world_dest == engine.rank:
            engine._send_to_self(sendobj, sendtag, self._ctx_p2p, None)
        obj = self.recv(None, source, recvtag, status)  # if this raises, the send finishes on its own
        if req is not None:
            req.wait()
        return obj

    def ssend(self, obj, dest: int, tag: int = 0) -> None:
        """Synchronous send: returns once ``dest`` has matched the message with a receive."""
        self.issend(obj, dest, tag).wait()

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Block until a matching message can be received (without receiving it); True."""
        source = self._to_world(source, "source", any_source=True)
        tag = recv_tag(tag)
        if source == PROC_NULL:
            _fill_null(status)
            return True
        msg = self._engine._peek(source, tag, self._ctx_p2p, block=True)
        if status is not None:
            status._fill(self._from_world(msg.source), msg.tag, msg.pickled_size, msg.obj)
        return True

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """True if a matching message can be received now (never blocks); fills ``status`` then."""
        source = self._to_world(source, "source", any_source=True)
        tag = recv_tag(tag)
        if source == PROC_NULL:
            _fill_null(status)
            return True
        msg = self._engine._peek(source, tag, self._ctx_p2p, block=False)
        if msg is None:
            return False
        if status is not None:
            status._fill(self._from_world(msg.source), msg.tag, msg.pickled_size, msg.obj)
        return True

    # -- non-blocking ------------------------------------------------------------------------
    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        """Start sending ``obj``; the Request's ``wait()`` returns None once it is sent."""
        return self._start_send(obj, dest, tag, synchronous=False)

    def issend(self, obj, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send: its Request completes once ``dest`` has matched it."""
        return self._start_send(obj, dest, tag, synchronous=True)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive; the Request's ``wait()`` returns the object. Posted receives take
        arriving messages before any receive posted after them, as in MPI."""
        _check_recv_buf(buf)
        source = self._to_world(source, "source", any_source=True)
        tag = recv_tag(tag)
        if source == PROC_NULL:
            return Request(_Completed(from_null=True))
        return Request(_RecvOp(self, self._engine._post_recv(source, tag, self._ctx_p2p)))

    def _start_send(self, obj, dest, tag, synchronous: bool) -> Request:
        engine = self._engine
        dest = self._to_world(dest, "dest")
        tag = send_tag(tag)
        if dest == PROC_NULL:
            return Request(_Completed())
        sync_id = engine._new_sync_id() if synchronous else None
        if dest == engine.rank:
            engine._send_to_self(obj, tag, self._ctx_p2p, sync_id)
            handle = _DoneHandle()
        else:
            handle = engine._isend(obj, dest, tag, self._ctx_p2p, sync_id)
        return Request(_SendOp(engine, handle, dest, sync_id))


class _DoneHandle:
    """The background-send handle of a send that needed no background (buffered for yourself)."""

    def wait(self) -> None:
        pass

    def test(self) -> bool:
        return True
