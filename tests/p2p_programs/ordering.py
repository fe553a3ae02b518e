"""Non-overtaking: messages from one sender, one tag, arrive in order; ANY_TAG takes the earliest.
The receiver first takes every tag-2 message by name, then the rest with ANY_TAG."""
from p2p_programs.common import status


def main(comm, MPI):
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    reqs = [comm.isend(f"m{i} from {comm.rank}", dest=nxt, tag=i % 3) for i in range(12)]
    out = []
    st = MPI.Status()
    for _ in range(4):
        out.append(f"{comm.recv(source=prev, tag=2, status=st)} {status(MPI, st)}")
    for _ in range(8):
        out.append(f"{comm.recv(source=prev, tag=MPI.ANY_TAG, status=st)} {status(MPI, st)}")
    MPI.Request.waitall(reqs)
    return out
