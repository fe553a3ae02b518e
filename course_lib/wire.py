"""How objects cross a Pipe: a small header frame, then raw buffers.

A numpy array is never pickled: its header (dtype, shape) goes in one frame and its
memory goes in a second frame with ``send_bytes``; the receiver allocates an empty array
and fills it with ``recv_bytes_into`` (one copy, from the socket into the array).
Any other object is pickled with protocol 5, so arrays *inside* it also travel as
out-of-band raw buffers rather than inside the pickle.

Frame 1 is always ``pickle((envelope, kind, meta))``; ``kind`` says what follows.
The payload size counted in the statistics is:
  * an ndarray: exactly ``arr.nbytes``;
  * any other object: the pickle's length plus its out-of-band buffers.
"""
from __future__ import annotations

import pickle

import numpy as np

ARRAY, OBJECT = 0, 1


def _contiguous(arr: np.ndarray) -> np.ndarray:
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _bytes_view(arr: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array, whatever its dtype or shape."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def send(conn, envelope, obj, stamp=None) -> tuple[int, int]:
    """Send ``obj`` on ``conn``; return (payload_bytes, header_bytes).

    ``stamp(payload_bytes)``, when given, returns a value appended to the envelope
    (the emulated network uses it to tell the receiver when the message "arrives").
    """
    if type(obj) is np.ndarray and not obj.dtype.hasobject:
        arr = _contiguous(obj)
        if stamp is not None:
            envelope = envelope + (stamp(arr.nbytes),)
        header = pickle.dumps((envelope, ARRAY, (arr.dtype.str, arr.shape)), protocol=5)
        conn.send_bytes(header)
        if arr.nbytes:
            conn.send_bytes(_bytes_view(arr))
        return arr.nbytes, len(header)
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = tuple(r.nbytes for r in raws)
    if stamp is not None:
        envelope = envelope + (stamp(len(body) + sum(sizes)),)
    header = pickle.dumps((envelope, OBJECT, (body, sizes)), protocol=5)
    conn.send_bytes(header)
    for r in raws:
        if r.nbytes:
            conn.send_bytes(r)
    return len(body) + sum(sizes), len(header) - len(body)


def recv(conn):
    """Receive one message; return (envelope, obj, payload_bytes)."""
    envelope, kind, meta = pickle.loads(conn.recv_bytes())
    if kind == ARRAY:
        dtype, shape = meta
        arr = np.empty(shape, dtype=np.dtype(dtype))
        if arr.nbytes:
            n = conn.recv_bytes_into(_bytes_view(arr))
            if n != arr.nbytes:  # pragma: no cover - protocol corruption
                raise RuntimeError(f"expected {arr.nbytes} bytes, got {n}")
        return envelope, arr, arr.nbytes
    body, sizes = meta
    bufs = []
    for size in sizes:
        buf = bytearray(size)
        if size:
            conn.recv_bytes_into(buf)
        bufs.append(buf)
    return envelope, pickle.loads(body, buffers=bufs), len(body) + sum(sizes)
