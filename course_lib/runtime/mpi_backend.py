"""The ``mpi`` backend: the same ``fn(comm, ...)`` programs, on a real MPI job.

Run a script under ``mpiexec -n P python -m course_lib.run script.py`` and every rank gets
an :class:`MPIComm`. It *is* a :class:`course_lib.runtime.comm.Comm`: the same send/recv, tags,
collectives (lesson 02's algorithms, byte for byte), compute phases, stats and timeline;
only the transport differs. Each neighbour's Pipe is replaced by an :class:`MPILink`
that moves the same frames with ``MPI_Send``/``MPI_Recv`` on one tag, and MPI's
non-overtaking rule (messages from one source on one tag arrive in order) keeps the
frames of a message together, as a Pipe does.

Needs the optional extra: ``pip install .[mpi]`` (mpi4py and MPICH from the package index).
"""
from __future__ import annotations

import logging
import pathlib
import shutil
import sys
import time

from .comm import Comm

FRAME_TAG = 77  # every course frame travels on this MPI tag; course tags live in the frame header


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("the mpi backend needs mpi4py and an MPI: pip install '.[mpi]' "
                          "(or: pip install mpi4py mpich)") from exc
    return MPI


def mpiexec_path() -> str | None:
    """The ``mpiexec`` that launches this backend's jobs: the one beside this Python (the venv's,
    installed with mpi4py by the ``mpi`` extra), else the one on PATH, else None."""
    here = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


class MPILink:
    """A Pipe-like link to one peer: ``send_bytes``, ``recv_bytes``, ``recv_bytes_into``."""

    def __init__(self, mpi_comm, peer: int):
        self._comm, self.peer = mpi_comm, peer
        self._MPI = _mpi()
        self.deferred = False  # True while an isend posts its frames without waiting
        self.posted: list = []  # (request, buffer) of deferred frames: the buffer must outlive the request

    def send_bytes(self, buf) -> None:
        view = memoryview(buf).cast("B")
        if self.deferred:
            self.posted.append((self._comm.Isend([view, self._MPI.BYTE], dest=self.peer, tag=FRAME_TAG), buf))
        else:
            self._comm.Send([view, self._MPI.BYTE], dest=self.peer, tag=FRAME_TAG)

    def _probe_size(self) -> int:
        # Poll with Iprobe rather than block in Probe: a blocking probe stalls MPICH's
        # progress on this rank's own outstanding sends (measured: milliseconds per call).
        status = self._MPI.Status()
        spins = 0
        while not self._comm.Iprobe(source=self.peer, tag=FRAME_TAG, status=status):
            spins += 1
            if spins > 1000:
                time.sleep(50e-6)  # waiting long: stop burning a core
        return status.Get_count(self._MPI.BYTE)

    def poll(self, timeout: float = 0.0) -> bool:
        deadline = time.perf_counter() + timeout
        while not self._comm.Iprobe(source=self.peer, tag=FRAME_TAG):
            if time.perf_counter() >= deadline:
                return False
            time.sleep(20e-6)
        return True

    def recv_bytes(self) -> bytes:
        buf = bytearray(self._probe_size())
        self._comm.Recv([buf, self._MPI.BYTE], source=self.peer, tag=FRAME_TAG)
        return bytes(buf)

    def recv_bytes_into(self, buf) -> int:
        view = memoryview(buf).cast("B")
        n = self._probe_size()
        if n > len(view):
            raise ValueError(f"frame of {n} bytes does not fit a buffer of {len(view)}")
        self._comm.Recv([view, self._MPI.BYTE], source=self.peer, tag=FRAME_TAG)
        return n

    def close(self) -> None:
        pass


class MPIRequest:
    """A non-blocking send on MPI: the frames were posted with ``MPI_Isend``."""

    def __init__(self, posted):
        self._posted = posted

    def wait(self):
        _mpi().Request.Waitall([req for req, _ in self._posted])
        self._posted = []

    def test(self) -> bool:
        return _mpi().Request.Testall([req for req, _ in self._posted])


class MPIComm(Comm):
    """A course communicator on top of an mpi4py communicator (default: COMM_WORLD).

    ``graph`` (a networkx graph on 0..P-1) restricts links to its edges, as on a
    local ``Cluster(n, graph=G)``; emulation knobs work as there too.
    """

    backend = "mpi"

    def __init__(self, mpi_comm=None, graph=None, network=None, slow=None, faults=None):
        MPI = _mpi()
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        rank, size = self.mpi.Get_rank(), self.mpi.Get_size()
        if graph is None:
            peers = [p for p in range(size) if p != rank]
        else:
            from .cluster import _normalise_graph

            peers = sorted(_normalise_graph(graph, size)[rank])
        links = {p: MPILink(self.mpi, p) for p in peers}
        super().__init__(rank, size, links, control=None, logger=logging.getLogger(f"rank{rank}"))
        from .faults import as_fault
        from .netem import Network

        # Clocks of different hosts are not comparable: start every rank's clock at the
        # same instant (the end of a barrier) instead.
        self.mpi.Barrier()
        t0 = time.perf_counter()
        faults = {r: as_fault(f) for r, f in (faults or {}).items()}
        self._begin_run(1, t0, network or Network(), slow or {}, faults, True)

    def _ready(self, timeout):
        """Peers with a frame waiting (MPI_Iprobe on any source, polled until ``timeout``)."""
        MPI = self._MPI
        status = MPI.Status()
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            if self.mpi.Iprobe(source=MPI.ANY_SOURCE, tag=FRAME_TAG, status=status):
                peer = status.Get_source()
                if peer in self._links and peer not in self._dead:
                    return [peer]
            if deadline is not None and time.perf_counter() >= deadline:
                return []
            time.sleep(20e-6)

    def _isend(self, obj, dest: int, tag: int, context: int, sync_id: int | None = None) -> MPIRequest:
        """MPI has non-blocking sends of its own: post the frames, no thread needed."""
        link = self._links[dest]
        with self._send_locks[dest]:
            link.deferred = True
            try:
                self._write(obj, dest, tag, context, sync_id)
            finally:
                link.deferred = False
                posted, link.posted = link.posted, []
        return MPIRequest(posted)

    @property
    def _MPI(self):
        return _mpi()

    def barrier(self) -> None:
        start = time.perf_counter()
        self.mpi.Barrier()
        self._tracer.add("wait", start, time.perf_counter(), "barrier")

    def native_allreduce(self, sendbuf, recvbuf):
        """MPI's own ``Allreduce`` (SUM) on numpy buffers: the library's best algorithm."""
        self.mpi.Allreduce(sendbuf, recvbuf, op=self._MPI.SUM)
        return recvbuf

    @property
    def timeline(self):
        return list(self._tracer.events)

