"""How objects cross a Pipe: one small header frame, then raw buffers.

A numpy array is never pickled: the header frame carries its dtype and shape, a second
frame carries its memory, and the receiver allocates an empty array and reads the frame
straight into it (one copy, from the socket into the array).
Any other object is pickled with protocol 5, so arrays *inside* it also travel as
out-of-band raw frames rather than inside the pickle; a small object is a single frame.
What plain pickle refuses (an instance of a class defined in ``__main__``, i.e. in a notebook
cell or a script, which a worker knows only as cloudpickle rebuilt it; a lambda) is pickled
by cloudpickle instead: its output is a plain pickle that ``pickle.loads`` reads (it calls
cloudpickle's helpers to rebuild the class), so the receiver needs no flag, and the common
path pays nothing (a ``try`` costs nothing until it raises).

Header frame = fixed struct prefix ``(kind, run_id, context, tag, ready_at, n_buffers)``,
then (synchronous sends only) the 8-byte id the receiver acknowledges, then ``n_buffers``
buffer sizes, then the meta (array: dtype/shape pickle; object: pickle). A plain dtype
travels as its ``str`` (``'<f8'``); a structured dtype as the dtype itself, since its
``str`` (``'|V12'``) would lose the fields.

Limits, checked before a byte is written (a ``ValueError`` otherwise, never a corrupt
stream): tag and context are signed 32-bit, every frame at most :data:`MAX_FRAME` bytes.

Frames are ``multiprocessing.connection.Connection`` frames (a 4-byte big-endian length,
or -1 and an 8-byte length for frames over 2 GiB, then the bytes), so either end may use
``send_bytes``/``recv_bytes``. On a POSIX Connection, this module reads and writes those
frames on the file descriptor itself: all the frames of a message leave in one
``writev`` call, and a payload frame is read with ``readv`` directly into the receiver's
array. (``Connection.recv_bytes_into`` reads each chunk into a fresh ``bytes`` and then a
``BytesIO`` before copying into the target: two extra copies, and fresh pages to fault
in for every large message.) Any other link (e.g. the MPI backend's) is used through its
``send_bytes``/``recv_bytes``/``recv_bytes_into``.

Payload size counted in the statistics:
  * an ndarray: exactly ``arr.nbytes``;
  * any other object: the pickle's length plus its out-of-band buffers.
"""
from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection

import cloudpickle
import numpy as np

ARRAY, OBJECT = 0, 1
SYNC = 4  # kind bit: a synchronous send, whose header carries the id to acknowledge
_PREFIX = struct.Struct("<BqiidI")  # kind, run_id, context, tag, ready_at, n_buffers
_SIZE = struct.Struct("<Q")
_SYNC_ID = struct.Struct("<q")
MAX_FRAME = 2 ** 64 - 1  # Connection's long frame length is 8 bytes

# Connection's own framing (multiprocessing/connection.py: _send_bytes/_recv_bytes)
_LEN = struct.Struct("!i")
_BIG_LEN = struct.Struct("!Q")
_BIG = 0x7fffffff
_BIG_MARK = _LEN.pack(-1)
_IOV_MAX = 512  # buffers per writev call (Linux allows 1024)
_SMALL_FRAME = 1 << 16  # larger frames are read into one preallocated buffer
#: A traced send larger than this is first written without blocking (``MSG_DONTWAIT``), as much as
#: the socket takes; if that is not all, the wait for room is timed with ``poll``. Time blocked on
#: a receiver that does not read is then seen, not hidden inside one long write.
WATCH_MIN = 1 << 16
#: Room that comes within this is the receiver reading (it frees room within microseconds): the rest
#: is written at once, as sending. Longer (poll's resolution is a millisecond), the receiver is not
#: reading: the wait is waiting.
BLOCKED_MIN_MS = 1

# The descriptor-level path needs POSIX read/write semantics on the Connection's handle.
_FD_CONNECTION = Connection if sys.platform != "win32" else None


def dumps(obj) -> bytes:
    """The in-band protocol-5 pickle of ``obj``, by cloudpickle where plain pickle refuses it."""
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # noqa: BLE001  (cloudpickle raises again what it cannot pickle either)
        return _cloud_dumps(obj, None)


def _cloud_dumps(obj, buffer_callback) -> bytes:
    """The fallback: a class defined in ``__main__`` travels by value, a lambda too."""
    return cloudpickle.dumps(obj, protocol=5, buffer_callback=buffer_callback)


def _bytes_view(arr: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array, whatever its dtype or shape."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def _frame_len(n: int) -> bytes:
    return _LEN.pack(n) if n <= _BIG else _BIG_MARK + _BIG_LEN.pack(n)


class Message:
    """One received message: envelope, payload, and what the receiver's bookkeeping needs.

    ``nbytes`` is the payload as counted in the statistics; ``pickled_size`` is the length
    of the in-band protocol-5 pickle of ``obj`` (what mpi4py's ``Status.Get_count``
    reports) when the wire knows it for free, else None (the object held arrays that
    travelled as raw frames). ``sync_id`` is the id a synchronous send waits to see
    acknowledged (None for other sends). ``source`` and ``read_end`` are set by the
    receiving communicator.
    """

    __slots__ = ("run_id", "context", "tag", "ready_at", "obj", "nbytes", "pickled_size", "sync_id",
                 "read_start", "source", "read_end")

    def __init__(self, run_id, context, tag, ready_at, obj, nbytes, pickled_size, sync_id, read_start):
        # one statement per field: cheaper than tuple assignment, and every message pays for it
        self.run_id = run_id
        self.context = context
        self.tag = tag
        self.ready_at = ready_at
        self.obj = obj
        self.nbytes = nbytes
        self.pickled_size = pickled_size
        self.sync_id = sync_id
        self.read_start = read_start
        self.source = -1
        self.read_end = read_start


def _prefix(kind, run_id, context, tag, ready_at, n_buffers, sync_id) -> bytes:
    """The fixed header prefix; a ValueError (before anything is written) if a field overflows."""
    try:
        prefix = _PREFIX.pack(kind if sync_id is None else kind | SYNC, run_id, context, tag, ready_at, n_buffers)
        return prefix if sync_id is None else prefix + _SYNC_ID.pack(sync_id)
    except struct.error as exc:
        raise ValueError(f"message header cannot hold context={context}, tag={tag}, {n_buffers} buffers "
                         f"(tag and context are 32-bit signed): {exc}") from None


def _check_frame(nbytes: int) -> None:
    if nbytes > MAX_FRAME:
        raise ValueError(f"a frame of {nbytes} bytes is over the wire's limit of {MAX_FRAME} bytes")


def _dtype_meta(dtype: np.dtype):
    """What travels for a dtype: its short str, unless that would lose structured fields."""
    return dtype.str if dtype.names is None else dtype


# -- frames on a file descriptor ---------------------------------------------------------
def _write_frames(fd: int, first: bytes, frames, blocked: list | None = None) -> None:
    """Write frame ``first`` (small, bytes) then ``frames`` (buffers): one syscall unless interrupted.

    ``blocked``, when given (a traced send), receives the ``(start, end)`` perf_counter spells
    the write spent blocked because the receiver had not read what was already sent; a message
    larger than :data:`WATCH_MIN` is then written by :func:`_write_watched` to see them.
    """
    if not frames:
        data = _frame_len(len(first)) + first
        if blocked is not None and len(data) > WATCH_MIN:
            _write_watched(fd, [data], blocked)
            return
        n = os.write(fd, data)
        if n < len(data):
            _write_all(fd, [memoryview(data)[n:]])
        return
    parts = [_frame_len(len(first)) + first]
    for f in frames:
        parts.append(_frame_len(f.nbytes))
        parts.append(f)
    if blocked is not None and sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts) > WATCH_MIN:
        _write_watched(fd, parts, blocked)
    else:
        _write_all(fd, parts)


def _write_all(fd: int, parts: list) -> None:
    parts = [memoryview(p).cast("B") if not isinstance(p, bytes) else p for p in parts]
    i = 0
    while i < len(parts):
        batch = parts[i:i + _IOV_MAX]
        n = os.writev(fd, batch)
        # skip what was written; a partial write (signal, huge message) resumes mid-buffer
        for p in batch:
            if n >= len(p):
                n -= len(p)
                i += 1
            else:
                parts[i] = memoryview(p)[n:]
                break


def _write_watched(fd: int, parts: list, blocked: list) -> None:
    """``_write_all``, seeing the waits for a receiver that does not read.

    ``sendmsg(..., MSG_DONTWAIT)`` writes what the socket takes. If that is not all, ``poll`` waits
    for room: room within :data:`BLOCKED_MIN_MS` means the receiver is reading, and the rest is
    written by one blocking ``_write_all`` (as fast as without the watch); a longer wait is
    appended to ``blocked`` as ``(start, end)`` (perf_counter), and the loop goes on.

    The socket object wraps ``fd`` without owning it (detached after), and MSG_DONTWAIT applies to
    the call only: the descriptor stays blocking for everyone else. A closed peer makes the poll
    return at once and the write raise, as a plain write would. A descriptor that is not a socket
    is written as by :func:`_write_all` (no wait is seen).
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        _write_all(fd, parts)
        return
    try:
        if sock.gettimeout() is not None:  # a socket.setdefaulttimeout() made it non-blocking: undo that
            sock.settimeout(None)
        views = [memoryview(p).cast("B") for p in parts]
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        i = 0
        while i < len(views):
            try:
                n = sock.sendmsg(views[i:i + _IOV_MAX], (), socket.MSG_DONTWAIT)
            except BlockingIOError:
                n = 0
            while n and i < len(views):  # skip what was written; resume mid-buffer
                if n >= len(views[i]):
                    n -= len(views[i])
                    i += 1
                else:
                    views[i] = views[i][n:]
                    n = 0
            while i < len(views) and len(views[i]) == 0:
                i += 1
            if i == len(views):
                return
            start = time.perf_counter()
            if poller.poll(BLOCKED_MIN_MS):  # room at once: the receiver is reading
                _write_all(fd, views[i:])
                return
            poller.poll()  # the receiver is not reading: wait until it makes room
            blocked.append((start, time.perf_counter()))
    finally:
        sock.detach()


def _read_exact(fd: int, n: int, first: bool = False) -> bytes:
    data = os.read(fd, n)
    if len(data) == n:
        return data
    if not data:
        if first:
            raise EOFError
        raise OSError("got end of file during message")
    buf = bytearray(data)
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise OSError("got end of file during message")
        buf += chunk
    return bytes(buf)


def _read_len(fd: int) -> int:
    head = os.read(fd, 4)
    if len(head) != 4:
        head = head + _read_exact(fd, 4 - len(head)) if head else _read_exact(fd, 4, first=True)
    n, = _LEN.unpack(head)
    if n == -1:
        n, = _BIG_LEN.unpack(_read_exact(fd, 8))
    return n


def _read_into(fd: int, view: memoryview) -> None:
    got, size = 0, len(view)
    while got < size:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise OSError("got end of file during message")
        got += k


def _recv_frame(conn):
    if type(conn) is not _FD_CONNECTION:
        return conn.recv_bytes()
    fd = conn.fileno()
    n = _read_len(fd)
    if n <= _SMALL_FRAME:
        return _read_exact(fd, n)
    buf = bytearray(n)  # one buffer, filled in place (os.read would allocate n bytes per chunk)
    _read_into(fd, memoryview(buf))
    return buf


def _recv_frame_into(conn, view: memoryview) -> None:
    """Read the next frame, which must be exactly ``len(view)`` bytes, into ``view``."""
    if type(conn) is not _FD_CONNECTION:
        n = conn.recv_bytes_into(view)
    else:
        fd = conn.fileno()
        n = _read_len(fd)
        if n == len(view):
            _read_into(fd, view)
    if n != len(view):  # pragma: no cover - protocol corruption
        raise RuntimeError(f"expected {len(view)} bytes, got a frame of {n}")


# -- messages -------------------------------------------------------------------------------
def _put(conn, header: bytes, frames, blocked: list | None = None) -> None:
    if type(conn) is _FD_CONNECTION:
        _write_frames(conn.fileno(), header, frames, blocked)
    else:
        conn.send_bytes(header)
        for f in frames:
            conn.send_bytes(f)


def send(conn, run_id: int, context: int, tag: int, obj, stamp=None, sync_id=None,
         blocked: list | None = None) -> tuple[int, int]:
    """Send ``obj`` on ``conn``; return (payload_bytes, header_bytes).

    ``stamp(payload_bytes)``, when given, returns the time at which the (emulated)
    network delivers the message; it travels in the header. ``sync_id`` marks a
    synchronous send (the receiver acknowledges it once matched). ``blocked``, when
    given, collects the ``(start, end)`` spells the write waited for the receiver to
    read (see :func:`_write_frames`; a link that is not a POSIX Connection reports none).
    Raises ValueError, with nothing written, if the header cannot hold the message.
    """
    if type(obj) is np.ndarray and not obj.dtype.hasobject:
        arr = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        _check_frame(arr.nbytes)
        ready_at = stamp(arr.nbytes) if stamp else 0.0
        meta = pickle.dumps((_dtype_meta(arr.dtype), arr.shape), protocol=5)
        header = _prefix(ARRAY, run_id, context, tag, ready_at, 0, sync_id) + meta
        _put(conn, header, (_bytes_view(arr),) if arr.nbytes else (), blocked)
        return arr.nbytes, len(header)
    buffers: list[pickle.PickleBuffer] = []
    try:  # inlined dumps(): every small message would pay for the call
        body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except Exception:  # noqa: BLE001  (cloudpickle raises again what it cannot pickle either)
        buffers.clear()  # what the failed attempt collected
        body = _cloud_dumps(obj, buffers.append)
    if not buffers:  # the common case: one frame (checks inlined: every small message pays for them)
        if len(body) > MAX_FRAME:
            _check_frame(len(body))
        ready_at = stamp(len(body)) if stamp else 0.0
        try:
            prefix = _PREFIX.pack(OBJECT, run_id, context, tag, ready_at, 0) if sync_id is None else \
                _prefix(OBJECT, run_id, context, tag, ready_at, 0, sync_id)
        except struct.error:  # raised before anything is written
            prefix = _prefix(OBJECT, run_id, context, tag, ready_at, 0, sync_id)  # raises a ValueError that says why
        _put(conn, prefix + body, (), blocked)
        return len(body), len(prefix)
    raws = [b.raw() for b in buffers]
    for r in raws:
        _check_frame(r.nbytes)
    payload = len(body) + sum(r.nbytes for r in raws)
    ready_at = stamp(payload) if stamp else 0.0
    prefix = _prefix(OBJECT, run_id, context, tag, ready_at, len(raws), sync_id)
    prefix += b"".join(_SIZE.pack(r.nbytes) for r in raws)
    _put(conn, prefix + body, [r for r in raws if r.nbytes], blocked)
    return payload, len(prefix)


def recv(conn) -> Message:
    """Receive one message. ``read_start`` is when its header frame had arrived (before
    that the receiver was only waiting)."""
    frame = _recv_frame(conn)
    t_header = time.perf_counter()
    kind, run_id, context, tag, ready_at, nbuf = _PREFIX.unpack_from(frame)
    offset = _PREFIX.size
    sync_id = None
    if kind & SYNC:
        sync_id, = _SYNC_ID.unpack_from(frame, offset)
        offset += _SYNC_ID.size
        kind &= ~SYNC
    if kind == ARRAY:
        dtype, shape = pickle.loads(memoryview(frame)[offset:])
        arr = np.empty(shape, dtype=np.dtype(dtype))
        if arr.nbytes:
            _recv_frame_into(conn, _bytes_view(arr))
        return Message(run_id, context, tag, ready_at, arr, arr.nbytes, None, sync_id, t_header)
    body = memoryview(frame)[offset + 8 * nbuf:]
    if not nbuf:
        return Message(run_id, context, tag, ready_at, pickle.loads(body), len(body), len(body), sync_id, t_header)
    sizes = [_SIZE.unpack_from(frame, offset + 8 * i)[0] for i in range(nbuf)]
    bufs = []
    for size in sizes:
        buf = bytearray(size)  # writable, so arrays inside objects are writable too
        if size:
            _recv_frame_into(conn, memoryview(buf))
        bufs.append(buf)
    obj = pickle.loads(body, buffers=bufs)
    return Message(run_id, context, tag, ready_at, obj, len(body) + sum(sizes), None, sync_id, t_header)
