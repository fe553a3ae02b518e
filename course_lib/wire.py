"""How objects cross a Pipe: one small header frame, then raw buffers.

A numpy array is never pickled: the header frame carries its dtype and shape, a second
frame carries its memory (``send_bytes``), and the receiver allocates an empty array and
fills it with ``recv_bytes_into`` (one copy, from the socket into the array).
Any other object is pickled with protocol 5, so arrays *inside* it also travel as
out-of-band raw frames rather than inside the pickle; a small object is a single frame.

Header frame = fixed struct prefix ``(kind, run_id, context, tag, ready_at, n_buffers)``,
then ``n_buffers`` buffer sizes, then the meta (array: dtype/shape pickle; object: pickle).

Payload size counted in the statistics:
  * an ndarray: exactly ``arr.nbytes``;
  * any other object: the pickle's length plus its out-of-band buffers.
"""
from __future__ import annotations

import pickle
import struct
import time

import numpy as np

ARRAY, OBJECT = 0, 1
_PREFIX = struct.Struct("<BqiidI")  # kind, run_id, context, tag, ready_at, n_buffers
_SIZE = struct.Struct("<Q")


def _bytes_view(arr: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array, whatever its dtype or shape."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def send(conn, run_id: int, context: int, tag: int, obj, stamp=None) -> tuple[int, int]:
    """Send ``obj`` on ``conn``; return (payload_bytes, header_bytes).

    ``stamp(payload_bytes)``, when given, returns the time at which the (emulated)
    network delivers the message; it travels in the header.
    """
    if type(obj) is np.ndarray and not obj.dtype.hasobject:
        arr = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        ready_at = stamp(arr.nbytes) if stamp else 0.0
        meta = pickle.dumps((arr.dtype.str, arr.shape), protocol=5)
        header = _PREFIX.pack(ARRAY, run_id, context, tag, ready_at, 0) + meta
        conn.send_bytes(header)
        if arr.nbytes:
            conn.send_bytes(_bytes_view(arr))
        return arr.nbytes, len(header)
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    payload = len(body) + sum(r.nbytes for r in raws)
    ready_at = stamp(payload) if stamp else 0.0
    prefix = _PREFIX.pack(OBJECT, run_id, context, tag, ready_at, len(raws))
    prefix += b"".join(_SIZE.pack(r.nbytes) for r in raws)
    conn.send_bytes(prefix + body)
    for r in raws:
        if r.nbytes:
            conn.send_bytes(r)
    return payload, len(prefix)


def recv(conn):
    """Receive one message.

    Returns (run_id, context, tag, ready_at, obj, payload_bytes, t_header): ``t_header``
    is when the header frame had arrived (before it the receiver was only waiting).
    """
    frame = conn.recv_bytes()
    t_header = time.perf_counter()
    kind, run_id, context, tag, ready_at, nbuf = _PREFIX.unpack_from(frame)
    offset = _PREFIX.size
    if kind == ARRAY:
        dtype, shape = pickle.loads(frame[offset:])
        arr = np.empty(shape, dtype=np.dtype(dtype))
        if arr.nbytes:
            n = conn.recv_bytes_into(_bytes_view(arr))
            if n != arr.nbytes:  # pragma: no cover - protocol corruption
                raise RuntimeError(f"expected {arr.nbytes} bytes, got {n}")
        return run_id, context, tag, ready_at, arr, arr.nbytes, t_header
    sizes = [_SIZE.unpack_from(frame, offset + 8 * i)[0] for i in range(nbuf)]
    body = memoryview(frame)[offset + 8 * nbuf:]
    bufs = []
    for size in sizes:
        buf = bytearray(size)  # writable, so arrays inside objects are writable too
        if size:
            conn.recv_bytes_into(buf)
        bufs.append(buf)
    return run_id, context, tag, ready_at, pickle.loads(body, buffers=bufs), len(body) + sum(sizes), t_header
