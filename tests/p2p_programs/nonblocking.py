"""isend/irecv/test/wait and the many-request helpers; receives posted with irecv take messages
in the order they were posted, before a later blocking recv."""
from p2p_programs.common import show, status


def main(comm, MPI):
    out = []
    st = MPI.Status()
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    # an irecv tested before its message can exist: prev sends tag 7 only after our "go"
    early = comm.irecv(source=prev, tag=7)
    out.append(f"early test {early.test()}")
    go = comm.isend("go", dest=prev, tag=8)
    comm.recv(source=nxt, tag=8)
    sreq = comm.isend({"late": comm.rank}, dest=nxt, tag=7)
    go.wait()
    out.append(f"early wait {show(early.wait(st))} {status(MPI, st)}")
    out.append(f"isend wait {sreq.wait()} then test {sreq.test()} then wait {early.wait()}")
    # posted order: two irecvs, then a blocking recv, all matching the same three messages
    first, second = comm.irecv(source=prev, tag=MPI.ANY_TAG), comm.irecv(source=prev)
    reqs = [comm.isend(f"n{i}", dest=nxt, tag=20 + i) for i in range(3)]
    out.append(f"third by recv {show(comm.recv(source=prev, status=st))} {status(MPI, st)}")
    out.append(f"first {show(first.wait(st))} {status(MPI, st)}")
    out.append(f"second {show(second.wait(st))} {status(MPI, st)}")
    out.append(f"waitall sends {MPI.Request.waitall(reqs)}")
    # waitall / testall / waitany on receives
    recvs = [comm.irecv(source=prev, tag=30 + i) for i in range(3)]
    reqs = [comm.isend(i * comm.rank, dest=nxt, tag=30 + i) for i in reversed(range(3))]
    statuses = []
    out.append(f"waitall {[show(x) for x in MPI.Request.waitall(recvs, statuses)]}")
    out.append("statuses " + "; ".join(status(MPI, s) for s in statuses))
    out.append(f"after waitall test {recvs[0].test()} testall {MPI.Request.testall(recvs)}")
    recvs = [comm.irecv(source=prev, tag=40 + i) for i in range(2)]
    reqs += [comm.isend("a", dest=nxt, tag=40), comm.isend("b", dest=nxt, tag=41)]
    flag, objs = MPI.Request.testall(recvs)  # (a probe would wait forever: posted irecvs took them)
    while not flag:
        flag, objs = MPI.Request.testall(recvs)
    out.append(f"testall {flag} {objs}")
    recvs = [comm.irecv(source=prev, tag=50), comm.irecv(source=prev, tag=51)]
    reqs.append(comm.isend("only 51", dest=nxt, tag=51))
    index, obj = MPI.Request.waitany(recvs, st)
    out.append(f"waitany {index} {show(obj)} {status(MPI, st)}")
    reqs.append(comm.isend("done", dest=prev, tag=52))
    comm.recv(source=nxt, tag=52)  # nxt's waitany has returned: tag 50 cannot be there before it
    reqs.append(comm.isend("then 50", dest=nxt, tag=50))
    out.append(f"waitany again {MPI.Request.waitany(recvs)} and {MPI.Request.waitany(recvs)}")
    MPI.Request.waitall(reqs)
    return out
