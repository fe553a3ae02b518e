"""Objects of classes defined in ``__main__`` travel through every point-to-point and collective call.

A notebook cell or a script defines a class, a dataclass and a namedtuple; the workers know them
only as cloudpickle rebuilt them, so plain pickle refuses their instances ("it's not the same
object as __main__.Push"). Each case runs a script in a fresh interpreter (its own ``__main__``),
under fork, spawn and forkserver, with the Cluster made before and after the classes.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

METHODS = ["fork", "spawn", "forkserver"]

SCRIPT = textwrap.dedent('''
    import json
    import sys
    from collections import namedtuple
    from dataclasses import dataclass

    import numpy as np

    import course_lib.collectives  # noqa: F401  (bcast's scatter_allgather is lesson 02's variant)
    from course_lib import Cluster, SUM

    if __name__ == "__main__":
        method, when = sys.argv[1], sys.argv[2]
        cluster = Cluster(3, start_method=method, timeout=60) if when == "before" else None

        @dataclass
        class Push:
            step: int
            grad: np.ndarray

        class Vec:
            def __init__(self, x):
                self.x = x

            def __add__(self, other):
                return Vec(self.x + other.x)

        Pair = namedtuple("Pair", "rank square")

        def program(comm):
            r, p = comm.rank, comm.size
            right, left = (r + 1) % p, (r - 1) % p
            seen = {}
            comm.send(Push(r, np.full(3, r)), dest=right)
            got = comm.recv(source=left)
            seen["send/recv"] = isinstance(got, Push) and got.step == left and got.grad.tolist() == [left] * 3
            req = comm.isend(Pair(r, r * r), dest=right, tag=2)
            got = comm.irecv(source=left, tag=2).wait()
            req.wait()
            seen["isend/irecv"] = isinstance(got, Pair) and got == (left, left * left)
            got = comm.sendrecv(Vec(r), dest=right, source=left)
            seen["sendrecv"] = isinstance(got, Vec) and got.x == left
            if r == 0:
                comm.ssend(Pair(0, 0), dest=1, tag=3)
            elif r == 1:
                seen["ssend"] = comm.recv(source=0, tag=3) == Pair(0, 0)
            comm.send(Vec(7), dest=r, tag=4)
            seen["send to self"] = comm.recv(source=r, tag=4).x == 7
            got = comm.bcast(Push(99, np.arange(2)) if r == 0 else None, root=0)
            seen["bcast"] = isinstance(got, Push) and got.step == 99
            got = comm.bcast(Push(98, np.arange(2)) if r == 0 else None, root=0, algorithm="scatter_allgather")
            seen["bcast, scatter_allgather"] = isinstance(got, Push) and got.step == 98
            got = comm.scatter([Pair(i, i * i) for i in range(p)] if r == 0 else None, root=0)
            seen["scatter"] = got == Pair(r, r * r)
            got = comm.gather(Pair(r, r * r), root=0)
            seen["gather"] = got == [Pair(i, i * i) for i in range(p)] if r == 0 else got is None
            seen["allgather"] = [v.x for v in comm.allgather(Vec(r))] == list(range(p))
            seen["alltoall"] = comm.alltoall([Pair(r, j) for j in range(p)]) == [Pair(i, r) for i in range(p)]
            got = comm.reduce(Vec(r), op=SUM, root=0)
            seen["reduce"] = got.x == sum(range(p)) if r == 0 else got is None
            seen["allreduce"] = comm.allreduce(Vec(r), op=SUM).x == sum(range(p))
            seen["scan"] = comm.scan(Vec(r), op=SUM).x == sum(range(r + 1))
            got = comm.exscan(Vec(r), op=SUM)
            seen["exscan"] = got is None if r == 0 else got.x == sum(range(r))
            return seen

        cluster = cluster or Cluster(3, start_method=method, timeout=60)
        with cluster:
            print(json.dumps(cluster.run(program)))
''')


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("start_method", METHODS)
def test_classes_defined_in_main_travel_through_every_call(start_method, when, tmp_path):
    script = tmp_path / "notebook_like.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), start_method, when], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    per_rank = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {(rank, call) for rank, seen in enumerate(per_rank) for call, ok in seen.items() if not ok}
    assert not failed
    assert set(per_rank[1]) >= {"send/recv", "isend/irecv", "sendrecv", "ssend", "send to self", "bcast",
                                "bcast, scatter_allgather",
                                "scatter", "gather", "allgather", "alltoall", "reduce", "allreduce", "scan",
                                "exscan"}


def test_what_cloudpickle_cannot_pickle_either_still_raises():
    import threading

    from course_lib.runtime import wire

    with pytest.raises(TypeError, match="lock"):
        wire.dumps(threading.Lock())
