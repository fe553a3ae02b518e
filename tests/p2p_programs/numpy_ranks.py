"""numpy integers (from np.arange) as dest, source, tag and root behave as the equal ints."""
import numpy as np

from p2p_programs.common import show, status


def main(comm, MPI):
    out = []
    st = MPI.Status()
    ranks = np.arange(comm.size)
    tags = np.arange(10, 10 + comm.size, dtype=np.int32)
    reqs = [comm.isend(f"{comm.rank}->{dest}", dest=dest, tag=tags[comm.rank]) for dest in ranks]
    for src in ranks[::-1]:
        got = comm.recv(source=src, tag=tags[src], status=st)
        out.append(f"{show(got)} {status(MPI, st)}")
    nxt, prev = ranks[(comm.rank + 1) % comm.size], ranks[(comm.rank - 1) % comm.size]
    got = comm.sendrecv(comm.rank, dest=nxt, sendtag=np.int64(1), source=prev, recvtag=np.int16(1), status=st)
    out.append(f"sendrecv {show(got)} {status(MPI, st)}")
    req = comm.irecv(source=prev, tag=np.int64(2))
    comm.isend("np", dest=nxt, tag=np.uint8(2)).wait()
    out.append(f"irecv {show(req.wait(st))} {status(MPI, st)}")
    out.append(f"iprobe {comm.iprobe(source=prev, tag=np.int64(3))}")
    MPI.Request.waitall(reqs)
    out.append(f"bcast {comm.bcast(comm.rank * 10, root=ranks[-1])}")
    return out
