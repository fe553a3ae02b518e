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
* A segment's memory is reserved when it is made (``posix_fallocate``): /dev/shm is a tmpfs
  that hands out pages only when they are first written, and a write that finds it full is
  answered with SIGBUS, which kills the process (a container's 64 MB /dev/shm killed the
  notebook's kernel that way). What does not fit in /dev/shm lives in a file of the temporary
  folder instead (:class:`FileSegment`, said once with the fix, ``docker run --shm-size``);
  with no room there either, creating raises an OSError that says so.
* Named semaphores that multiprocessing leaves in /dev/shm (``sem.mp-*``) when a kernel
  and its resource tracker are killed together, and the segments of MPICH jobs that crashed or
  aborted (``mpich_shm_*``), are swept too, but only those no living process has mapped:
  :func:`sweep_unmapped`.
"""
from __future__ import annotations

import atexit
import errno
import mmap
import operator
import os
import re
import secrets
import sys
import tempfile
import threading
import warnings
import weakref
from contextlib import contextmanager
from multiprocessing import shared_memory

import numpy as np

PREFIX = "course_"
SEM_PREFIX = "sem.mp-"  # multiprocessing's named semaphores (SemLock names are "/mp-<random>")
MPICH_PREFIX = "mpich_shm_"  # MPICH's shared-memory segment of a job on one node
SHM_DIR = "/dev/shm"
_FILE_SEGMENT_NAME = re.compile(r"course_\d+_[0-9a-f]{8}")  # a FileSegment's file: _new_name()
SHM_SIZE_FIX = "docker run --shm-size=2g ..."  # what a container needs (docker compose: shm_size: 2gb)

# A segment is a shared_memory.SharedMemory in /dev/shm, or a FileSegment when /dev/shm was too small.
_owned: dict[str, "Segment"] = {}  # segments this process created
_attached: dict[str, "Segment"] = {}  # segments this process attached
_attach_lock = threading.Lock()
_kept_for_views: list = []  # released segments whose memory is still viewed by arrays
_inherited: dict[str, "Segment"] = {}  # a forked child's copies of the parent's segments
_detach_later: dict[str, "Segment"] = {}  # dropped while arrays still viewed them
_instances: "weakref.WeakSet[SharedArray]" = weakref.WeakSet()
_release_listeners: list = []  # weak references to callables told each released name
_for_parent = threading.local()  # set while a worker pickles its result for the parent


class SharedArrayOwnershipError(TypeError):
    """A worker tried to return a SharedArray it created: its memory dies with the worker's hold."""


class SharedMemoryFallbackWarning(UserWarning):
    """/dev/shm had no room for a shared array: it lives in a file of the temporary folder."""


def creator_pid(name: str) -> int | None:
    """The pid in a course segment's name (or a file segment's path), or None for other names."""
    name = os.path.basename(name)
    try:
        return int(name[len(PREFIX):].split("_")[0]) if name.startswith(PREFIX) else None
    except ValueError:
        return None


def _new_name() -> str:
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


def _attach(name: str) -> Segment:
    if name in _owned:
        return _owned[name]
    if name in _inherited:
        return _inherited[name]
    if name not in _attached:
        try:
            _attached[name] = _attach_untracked(name)
        except FileNotFoundError:
            raise ValueError(f"shared array {name} was released by its owner (or its owner died); "
                             "its memory is gone: share the data again") from None
    return _attached[name]


def _attach_untracked(name: str) -> Segment:
    """Attach without registering with a resource tracker (what ``track=False`` does in 3.13).

    Before 3.13 attaching registers the name. Under forkserver each worker then starts
    a tracker of its own, which *unlinks the parent's segment* when the worker exits.
    Registering is skipped, never undone: unregistering could break the parent's cleanup.
    A file segment (its name is a path) is known to no tracker.
    """
    from multiprocessing import resource_tracker

    if os.path.isabs(name):
        return FileSegment(name)
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    with _attach_lock:
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = register


# -- where a segment lives: /dev/shm, or a file when /dev/shm is too small --------------------
class FileSegment:
    """Shared memory in an ordinary file, for arrays /dev/shm has no room for.

    It offers what this module uses of a ``SharedMemory`` (``name``, ``size``, ``buf``,
    ``close``, ``unlink``). Its name is the file's absolute path: that is how a process
    attaching by name tells the two kinds apart, and the file name is a segment name
    (``course_<pid>_<token>``) so that :func:`sweep` finds it once its creator is dead. Every
    process maps the file shared and sees the same bytes; the kernel may write pages back to
    disk in the background, which costs time, never correctness.
    """

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)   # the mapping keeps the file open
        self.name, self.size = path, len(self._mmap)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        """Unmap; raises BufferError while numpy views use the memory (as SharedMemory does)."""
        if self.buf is not None:
            self.buf.release()
            self.buf = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def unlink(self) -> None:
        os.unlink(self.name)


Segment = shared_memory.SharedMemory | FileSegment   # what this module maps, of either kind


def _create_segment(nbytes: int) -> Segment:
    """A new segment of ``nbytes`` whose memory is reserved: in /dev/shm if it fits, else a file."""
    name = _new_name()
    if not os.path.isdir(SHM_DIR):   # macOS: shm_open's segments are no files to check or reserve
        return shared_memory.SharedMemory(name=name, create=True, size=nbytes)
    if _free_bytes(SHM_DIR) < nbytes:
        sweep()                       # the segments of a kernel killed hard may be what fills it
    if _free_bytes(SHM_DIR) >= nbytes:
        seg = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        if _reserve(os.path.join(SHM_DIR, name), nbytes):
            return seg
        seg.close()                   # another process took the space since we looked
        seg.unlink()
    return _create_file_segment(name, nbytes)


def _create_file_segment(name: str, nbytes: int) -> FileSegment:
    folder = tempfile.gettempdir()
    path = os.path.join(folder, name)
    if _free_bytes(folder) >= nbytes:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)   # 0600: as shm_open makes them
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        if _reserve(path, nbytes):
            _say_once_that_it_fell_back(nbytes, folder)
            return FileSegment(path)
        os.unlink(path)
    raise _no_room_error(nbytes, folder)


def _reserve(path: str, nbytes: int) -> bool:
    """Allocate a segment's pages now; False if the file system has no room for them.

    A tmpfs (or a disk) allocates a page when it is first written, and a write through a
    mapping that finds it full gets SIGBUS, which kills the process: asking for every page
    up front turns that into ENOSPC here, where it can be handled.
    """
    if not hasattr(os, "posix_fallocate"):
        return True                   # cannot reserve: the free-space check has to do
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            return False
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise                     # (those three: a file system that cannot reserve)
    finally:
        os.close(fd)
    return True


def _free_bytes(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _dev_shm_state() -> str:
    st = os.statvfs(SHM_DIR)
    return f"{SHM_DIR} (shared memory) has {_mib(st.f_bavail * st.f_frsize)} free of {_mib(st.f_blocks * st.f_frsize)}"


_fell_back = False


def _say_once_that_it_fell_back(nbytes: int, folder: str) -> None:
    global _fell_back
    if _fell_back:
        return
    _fell_back = True
    warnings.warn(
        f"{_dev_shm_state()}: too little for a shared array of {_mib(nbytes)}, so it lives in a "
        f"file in {folder} instead, and so will others that do not fit (said once). Workers share "
        f"it just the same; the system may write its pages to disk, which can be slower. "
        f"Containers get a small /dev/shm (Docker's default is 64 MB): start yours with more, "
        f"e.g. `{SHM_SIZE_FIX}`.", SharedMemoryFallbackWarning, stacklevel=_stacklevel_of_the_caller())


def _stacklevel_of_the_caller() -> int:
    """The stack level of the first frame outside this package: the warning names the user's line."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _no_room_error(nbytes: int, folder: str) -> OSError:
    return OSError(errno.ENOSPC, (
        f"no room for a shared array of {_mib(nbytes)}: {_dev_shm_state()}, and the temporary "
        f"folder {folder} has {_mib(_free_bytes(folder))} free. Containers get a small /dev/shm "
        f"(Docker's default is 64 MB): start yours with more, e.g. `{SHM_SIZE_FIX}` "
        f"(docker compose: shm_size), or release shared arrays you no longer need "
        f"(sa.release(), cluster.close())."))


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
        seg = _create_segment(max(nbytes, 1))
        _owned[seg.name] = seg
        out = cls(seg.name, shape, dtype, _owner=True)
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
    """Course segments: names in /dev/shm, then paths of file segments (Linux; others cannot list)."""
    if not os.path.isdir(SHM_DIR):
        return []
    names = sorted(n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX))
    folder = tempfile.gettempdir()
    try:
        files = sorted(os.path.join(folder, n) for n in os.listdir(folder) if _FILE_SEGMENT_NAME.fullmatch(n))
    except OSError:
        files = []
    return names + files


def segment_path(name: str) -> str:
    """The file behind a segment's name (a file segment's name is already its path)."""
    return os.path.join(SHM_DIR, name)   # join keeps an absolute name as it is


def sweep(verbose: bool = False) -> list[str]:
    """Unlink course segments (file segments too) whose creating process is dead; return their names."""
    removed = []
    for name in list_segments():
        pid = creator_pid(name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            try:
                os.unlink(segment_path(name))
                removed.append(name)
            except (FileNotFoundError, PermissionError):   # gone meanwhile; another user's
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
