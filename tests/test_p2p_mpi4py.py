"""Point-to-point is mpi4py's: the same programs give the same transcripts on both.

Each program of ``tests/p2p_programs`` runs with real mpi4py under ``mpiexec -n P`` (all
programs in one launch per P), on ``Cluster(P)`` local workers, and on course_lib's MPI
backend (``MPIComm`` under mpiexec); every rank's transcript (source, tag, byte count,
payload, order) must equal mpi4py's. Then unit tests, no MPI needed:
numpy integer ranks, tag and size limits, structured dtypes, what course_lib lacks.

The differential part is skipped with a message when mpi4py or mpiexec is missing.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib
import pickle
import subprocess
import sys
from multiprocessing import Pipe

import numpy as np
import pytest

from course_lib import MPI, Cluster, WorkerError
from course_lib.runtime import wire
from course_lib.runtime.mpi4py_methods import MPI4PY_COMM_METHODS
from course_lib.runtime.mpi_backend import mpiexec_path

from common import needs_mpi

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
PROGRAMS = ["pairs", "ordering", "any_source", "proc_null", "sendrecv_kw", "nonblocking", "sync_sends", "subcomms",
            "numpy_ranks", "collective_types", "nonblocking_collectives"]
SIZES = [1, 2, 3, 5]




# ------------------------------------------------------------------ the two runs, once per P
@pytest.fixture(scope="module")
def transcripts():
    """{P: (mpi4py transcripts, course_lib transcripts)}, filled lazily, one launch per P."""
    return {}


def _run_mpiexec(backend: str, p: int, tmp: pathlib.Path) -> dict:
    out = tmp / f"{backend}_{p}.json"
    cmd = [mpiexec_path(), "-n", str(p), sys.executable, "-m", "mpi4py", str(TESTS / "p2p_programs" / "run_mpi4py.py"),
           backend, str(out), *PROGRAMS]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"mpiexec -n {p} ({backend}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def _run_course_lib(p: int) -> dict:
    out = {}
    with Cluster(p, start_method="fork", timeout=60) as cluster:
        for name in PROGRAMS:
            program = importlib.import_module(f"p2p_programs.{name}")
            out[name] = [list(t) for t in cluster.run(program.main, MPI)]
    return out


def _runs(transcripts, p, tmp_path_factory):
    """mpi4py's transcripts and course_lib's, on local workers and on its MPI backend."""
    if p not in transcripts:
        tmp = tmp_path_factory.mktemp("mpi")
        transcripts[p] = {"mpi4py": _run_mpiexec("mpi4py", p, tmp), "local": _run_course_lib(p),
                          "mpi backend": _run_mpiexec("course_lib", p, tmp)}
    return transcripts[p]


@needs_mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["local", "mpi backend"])
@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_same_transcript_as_mpi4py(name, p, backend, transcripts, tmp_path_factory):
    runs = _runs(transcripts, p, tmp_path_factory)
    real, ours = runs["mpi4py"][name], runs[backend][name]
    assert len(real) == len(ours) == p
    for rank, (want, got) in enumerate(zip(real, ours)):
        assert want, f"{name}: rank {rank} wrote no transcript under mpi4py"
        for line, (w, g) in enumerate(zip(want, got)):
            assert g == w, f"{name}, P={p}, {backend}, rank {rank}, line {line}:\n mpi4py:     {w}\n course_lib: {g}"
        assert len(got) == len(want), f"{name}, P={p}, rank {rank}: {len(got)} lines, mpi4py wrote {len(want)}"


@needs_mpi
def test_the_method_list_is_mpi4pys():
    from mpi4py import MPI as real

    assert MPI4PY_COMM_METHODS == tuple(sorted(n for n in dir(real.Intracomm) if not n.startswith("_")))


# ------------------------------------------------------------------ no MPI needed
def _lacking(comm):
    """Names of mpi4py's communicator that course_lib lacks, and what touching each raises."""
    out = {}
    for name in MPI4PY_COMM_METHODS:
        try:
            getattr(comm, name)
        except NotImplementedError as exc:
            out[name] = str(exc)
    sub = comm.Split(0, 0)
    try:
        getattr(sub, "Isend")  # noqa: B009 - the attribute access itself is what raises
    except NotImplementedError as exc:
        out["sub.Isend"] = str(exc)
    return out


def test_what_course_lib_lacks_says_so():
    with Cluster(1, start_method="fork") as c:
        lacking = c.run(_lacking)[0]
    assert "Allreduce" in lacking and "Isend" in lacking and "sub.Isend" in lacking
    assert "part of mpi4py but not of course_lib" in lacking["Allreduce"] and "Allreduce" in lacking["Allreduce"]
    for provided in ("send", "recv", "sendrecv", "isend", "irecv", "ssend", "issend", "probe", "iprobe", "Dup",
                     "Free", "Split", "Create_group", "Get_group", "allreduce", "bcast", "barrier", "rank", "size"):
        assert provided not in lacking
    with Cluster(1, start_method="fork") as c:
        with pytest.raises(WorkerError, match="AttributeError"):
            c.run(lambda comm: comm.no_such_method)


def _numpy_ranks(comm):
    ranks = np.arange(comm.size)
    me, other = ranks[comm.rank], ranks[1 - comm.rank]
    st = MPI.Status()
    comm.send("a", dest=other, tag=np.int64(3))
    got = comm.recv(source=other, tag=np.int32(3), status=st)
    r = comm.irecv(source=other)
    comm.isend("b", dest=other).wait()
    sub = comm.Split(0, key=-comm.rank)
    subgot = sub.sendrecv(sub.rank, dest=np.int64(1 - sub.rank), source=np.int16(1 - sub.rank))
    comm.send("self", dest=me)
    return got, type(st.source), st.source, r.wait(), subgot, comm.recv(source=me), comm.bcast(me, root=ranks[1])


def test_numpy_integer_ranks_are_the_equal_ints():
    with Cluster(2, start_method="fork") as c:
        res = c.run(_numpy_ranks)
    assert res[0] == ("a", int, 1, "b", 0, "self", 1)
    assert res[1] == ("a", int, 0, "b", 1, "self", 1)


@pytest.mark.parametrize("call, text", [
    (lambda comm: comm.send(1, 1, tag=2 ** 31), "tag must be"),
    (lambda comm: comm.isend(1, 1, tag=np.int64(2 ** 40)), "tag must be"),
    (lambda comm: comm.send(1, 1, tag=-1), "tag must be"),
    (lambda comm: comm.recv(source=1, tag=-7), "tag must be"),
    (lambda comm: comm.recv(source=1, tag=2 ** 31), "tag must be"),
    (lambda comm: comm.irecv(source=1, tag=1.5), "tag must be"),
    (lambda comm: comm.send(1, dest=2), "not a rank"),
    (lambda comm: comm.send(1, dest=1.0), "must be an int rank"),
    (lambda comm: comm.send(1, dest=True), "must be an int rank"),
    (lambda comm: comm.Dup().send(1, dest=np.int64(5)), "not a rank of this communicator"),
])
def test_bad_tags_and_ranks_raise_before_sending(call, text):
    def attempt(comm):
        if comm.rank == 1:
            st = MPI.Status()
            return comm.recv(source=0, status=st), st.tag  # the first message: is the stream intact?
        try:
            call(comm)
            error = "no error"
        except (ValueError, TypeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        comm.send("intact", dest=1, tag=1)
        return error

    with Cluster(2, start_method="fork") as c:
        error, received = c.run(attempt)
    assert text in error and error.split(":")[0] in ("ValueError", "TypeError"), error
    assert received == ("intact", 1)


def test_wire_refuses_what_its_header_cannot_hold(monkeypatch):
    a, b = Pipe()
    try:
        for tag, context in ((2 ** 31, 0), (0, 2 ** 31), (-2 ** 31 - 1, 0)):
            with pytest.raises(ValueError, match="32-bit"):
                wire.send(a, 1, context, tag, {"x": 1})
        monkeypatch.setattr(wire, "MAX_FRAME", 100)
        for big in (np.zeros(200, dtype=np.uint8), b"x" * 200, {"arr": np.zeros(200, dtype=np.uint8)}):
            with pytest.raises(ValueError, match="limit of 100 bytes"):
                wire.send(a, 1, 0, 0, big)
        assert not b.poll(0.05)  # nothing was written: the stream is intact
        monkeypatch.setattr(wire, "MAX_FRAME", 2 ** 64 - 1)
        wire.send(a, 1, 0, 5, "after")
        msg = wire.recv(b)
        assert (msg.tag, msg.obj, msg.pickled_size) == (5, "after", len(pickle.dumps("after", protocol=5)))
    finally:
        a.close()
        b.close()


REC = np.dtype([("a", "<i4"), ("b", "<f8")])
STRUCTURED = [
    np.array([(1, 0.5), (2, 1.5)], dtype=REC),
    np.rec.array([(3, 2.5)], dtype=REC),
    np.zeros((2, 2), dtype=np.dtype([("xy", "<f4", (2,)), ("id", "<u2")], align=True)),
    np.array([(1, 2.0)], dtype=REC)[["b"]],        # a view with a field subset (offsets with gaps)
    {"inside": np.array([(4, 4.5)], dtype=REC)},
    np.array(["2024-01-01"], dtype="datetime64[s]"),
]


def _echo(comm, objs):
    if comm.rank == 0:
        for o in objs:
            comm.send(o, dest=1)
        return None
    return [comm.recv(source=0) for _ in objs]


def test_structured_dtypes_keep_their_fields():
    a, b = Pipe()
    try:
        for obj in STRUCTURED:
            wire.send(a, 1, 0, 0, obj)
            _assert_same(wire.recv(b).obj, obj)
    finally:
        a.close()
        b.close()
    with Cluster(2, start_method="fork") as c:
        got = c.run(_echo, STRUCTURED)[1]
    for g, want in zip(got, STRUCTURED):
        _assert_same(g, want)


def _assert_same(got, want):
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _assert_same(got[k], want[k])
        return
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.dtype.names == want.dtype.names and got.shape == want.shape
    assert repr(got) == repr(want)  # values, field by field (tolist would nest arrays for subarray fields)


def _self_and_null_traffic(comm):
    comm.send(np.zeros(1000), dest=comm.rank)
    comm.recv(source=comm.rank)
    comm.send("x" * 100, dest=MPI.PROC_NULL)
    comm.isend(b"", dest=MPI.PROC_NULL).wait()
    if comm.rank == 0:
        comm.send(np.zeros(4), dest=1)
        comm.ssend(np.zeros(2), dest=1)
    else:
        comm.recv(source=0)
        comm.recv(source=0)
    return comm.stats


def test_self_sends_and_proc_null_are_not_pipe_traffic():
    with Cluster(2, start_method="fork") as c:
        res = c.run(_self_and_null_traffic)
    assert res.stats.messages.tolist() == [[0, 2], [0, 0]]
    assert res.stats.bytes.tolist() == [[0, 48], [0, 0]]
    assert res.stats.header_bytes[1, 0] > 0  # the ssend's acknowledgement: envelope only


def _deadlocks(comm):
    out = []
    for attempt in (lambda: comm.recv(source=comm.rank), lambda: comm.recv(),
                    lambda: comm.ssend(1, dest=comm.rank)):
        try:
            attempt()
        except MPI.Deadlock as exc:
            out.append(str(exc))
    return out


def test_receives_that_can_never_complete_raise_instead_of_hanging():
    with Cluster(1, start_method="fork", timeout=20) as c:
        messages = c.run(_deadlocks)[0]
    assert len(messages) == 3 and "itself" in messages[0] and "irecv first" in messages[2]


def _get_count(comm, objs):
    st = MPI.Status()
    counts = []
    for obj in objs:
        comm.isend(obj, dest=comm.rank).wait()
        comm.recv(source=comm.rank, status=st)
        mine = st.Get_count()
        req = comm.isend(obj, dest=1 - comm.rank)  # both send at once: a blocking send could wait forever
        comm.recv(source=1 - comm.rank, status=st)
        req.wait()
        counts.append((mine, st.Get_count()))
    return counts


def test_get_count_is_the_length_of_mpi4pys_pickle():
    objs = [None, 7, "text", {"a": [1, 2]}, np.arange(5), np.arange(100000.0), np.zeros(3, dtype=REC),
            {"nested": np.ones((3, 4), dtype=np.float32)}, [np.arange(3), np.arange(3)]]
    with Cluster(2, start_method="fork") as c:
        res = c.run(_get_count, objs)
    want = [len(pickle.dumps(o, protocol=5)) for o in objs]
    for rank in (0, 1):
        assert [m for m, _ in res[rank]] == want
        assert [t for _, t in res[rank]] == want
