"""PROC_NULL everywhere: send does nothing, recv returns None at once, the shift at the ends of a
line of ranks (sendrecv with keywords), non-blocking and synchronous forms."""
from p2p_programs.common import show, status


def main(comm, MPI):
    out = []
    st = MPI.Status()
    comm.send("lost", dest=MPI.PROC_NULL, tag=3)
    comm.ssend("lost", dest=MPI.PROC_NULL)
    out.append(f"recv {show(comm.recv(source=MPI.PROC_NULL, tag=5, status=st))} {status(MPI, st)}")
    out.append(f"probe {comm.probe(source=MPI.PROC_NULL, status=st)} {status(MPI, st)}")
    out.append(f"iprobe {comm.iprobe(source=MPI.PROC_NULL, tag=1, status=st)} {status(MPI, st)}")
    req = comm.irecv(source=MPI.PROC_NULL)
    out.append(f"irecv test {req.test(st)} {status(MPI, st)}")
    out.append(f"isend {comm.isend(1, dest=MPI.PROC_NULL).wait()} issend {comm.issend(1, MPI.PROC_NULL).test()}")
    # the classic shift on a line: the ends talk to PROC_NULL
    right = comm.rank + 1 if comm.rank + 1 < comm.size else MPI.PROC_NULL
    left = comm.rank - 1 if comm.rank > 0 else MPI.PROC_NULL
    got = comm.sendrecv(f"from {comm.rank}", dest=right, sendtag=11, recvbuf=None, source=left, recvtag=11,
                        status=st)
    out.append(f"shift {show(got)} {status(MPI, st)}")
    return out
