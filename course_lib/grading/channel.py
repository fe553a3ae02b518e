"""The control channel between the grader and the sandboxed kernel.

Two pipes, one each way. A message is a 4-byte big-endian length and then a plain-data value
(:mod:`course_lib.grading.plain`), always a dict with an ``"op"`` key. The grader's side treats
everything it reads as hostile: a length over the limit or silence past the deadline is an
error, never a hang or an unbounded allocation; a whole message that is not plain data (or past
one of plain data's bounds) is :class:`BadMessage`, after which the channel is still in step.

The grader writes with a deadline too (``send(..., timeout=)``, on a non-blocking pipe): a kernel
that stops reading its requests cannot block the grader.
"""
from __future__ import annotations

import os
import select
import struct
import time
from typing import Optional

from .plain import DECODE_SECONDS, MAX_BYTES, PlainDataError, decode, encode

_HEADER = struct.Struct(">I")


class ChannelClosed(Exception):
    """The other side closed the pipe (it died, or it was killed)."""


class ChannelTimeout(Exception):
    """No whole message arrived (or could be written) before the deadline."""


class BadMessage(PlainDataError):
    """A whole message arrived but is not plain data: the channel is still in step."""


def _wait(fd: int, event: int, deadline: Optional[float], what: str) -> None:
    """Wait until ``fd`` is ready for ``event`` (select.POLLIN or POLLOUT), or raise ChannelTimeout."""
    poller = select.poll()
    poller.register(fd, event)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ChannelTimeout(what)
        if poller.poll(None if left is None else max(1, int(left * 1000) + 1)):
            return


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def send(fd: int, message: dict, timeout: Optional[float] = None) -> None:
    """Write one message; ``timeout`` in seconds (None: block until it is all written)."""
    deadline = _deadline(timeout)
    body = encode(message).encode("utf-8")
    data = memoryview(_HEADER.pack(len(body)) + body)
    if deadline is not None:
        os.set_blocking(fd, False)   # a blocking write of more than the pipe holds would wait for ever
    while data:
        if deadline is not None:
            _wait(fd, select.POLLOUT, deadline, "the other side did not read in time")
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            continue
        except BrokenPipeError:
            raise ChannelClosed("the other side closed the channel") from None
        data = data[n:]


def _read_exactly(fd: int, n: int, deadline: Optional[float]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            _wait(fd, select.POLLIN, deadline, "no answer in time")
        try:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
        except BlockingIOError:
            _wait(fd, select.POLLIN, deadline, "no answer in time")
            continue
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        buf += chunk
    return bytes(buf)


def recv(fd: int, timeout: Optional[float] = None, decode_timeout: Optional[float] = DECODE_SECONDS) -> dict:
    """Read one message; ``timeout`` in seconds for it to arrive (None: wait for ever).

    Raises :class:`ChannelTimeout`, :class:`ChannelClosed`, :class:`PlainDataError` for a length
    over the limit (the channel is then out of step), or :class:`BadMessage` for a whole message
    that is not plain data (decoding is bounded: ``decode_timeout`` seconds, and see
    :func:`~course_lib.grading.plain.decode`)."""
    deadline = _deadline(timeout)
    (n,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    if n > MAX_BYTES:
        raise PlainDataError(f"a message of {n >> 20} MiB, over the limit of {MAX_BYTES >> 20} MiB")
    body = _read_exactly(fd, n, deadline)
    try:
        message = decode(body, timeout=decode_timeout)
    except PlainDataError as e:
        raise BadMessage(str(e)) from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise BadMessage("a message must be a dict with an 'op'")
    return message
