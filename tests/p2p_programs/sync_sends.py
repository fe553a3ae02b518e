"""ssend/issend complete only once the receiver has matched the message."""
from p2p_programs.common import show, status


def main(comm, MPI):
    out = []
    st = MPI.Status()
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    req = comm.issend(f"sync from {comm.rank}", dest=nxt, tag=3)
    out.append(f"before the match {req.test()}")  # nxt receives tag 3 only after our tag 4
    go = comm.isend("go", dest=nxt, tag=4)
    comm.recv(source=prev, tag=4)
    go.wait()
    got = comm.recv(source=prev, tag=3, status=st)
    out.append(f"received {show(got)} {status(MPI, st)}")
    out.append(f"issend wait {req.wait()} test {req.test()}")
    # ssend to a receiver that posted its irecv first (itself, when size is 1)
    ireq = comm.irecv(source=prev, tag=5)
    comm.ssend([comm.rank] * 3, dest=nxt, tag=5)
    out.append(f"ssend done, irecv {show(ireq.wait(st))} {status(MPI, st)}")
    # many issends, matched in a different order by tag
    reqs = [comm.issend(i, dest=nxt, tag=60 + i) for i in range(3)]
    got = [comm.recv(source=prev, tag=60 + i) for i in (2, 0, 1)]
    out.append(f"matched {got} waitall {MPI.Request.waitall(reqs)}")
    return out
