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
* Releasing in the parent really frees the memory: a segment's pages live as long as *any*
  process maps it, so the parent tells its workers (:func:`add_release_listener`) and they
  unmap it (:func:`detach`) between runs.
* Shared memory is made by the parent and *lent* to workers. A SharedArray created inside
  a worker belongs to that worker and cannot be returned to the parent: returning one
  raises :class:`SharedArrayOwnershipError`, which says what to do instead (create it in
  the parent with ``cluster.share`` / ``SharedArray.create``, pass it to ``run``, let the
  workers write into it; or return ``sa.array.copy()``). The worker's segment is freed
  when it lets go of the array, so it never leaks. Ownership never moves between
  processes: that keeps one simple rule for who frees what.
* Named semaphores that multiprocessing leaves in /dev/shm (``sem.mp-*``) when a kernel
  and its resource tracker are killed together, and the segments of MPICH jobs that crashed or
  aborted (``mpich_shm_*``), are swept too, but only those no living process has mapped:
  :func:`sweep_unmapped`.
"""
from __future__ import annotations

import atexit
import operator
import os
import secrets
import sys
import threading
import weakref
from contextlib import contextmanager
from multiprocessing import shared_memory

import numpy as np

PREFIX = "course_"
SEM_PREFIX = "sem.mp-"  # multiprocessing's named semaphores (SemLock names are "/mp-<random>")
MPICH_PREFIX = "mpich_shm_"  # MPICH's shared-memory segment of a job on one node
SHM_DIR = "/dev/shm"

_owned: dict[str, shared_memory.SharedMemory] = {}  # segments this process created
_attached: dict[str, shared_memory.SharedMemory] = {}  # segments this process attached
_attach_lock = threading.Lock()
_kept_for_views: list = []  # released segments whose memory is still viewed by arrays
_inherited: dict[str, shared_memory.SharedMemory] = {}  # a forked child's copies of the parent's segments
_detach_later: dict[str, shared_memory.SharedMemory] = {}  # dropped while arrays still viewed them
_instances: "weakref.WeakSet[SharedArray]" = weakref.WeakSet()
_release_listeners: list = []  # weak references to callables told each released name
_for_parent = threading.local()  # set while a worker pickles its result for the parent


class SharedArrayOwnershipError(TypeError):
    """A worker tried to return a SharedArray it created: its memory dies with the worker's hold."""


def creator_pid(name: str) -> int | None:
    """The pid in a course segment's name, or None for other names."""
    try:
        return int(name[len(PREFIX):].split("_")[0]) if name.startswith(PREFIX) else None
    except ValueError:
        return None


def _new_name() -> str:
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


def _attach(name: str) -> shared_memory.SharedMemory:
    if name in _owned:
        return _owned[name]
    if name in _inherited:
        return _inherited[name]
    if name not in _attached:
        try:
            if sys.version_info >= (3, 13):
                _attached[name] = shared_memory.SharedMemory(name=name, track=False)
            else:
                _attached[name] = _attach_untracked(name)
        except FileNotFoundError:
            raise ValueError(f"shared array {name} was released by its owner (or its owner died); "
                             "its memory is gone: share the data again") from None
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


def _as_shape(shape) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints, taken as numpy takes one.

    One integer or a sequence of them; numpy integers count (``operator.index``), floats and
    bools are refused with a TypeError (``int(2.5)`` would silently make a smaller array).
    """
    if _is_integer(shape):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"a shape is an int or a sequence of ints, got {shape!r}") from None
    for d in dims:
        if not _is_integer(d):
            raise TypeError(f"a shape holds ints, got {d!r} ({type(d).__name__}) in shape {shape!r}")
    dims = tuple(operator.index(d) for d in dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"a shape holds sizes >= 0, got {dims}")
    return dims


def _is_integer(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


class SharedArray:
    """A numpy array living in a named shared-memory segment.

    >>> sa = SharedArray.from_array(np.arange(4.0))   # in the parent
    >>> cluster.run(fn, sa)                            # fn(comm, sa): sa.array is a zero-copy view
    >>> sa.release()                                   # or use ``with SharedArray...``
    """

    def __init__(self, name: str, shape, dtype, _owner: bool = False):
        self.name = name
        self.shape = _as_shape(shape)
        self.dtype = np.dtype(dtype)
        self._owner = _owner
        self._array = None
        self._released = False
        _instances.add(self)
        if _owner:
            self._finalizer = weakref.finalize(self, _release, name)

    # -- creation -------------------------------------------------------------
    @classmethod
    def create(cls, shape, dtype=np.float64, fill=None) -> "SharedArray":
        shape = _as_shape(shape)
        dtype = np.dtype(dtype)
        if dtype.subdtype is not None:  # np.dtype((float, 3)): its shape belongs to the array's
            dtype, shape = dtype.subdtype[0], shape + dtype.subdtype[1]
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
            if self._released or (self._owner and self.name not in _owned):
                raise ValueError(f"shared array {self.name} was released by its owner; its memory is gone")
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
        """Close and unlink (creator only; a no-op in workers). Workers unmap it between runs."""
        self._array = None
        if self._owner:
            self._released = True
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __reduce__(self):
        # Travels by name only: the receiving process attaches, never owns. The dtype object
        # itself travels (dtype.str is "|V16" for a structured dtype: the fields would be lost).
        if self._owner and getattr(_for_parent, "active", False):
            raise SharedArrayOwnershipError(
                f"the worker function returned a SharedArray it created ({self.name}). Shared memory "
                "created in a worker belongs to that worker and is freed when the worker lets go of it, "
                "so the parent could never read it. Create it in the parent instead "
                "(sa = cluster.share(np.zeros(shape)) or SharedArray.create(shape)), pass it to run() "
                "and let the workers write into it; or return sa.array.copy() to send the values back.")
        return (SharedArray, (self.name, self.shape, self.dtype))

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
    _tell_release_listeners(name)


def add_release_listener(callback) -> None:
    """Call ``callback(name)`` whenever this process releases a segment it created.

    Held weakly (a bound method does not keep its Cluster alive). A Cluster uses it to
    tell its workers to unmap the segment, so its memory is really returned.
    """
    ref = weakref.WeakMethod(callback) if hasattr(callback, "__self__") else weakref.ref(callback)
    _release_listeners.append(ref)


def _tell_release_listeners(name: str) -> None:
    for ref in list(_release_listeners):
        callback = ref()
        if callback is None:
            _release_listeners.remove(ref)
            continue
        try:
            callback(name)
        except Exception:  # a finalizer must never raise; a dead Cluster cannot be told anyway
            pass


def detach(names) -> None:
    """Unmap segments this process attached (or inherited by fork) and no longer needs.

    Arrays that still view a segment keep it mapped; they are retried on the next call.
    """
    names = set(names) | set(_detach_later)
    for sa in list(_instances):
        if sa.name in names and not sa._owner:
            sa._array, sa._released = None, True
    for name in names:
        seg = _attached.pop(name, None) or _inherited.pop(name, None) or _detach_later.pop(name, None)
        if seg is None:
            continue
        try:
            seg.close()
        except BufferError:
            _detach_later[name] = seg  # a view the user holds; retried next time


@contextmanager
def returning_to_parent():
    """While a worker pickles its result: refuse SharedArrays it owns (see the module notes)."""
    _for_parent.active = True
    try:
        yield
    finally:
        _for_parent.active = False


def release_all() -> None:
    """Unlink every segment this process created."""
    for name in list(_owned):
        _release(name)


atexit.register(release_all)


def _forget_ownership_in_child() -> None:
    """A forked child inherits the parent's table of owned segments; it owns none of them.

    The mappings are kept by name in ``_inherited`` (dropping the objects would run their
    ``__del__``, which closes mappings that inherited numpy views may use), so that
    :func:`detach` can unmap them when the parent releases them. The inherited SharedArray
    objects become plain attachments, and drop their cached view so only views the user
    holds keep a mapping. Listeners belong to the parent: a worker must never message
    through the Pipes it inherited.
    """
    _inherited.update(_owned)
    _owned.clear()
    _release_listeners.clear()
    for sa in list(_instances):
        if sa._owner:
            sa._owner, sa._array = False, None


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


def _mapped_shm_inodes() -> set[tuple[int, int]]:
    """(device, inode) of every /dev/shm file mapped by a process we can see.

    By inode, not by path: sem_open creates a semaphore under a temporary name, maps it and
    only then links it to its real name, so /proc/<pid>/maps shows "/dev/shm/sem.XXXXXX (deleted)".
    """
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    if SHM_DIR + "/" not in line:
                        continue
                    _, _, _, device, inode = line.split(None, 5)[:5]
                    major, minor = (int(x, 16) for x in device.split(":"))
                    found.add((os.makedev(major, minor), int(inode)))
        except (OSError, ValueError):  # exited meanwhile, or not ours to read
            continue
    return found


#: Files in /dev/shm that others leave behind when a process is killed, swept when no process maps them.
#: ``sem.mp-*``: multiprocessing's named semaphores (locks and queues of spawn and forkserver
#: contexts). ``mpich_shm_*``: MPICH's segment of a job on one node, left by a job that crashed or aborted.
UNMAPPED_PREFIXES = (SEM_PREFIX, MPICH_PREFIX)


def sweep_unmapped(verbose: bool = False) -> list[str]:
    """Unlink multiprocessing's semaphores and MPICH's segments left behind, never one still in use.

    Python's resource tracker unlinks a semaphore when its creator dies, unless it is killed too
    (a kernel killed with its process group); MPICH unlinks its segment at ``MPI_Finalize``, which a
    crashed or aborted job never reaches. Their names carry no pid, so "in use" is read from
    /proc/*/maps: every process that uses one has it mapped (a file is in use if its inode is).
    Only files of this user are considered (both are created mode 0600: no other user can use them).
    """
    if not os.path.isdir("/proc") or not os.path.isdir(SHM_DIR):
        return []
    candidates = [n for n in os.listdir(SHM_DIR) if n.startswith(UNMAPPED_PREFIXES)]
    if not candidates:
        return []
    mapped = _mapped_shm_inodes()
    removed = []
    for name in candidates:
        path = os.path.join(SHM_DIR, name)
        try:
            st = os.stat(path)
            if st.st_uid != os.getuid() or (st.st_dev, st.st_ino) in mapped:
                continue
            os.unlink(path)
            removed.append(name)
        except FileNotFoundError:
            pass
    if verbose:
        print(f"removed {len(removed)} stale semaphore(s) and MPI segment(s)"
              + (": " + ", ".join(removed) if removed else ""))
    return removed


def list_segments() -> list[str]:
    """Names of course segments in /dev/shm (Linux; other systems cannot list them)."""
    if not os.path.isdir(SHM_DIR):
        return []
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX))


def sweep(verbose: bool = False) -> list[str]:
    """Unlink course segments whose creating process is dead; return their names."""
    removed = []
    for name in list_segments():
        pid = creator_pid(name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
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
    parser.add_argument("--sweep", action="store_true",
                        help="remove segments and semaphores left by dead processes")
    args = parser.parse_args()
    if args.sweep:
        sweep(verbose=True)
        sweep_unmapped(verbose=True)
    else:
        print("\n".join(list_segments()) or "no course segments")
