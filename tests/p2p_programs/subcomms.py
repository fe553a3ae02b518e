"""Split, Dup and Create_group communicators: ranks, Status.source, probes and isends all in
the group's numbering; a Dup's messages never match the original's."""
from p2p_programs.common import show, status


def talk(comm, MPI, label: str) -> list:
    out = []
    st = MPI.Status()
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    req = comm.isend({"from": comm.rank, "label": label}, dest=nxt, tag=comm.rank)
    comm.probe(source=prev, tag=prev, status=st)
    out.append(f"{label} probe {status(MPI, st)}")
    out.append(f"{label} iprobe {comm.iprobe(source=prev, tag=prev, status=st)} {status(MPI, st)}")
    got = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
    out.append(f"{label} recv {show(got)} {status(MPI, st)}")
    req.wait()
    req = comm.isend("self", dest=comm.rank, tag=1)
    out.append(f"{label} self {comm.recv(source=comm.rank, tag=1, status=st)} {status(MPI, st)}")
    req.wait()
    out.append(f"{label} null {comm.recv(source=MPI.PROC_NULL, status=st)} {status(MPI, st)}")
    return out


def main(comm, MPI):
    out = [f"world {comm.Get_rank()}/{comm.Get_size()}"]
    sub = comm.Split(color=comm.rank % 2, key=-comm.rank)  # reversed: group ranks != world ranks
    out.append(f"split {sub.Get_rank()}/{sub.Get_size()}")
    out += talk(sub, MPI, "split")
    dup = comm.Dup()
    out.append(f"dup {dup.Get_rank()}/{dup.Get_size()}")
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    reqs = [dup.isend("on dup", dest=nxt, tag=2), comm.isend("on world", dest=nxt, tag=2)]
    out.append(f"world gets {comm.recv(source=prev, tag=2)}, dup gets {dup.recv(source=prev, tag=2)}")
    MPI.Request.waitall(reqs)
    out += talk(dup, MPI, "dup")
    subdup = sub.Dup()
    out += talk(subdup, MPI, "subdup")
    group = comm.Get_group().Incl(list(range(comm.size))[::-2])
    mine = comm.Create_group(group)
    if mine == MPI.COMM_NULL:
        out.append("not in the group")
    else:
        out.append(f"group {mine.Get_rank()}/{mine.Get_size()}")
        out += talk(mine, MPI, "group")
        mine.Free()
    none = comm.Split(color=MPI.UNDEFINED if comm.rank == 0 else 1, key=0)
    out.append(f"undefined color gives COMM_NULL: {none == MPI.COMM_NULL}")
    for c in (subdup, dup, sub) + (() if none == MPI.COMM_NULL else (none,)):
        c.Free()
    return out
