"""The control channel between the grader and the sandboxed kernel.

Two pipes, one each way. A message is a 4-byte big-endian length and then a plain-data value
(:mod:`course_lib.grading.plain`), always a dict with an ``"op"`` key. The grader's side treats
everything it reads as hostile: a length over the limit, malformed data or silence past the
deadline is an error, never a hang or an unbounded allocation.
"""
from __future__ import annotations

import os
import select
import struct
import time
from typing import Optional

from .plain import MAX_BYTES, PlainDataError, decode, encode

_HEADER = struct.Struct(">I")


class ChannelClosed(Exception):
    """The other side closed the pipe (it died, or it was killed)."""


class ChannelTimeout(Exception):
    """No whole message arrived before the deadline."""


def send(fd: int, message: dict) -> None:
    """Write one message (blocking until it is all written)."""
    body = encode(message).encode("utf-8")
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            raise ChannelClosed("the other side closed the channel") from None
        data = data[n:]


def _read_exactly(fd: int, n: int, deadline: Optional[float]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("no answer in time")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise ChannelTimeout("no answer in time")
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        buf += chunk
    return bytes(buf)


def recv(fd: int, timeout: Optional[float] = None) -> dict:
    """Read one message; ``timeout`` in seconds (None: wait for ever)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    (n,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    if n > MAX_BYTES:
        raise PlainDataError(f"message of {n} bytes is over the limit")
    message = decode(_read_exactly(fd, n, deadline).decode("utf-8", "replace"))
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise PlainDataError("a message must be a dict with an 'op'")
    return message
