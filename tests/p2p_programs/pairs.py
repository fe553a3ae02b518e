"""Every rank sends many kinds of objects to every rank (itself included); receives in a fixed
order with a Status: source, tag, byte count and payload of each. Then a blocking send to
yourself, buffered, on a world of two or more (see the package doc)."""
from p2p_programs.common import payloads, show, status


def main(comm, MPI):
    out = []
    reqs = [comm.isend(obj, dest=dest, tag=i) for dest in range(comm.size)
            for i, obj in enumerate(payloads(comm.rank))]
    st = MPI.Status()
    for src in range(comm.size):
        for i in range(len(payloads(0))):
            obj = comm.recv(source=src, tag=i, status=st)
            out.append(f"{status(MPI, st)} {show(obj)}")
    out.append(f"isends {MPI.Request.waitall(reqs) == [None] * len(reqs)}")
    if comm.size > 1:
        comm.send({"to": "myself"}, dest=comm.rank, tag=5)
        comm.send("again", dest=comm.rank, tag=5)
        first, second = comm.recv(source=comm.rank, tag=5, status=st), comm.recv(source=comm.rank, status=st)
        out.append(f"blocking self-sends {first} {second} {status(MPI, st)}")
    return out
