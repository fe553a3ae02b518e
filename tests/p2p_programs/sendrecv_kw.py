"""sendrecv with mpi4py's signature: keywords, positional recvbuf, self as both ends, ANY_TAG."""
import numpy as np

from p2p_programs.common import show, status


def main(comm, MPI):
    out = []
    st = MPI.Status()
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = comm.sendrecv(np.arange(3) * comm.rank, dest=nxt, sendtag=4, source=prev, recvtag=4, status=st)
    out.append(f"keywords {show(got)} {status(MPI, st)}")
    got = comm.sendrecv({"r": comm.rank}, nxt, 6, None, prev, MPI.ANY_TAG, st)
    out.append(f"positional {show(got)} {status(MPI, st)}")
    got = comm.sendrecv("me", dest=comm.rank, sendtag=9, source=comm.rank, recvtag=9, status=st)
    out.append(f"self {show(got)} {status(MPI, st)}")
    got = comm.sendrecv(comm.rank, dest=prev, source=MPI.ANY_SOURCE, status=st)
    out.append(f"defaults {show(got)} {status(MPI, st)}")
    return out
