"""Synchronisation through shared memory: sequence counters that ranks poll, not messages.

A barrier over Pipes costs a system call, a wake-up by the scheduler and a context switch
per message: tens of microseconds on a laptop, more than the whole payload of a small
allreduce. MPI libraries synchronise ranks on one machine by *polling flags in shared
memory* instead; this module does the same, in Python.

The algorithm (a flat counter barrier, split into ``arrive`` and ``wait``)
--------------------------------------------------------------------------
Each of the p ranks owns one 64-bit **sequence counter** in a shared segment, alone on
its own 64-byte cache line (so that ranks polling one counter do not disturb the others).
Passing phase k of a protocol is two steps:

* ``arrive()``: rank r stores ``k`` in its own counter (one plain store; nobody else ever
  writes it: a *single-writer* register, so no atomic read-modify-write is needed);
* ``wait(k)``: poll the other counters until every one is ``>= k``.

Counters only grow, so a rank that is already further ahead also satisfies ``>= k``, and
a rank can never be more than one phase ahead of the slowest (it would wait for it).
Cost: one store and p loads per poll; an arrival becomes visible on another core after
one cache-line transfer (~0.1 µs), against ~10-50 µs for a message through the kernel.
Splitting the barrier ("fuzzy barrier", Gupta 1989) lets a rank announce it is done with
a buffer without waiting for anybody; whoever needs the buffer next waits for it.

Mellor-Crummey and Scott (1991) survey barriers on shared memory: the centralised
sense-reversing barrier needs an atomic fetch-and-add, which Python does not have; their
tree and dissemination barriers make each rank spin on a flag that *others* write. With
p <= 8 processes on one machine the flat barrier here is as fast and simpler, and every
slot has exactly one writer. Counters are signed 64-bit and never wrap: 2**63 phases at
one per microsecond take 290,000 years.

Why plain loads and stores are enough (x86-64 only)
---------------------------------------------------
The protocol relies on three orderings: a writer's payload stores become visible before
its counter store (store -> store), a reader's counter load happens before its payload
loads (load -> load), and a reader's payload loads complete before its own later counter
store (load -> store), after which another rank may overwrite that payload. x86-64's
memory model (TSO; Intel SDM vol. 3, 9.2.2) guarantees all three in hardware; its one
relaxation, a store followed by a load of another address, only delays when an arrival
is seen, which costs time, not correctness (we never need Dekker-style mutual exclusion).
Aligned 8-byte loads and stores are single, untorn accesses (SDM 9.1.1); segments are
page-aligned and slots are 8-byte aligned. The compiler cannot reorder either: each step
is a separate C call made by the interpreter (numpy's copy or reduce loop returns before
the counter store of the next statement begins).

ARM64 (Apple silicon, Graviton) and POWER may reorder all three, and Python offers no
memory fence, so on those machines :data:`ORDERED_MEMORY` is False and callers must
synchronise through the kernel instead (a Pipe barrier orders memory: its system calls
take locks that do). Set ``COURSE_SHM_SPIN=1`` to force the fast path anyway (unsafe).

Waiting without starving anybody
--------------------------------
A student laptop runs more ranks than cores: 4 processes on 2 cores is the normal case.
A rank that polls without pause then steals the core of the rank it is waiting for, so
``wait`` polls for up to :data:`SPIN_S` seconds (not at all when there are more ranks than
usable cores; halving the budget after every wait during which another process took the
core, and growing it back after waits that kept it: a busy machine may put two of our ranks
on one core), then calls ``os.sched_yield()`` between polls (the scheduler runs another
ready process on this core, if there is one) for :data:`YIELD_S`, then sleeps 50 µs,
doubling up to :data:`MAX_SLEEP_S`.

A rank that died must not leave the others spinning for ever: each rank writes its pid
into the segment when it joins, and every :data:`CHECK_EVERY_S` while backing off a
waiter checks that the ranks it waits for are still alive (not gone, not a zombie); a
rank that gives up marks the segment *broken*, so the other waiters stop too. A peer that
is alive but never arrives is reported after ``timeout`` seconds, naming the rank. (The
Cluster's run timeout and its kill of every worker after a failed run remain a backstop,
but they name every rank still running, not the one everybody waits for.)
"""
from __future__ import annotations

import operator
import os
import platform
import time

LINE_WORDS = 8            # 64-byte cache line / 8-byte words
HEADER_WORDS = LINE_WORDS  # line 0: magic, size, broken-by (rank + 1, or 0)
MAGIC = 0x5350494E42415252  # "SPINBARR"
SEQ, PID = 0, 1           # word offsets inside a rank's line

SPIN_S = 20e-6            # poll flat out this long: about what yielding the core and getting
#                           it back costs (spin about as long as blocking would cost: Karlin
#                           et al., 1991); not at all when there are more ranks than cores,
#                           since then a rank we wait for is off-CPU and polling delays it
#                           (measured: p=4 on 2 cores, 4 KB: 50 µs of spinning 130 µs a call,
#                           none 55 µs)
YIELD_S = 2e-3            # then yield the core between polls this long
MAX_SLEEP_S = 1e-3        # then sleep, doubling from 50 µs up to this
DESCHEDULED_S = 2e-6      # a gap this long between two polls: another process had the core
#                           (a poll plus a yield that does not switch: ~1 µs here; a switch
#                           to a rank on the same core and back: ~4 µs)
CHECK_EVERY_S = 0.05      # liveness of the awaited ranks, while backing off
DEFAULT_TIMEOUT_S = float(os.environ.get("COURSE_SHM_TIMEOUT", 60.0))

_X86 = {"x86_64", "amd64", "i386", "i686", "x86"}
ORDERED_MEMORY = platform.machine().lower() in _X86 or os.environ.get("COURSE_SHM_SPIN") == "1"


class SyncError(RuntimeError):
    """A shared-memory wait gave up: a peer died, gave up itself, or never arrived."""

    def __init__(self, message: str, ranks=()):
        super().__init__(message)
        self.ranks = list(ranks)


class PeerDied(SyncError):
    pass


class SyncTimeout(SyncError, TimeoutError):
    pass


def _as_count(value, what: str) -> int:
    """A plain int (numpy integers welcome); a float or a bool is a caller's mistake."""
    if isinstance(value, bool):
        raise TypeError(f"SpinBarrier {what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"SpinBarrier {what} must be an int, got {value!r}") from None


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:               # macOS, Windows
        return os.cpu_count() or 1


def control_words(size: int) -> int:
    """Number of int64 words a barrier for ``size`` ranks needs (header + one line per rank)."""
    return HEADER_WORDS + size * LINE_WORDS


def control_nbytes(size: int) -> int:
    return 8 * control_words(size)


class SpinBarrier:
    """Sequence counters of ``size`` ranks in ``buffer`` (writable, >= control_nbytes(size)).

    Every rank builds one on the same zero-filled memory (a :class:`~.shm.SharedArray` of
    ``control_words(size)`` int64, or a slice of a raw segment), then uses::

        k = bar.arrive()      # "I have finished phase k" (never blocks)
        bar.wait(k)           # until every rank has finished phase k
        bar.barrier()         # both: a full barrier

    ``arrive`` returns the rank's next sequence number; all ranks must make the same
    sequence of calls. The object is per process; the counters live in the segment, so a
    barrier rebuilt on the same memory continues where the previous one stopped.
    """

    def __init__(self, buffer, size: int, rank: int, timeout: float | None = DEFAULT_TIMEOUT_S):
        size, rank = _as_count(size, "size"), _as_count(rank, "rank")
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside 0..{size - 1}")
        raw = memoryview(buffer).cast("B")
        if raw.nbytes < control_nbytes(size):
            raise ValueError(f"a SpinBarrier for {size} ranks needs {control_nbytes(size)} bytes, "
                             f"got {raw.nbytes}")
        self._views = [raw, raw[:control_nbytes(size)].cast("q")]   # released by close()
        self._words = self._views[-1]
        self.size, self.rank, self.timeout = size, rank, timeout
        self.spin_s = SPIN_S if size <= usable_cpus() else 0.0
        self._mine = self._line(rank) + SEQ
        self._others = [self._line(i) + SEQ for i in range(size) if i != rank]
        self._procs: dict[int, object] = {}     # rank -> psutil.Process, for liveness checks
        self._init_header()
        self._words[self._line(rank) + PID] = os.getpid()
        self.seq = self._words[self._mine]      # continue where this rank's counter stands

    @staticmethod
    def _line(rank: int) -> int:
        return HEADER_WORDS + rank * LINE_WORDS

    def _init_header(self) -> None:
        w = self._words
        if w[0] == 0:                     # fresh memory: every rank writes the same values
            w[1] = self.size
            w[0] = MAGIC
        elif w[0] != MAGIC or w[1] != self.size:
            raise ValueError(f"this memory holds no SpinBarrier for {self.size} ranks "
                             f"(magic {w[0]:#x}, size {w[1]})")

    # -- the protocol ------------------------------------------------------------
    def arrive(self) -> int:
        """Publish the end of this rank's next phase; return its sequence number."""
        self.seq += 1
        self._words[self._mine] = self.seq    # the one store others poll (see module doc)
        return self.seq

    def wait(self, seq: int) -> None:
        """Return once every rank's counter is >= seq (they all finished phase ``seq``)."""
        words = self._words
        for slot in self._others:              # usually someone is late: poll in the slow path
            if words[slot] < seq:
                self._wait_slow(seq)
                return

    def barrier(self) -> None:
        self.wait(self.arrive())

    @property
    def broken_by(self) -> int | None:
        """Rank that gave up on this barrier (its waits now fail everywhere), or None."""
        b = self._words[2]
        return None if b == 0 else int(b) - 1

    def check_usable(self) -> None:
        if self.broken_by is not None:
            raise SyncError(f"rank {self.rank}: this shared-memory barrier was abandoned by rank "
                            f"{self.broken_by} after a failure; restart the cluster", [self.broken_by])

    def close(self) -> None:
        """Drop this process's views of the buffer (so its segment can be closed)."""
        for v in reversed(self._views):
            v.release()
        self._views.clear()

    # -- waiting -----------------------------------------------------------------
    def _behind(self, seq: int) -> list[int]:
        return [i for i in range(self.size) if self._words[self._line(i) + SEQ] < seq]

    def _wait_slow(self, seq: int) -> None:
        words, others = self._words, self._others
        start = last = time.perf_counter()
        next_check = start + CHECK_EVERY_S
        sleep = 50e-6
        lost_the_core = False
        while True:
            for slot in others:
                if words[slot] < seq:
                    break
            else:
                self._adapt_spin(lost_the_core)
                return
            now = time.perf_counter()
            lost_the_core |= now - last > DESCHEDULED_S
            last = now
            waited = now - start
            if waited < self.spin_s:
                continue
            if waited < self.spin_s + YIELD_S:
                os.sched_yield()
            else:
                time.sleep(sleep)
                sleep = min(2 * sleep, MAX_SLEEP_S)
                last = time.perf_counter()    # a sleep is not a lost core
            if now >= next_check:
                self._check_peers(seq, waited)
                next_check = now + CHECK_EVERY_S

    def _adapt_spin(self, lost_the_core: bool) -> None:
        """Spin half as long next time if this wait lost the core, else up to twice as long.

        Two polls more than DESCHEDULED_S apart mean another process ran on this core in
        between (a yield that switched, or a preemption): the core is shared, perhaps with
        the rank we wait for (a busy machine may put two of our ranks on one core), and
        spinning would only delay it. Otherwise the ranks run side by side and spinning
        is the fastest way to see them arrive.
        """
        if lost_the_core:
            self.spin_s /= 2
        else:
            self.spin_s = min(SPIN_S, 2 * self.spin_s + 1e-6)

    def _check_peers(self, seq: int, waited: float) -> None:
        """Raise if a rank we wait for is dead, gave up, or is late beyond the timeout."""
        self.check_usable()
        behind = self._behind(seq)
        dead = [i for i in behind if not self._alive(i)]
        if dead:
            self._give_up()
            raise PeerDied(f"rank {self.rank}: rank(s) {dead} died before reaching shared-memory "
                           f"phase {seq}; stopped waiting for them", dead)
        if self.timeout is not None and waited > self.timeout:
            self._give_up()
            raise SyncTimeout(f"rank {self.rank}: waited {waited:.0f} s at shared-memory phase {seq} "
                              f"for rank(s) {behind}, alive but not arriving (is every rank making "
                              f"the same collective calls?)", behind)

    def _alive(self, rank: int) -> bool:
        import psutil

        pid = self._words[self._line(rank) + PID]
        if pid == 0:
            return True                     # not joined yet: only the timeout can tell
        proc = self._procs.get(rank)
        try:
            if proc is None or proc.pid != pid:
                proc = self._procs[rank] = psutil.Process(pid)
            # is_running() also notices a pid reused by another process; a zombie is dead
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def _give_up(self) -> None:
        self._words[2] = self.rank + 1      # any rank may set it; every value means "broken"
