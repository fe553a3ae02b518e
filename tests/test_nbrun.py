"""course_lib/nbrun.py: a kernel's reply is read within a slice of its arrival, not at the timeout."""
from __future__ import annotations

import asyncio
import time
from queue import Empty

from course_lib import nbrun


class LateWakingChannel:
    """A channel whose poll, like the ZeroMQ one now and then, sees a message only when its own
    timeout runs out (the message arrives 0.1 s after the start)."""

    def __init__(self):
        self.arrives = time.monotonic() + 0.1

    async def get_msg(self, timeout=None):
        await asyncio.sleep(timeout)
        if time.monotonic() >= self.arrives:
            return {"msg": "reply"}
        raise Empty


def test_a_reply_that_does_not_wake_the_poll_is_read_within_a_slice():
    channel = LateWakingChannel()
    nbrun._poll_in_slices(channel)
    t0 = time.monotonic()
    assert asyncio.run(channel.get_msg(timeout=10)) == {"msg": "reply"}
    assert time.monotonic() - t0 < 0.1 + 2 * nbrun.SLICE_S, "waited for the whole timeout"


def test_no_reply_still_times_out_at_the_deadline():
    channel = LateWakingChannel()
    channel.arrives = float("inf")
    nbrun._poll_in_slices(channel)
    t0 = time.monotonic()
    try:
        asyncio.run(channel.get_msg(timeout=0.6))
    except Empty:
        pass
    else:
        raise AssertionError("a message that never came was returned")
    assert 0.6 <= time.monotonic() - t0 < 0.6 + nbrun.SLICE_S + 0.2
