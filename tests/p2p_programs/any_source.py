"""ANY_SOURCE matching told apart by tags; probe/iprobe fill a Status without receiving."""
from p2p_programs.common import show, status


def main(comm, MPI):
    out = []
    st = MPI.Status()
    reqs = [comm.isend([comm.rank, dest], dest=dest, tag=100 + comm.rank) for dest in range(comm.size)]
    for src in reversed(range(comm.size)):
        comm.probe(source=MPI.ANY_SOURCE, tag=100 + src, status=st)
        out.append(f"probe {status(MPI, st)}")
        out.append(f"iprobe again {comm.iprobe(source=MPI.ANY_SOURCE, tag=100 + src)}")
        got = comm.recv(source=MPI.ANY_SOURCE, tag=100 + src, status=st)
        out.append(f"recv {status(MPI, st)} {show(got)}")
    out.append(f"iprobe nothing {comm.iprobe(source=MPI.ANY_SOURCE, tag=99)}")
    # ANY_SOURCE and ANY_TAG together, after a probe named the source: no choice left
    reqs.append(comm.isend("last", dest=comm.rank, tag=7))
    comm.probe(source=comm.rank, tag=7)
    got = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
    out.append(f"any/any {status(MPI, st)} {show(got)}")
    MPI.Request.waitall(reqs)
    return out
