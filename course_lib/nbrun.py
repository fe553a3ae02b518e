"""Executing a notebook headless, as a student's Run All would: :func:`execute`.

One home for the course's headless runs (the release's recording of each lesson, the tests'
runs of lessons, solutions and release lessons). It is nbclient's ``NotebookClient`` with one
change: every wait for a message from the kernel polls in short slices.

Why: nbclient waits for a cell's reply with one ``get_msg(timeout=T)``, an asyncio poll of a
ZeroMQ socket. Now and then a reply that has already arrived does not wake that poll, which then
returns it only when T runs out (nbclient issue 312, seen with widget cells). Here that showed as
a lesson whose cells took 20 s in all finishing after 143 s, a gap of exactly the 120 s cell
timeout before one cell (and lesson 02 taking 265 s in CI, its timeout then being 240 s). Polling
in slices of :data:`SLICE_S` bounds the delay by the slice; the overall deadline stays T.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from queue import Empty

SLICE_S = 0.25


def _poll_in_slices(channel) -> None:
    """Make ``channel.get_msg(timeout=T)`` poll in slices of at most SLICE_S, until T."""
    whole = channel.get_msg

    async def get_msg(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else max(0.0, min(SLICE_S, deadline - time.monotonic()))
            try:
                return await whole(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = get_msg


def client(nb, cwd: Path, timeout: float = 240, allow_errors: bool = False):
    """A NotebookClient for ``nb`` (executed in folder ``cwd``) whose waits poll in slices."""
    from nbclient import NotebookClient

    class SlicedPolls(NotebookClient):
        async def async_start_new_kernel_client(self):
            kc = await super().async_start_new_kernel_client()
            for channel in (kc.shell_channel, kc.iopub_channel):
                _poll_in_slices(channel)
            return kc

    return SlicedPolls(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                       resources={"metadata": {"path": str(cwd)}})


@contextmanager
def environment(env: dict):
    """``os.environ`` replaced for the duration of a ``with`` (a kernel started inside inherits it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def execute(nb, cwd: Path, timeout: float = 240, allow_errors: bool = False, env: dict | None = None) -> float:
    """Execute ``nb`` in place (outputs and timings into its cells) in folder ``cwd``, under
    ``env`` (default: this process's environment); returns the seconds it took."""
    run = client(nb, cwd, timeout, allow_errors)
    with environment(dict(os.environ) if env is None else env):
        t0 = time.perf_counter()
        run.execute()
        return time.perf_counter() - t0


__all__ = ["SLICE_S", "client", "environment", "execute"]
