"""numpy arrays in ``multiprocessing.shared_memory``: created by one process, attached by name.

Rules this module enforces (each one prevents a real leak or crash):

* The creator owns a segment: it alone closes and unlinks it (on ``release()``, on
  leaving a ``with`` block, when the object is garbage collected, or at interpreter exit).
* A worker that receives a :class:`SharedArray` attaches by name and never unlinks or
  unregisters it (unregistering would hide the segment from the resource tracker that
  cleans up after a crash).
* Views are made with ``np.frombuffer``, which keeps the mapping alive for as long as
  the array exists (``np.ndarray(buffer=...)`` does not, and segfaults after ``close()``).
* Names carry a prefix and the creator's pid (``course_<pid>_<token>``), so segments left
  by a killed kernel can be swept once their owner is dead: :func:`sweep`.
"""
from __future__ import annotations

import atexit
import os
import secrets
import sys
import threading
import weakref
from multiprocessing import shared_memory

import numpy as np

PREFIX = "course_"
SHM_DIR = "/dev/shm"

_owned: dict[str, shared_memory.SharedMemory] = {}  # segments this process created
_attached: dict[str, shared_memory.SharedMemory] = {}  # segments this process attached
_attach_lock = threading.Lock()
_kept_for_views: list = []  # released segments whose memory is still viewed by arrays


def _new_name() -> str:
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


def _attach(name: str) -> shared_memory.SharedMemory:
    if name in _owned:
        return _owned[name]
    if name not in _attached:
        if sys.version_info >= (3, 13):
            _attached[name] = shared_memory.SharedMemory(name=name, track=False)
        else:
            _attached[name] = _attach_untracked(name)
    return _attached[name]


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach without registering with a resource tracker (what ``track=False`` does in 3.13).

    Before 3.13 attaching registers the name. Under forkserver each worker then starts
    a tracker of its own, which *unlinks the parent's segment* when the worker exits.
    Registering is skipped, never undone: unregistering could break the parent's cleanup.
    """
    from multiprocessing import resource_tracker

    with _attach_lock:
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = register


class SharedArray:
    """A numpy array living in a named shared-memory segment.

    >>> sa = SharedArray.from_array(np.arange(4.0))   # in the parent
    >>> cluster.run(fn, sa)                            # fn(comm, sa): sa.array is a zero-copy view
    >>> sa.release()                                   # or use ``with SharedArray...``
    """

    def __init__(self, name: str, shape, dtype, _owner: bool = False):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._owner = _owner
        self._array = None
        if _owner:
            self._finalizer = weakref.finalize(self, _release, name)

    # -- creation -------------------------------------------------------------
    @classmethod
    def create(cls, shape, dtype=np.float64, fill=None) -> "SharedArray":
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(shape)
        if any((not isinstance(s, (int, np.integer))) or s < 0 for s in shape):
            raise ValueError(f"shape must be non-negative integers, got {shape!r}")
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError("shared arrays cannot hold Python objects (dtype=object)")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        name = _new_name()
        seg = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
        _owned[name] = seg
        out = cls(name, shape, dtype, _owner=True)
        if fill is not None:
            out.array[...] = fill
        return out

    @classmethod
    def from_array(cls, a) -> "SharedArray":
        a = np.asarray(a)
        out = cls.create(a.shape, a.dtype)
        out.array[...] = a
        return out

    # -- access ---------------------------------------------------------------
    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            if self._owner and self.name not in _owned:
                raise ValueError(f"shared array {self.name} was released")
            seg = _attach(self.name)
            count = int(np.prod(self.shape, dtype=np.int64))
            flat = np.frombuffer(seg.buf, dtype=self.dtype, count=count)
            self._array = flat.reshape(self.shape)
        return self._array

    def __array__(self, dtype=None, copy=None):
        a = self.array
        return a if dtype is None else a.astype(dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, idx):
        return self.array[idx]

    def __setitem__(self, idx, value):
        self.array[idx] = value

    # -- lifetime -------------------------------------------------------------
    def release(self) -> None:
        """Close and unlink (creator only; a no-op in workers)."""
        self._array = None
        if self._owner:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __reduce__(self):
        # Travels by name only: the receiving process attaches, never owns.
        return (SharedArray, (self.name, self.shape, self.dtype.str))

    def __repr__(self):
        return f"SharedArray(name={self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _release(name: str) -> None:
    seg = _owned.pop(name, None)
    if seg is None:
        return
    try:
        seg.close()
    except BufferError:
        # Views still exist: the mapping must outlive them (np.frombuffer holds it), so
        # keep the object (its __del__ would try to close again); the name goes now.
        _kept_for_views.append(seg)
    try:
        seg.unlink()
    except FileNotFoundError:
        pass


def release_all() -> None:
    """Unlink every segment this process created."""
    for name in list(_owned):
        _release(name)


atexit.register(release_all)


def _forget_ownership_in_child() -> None:
    """A forked child inherits the parent's table of owned segments; it owns none of them.

    The objects are kept (not dropped): their ``__del__`` would try to close mappings that
    inherited numpy views still use, and print BufferErrors from every worker.
    """
    _kept_for_views.extend(_owned.values())
    _owned.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_ownership_in_child)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_segments() -> list[str]:
    """Names of course segments in /dev/shm (Linux; other systems cannot list them)."""
    if not os.path.isdir(SHM_DIR):
        return []
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX))


def sweep(verbose: bool = False) -> list[str]:
    """Unlink course segments whose creating process is dead; return their names."""
    removed = []
    for name in list_segments():
        try:
            pid = int(name[len(PREFIX):].split("_")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    if verbose:
        print(f"removed {len(removed)} stale segment(s)" + (": " + ", ".join(removed) if removed else ""))
    return removed


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Shared-memory housekeeping for the course.")
    parser.add_argument("--sweep", action="store_true", help="remove segments left by dead processes")
    args = parser.parse_args()
    if args.sweep:
        sweep(verbose=True)
    else:
        print("\n".join(list_segments()) or "no course segments")
