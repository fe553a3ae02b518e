"""Lesson 07, beyond one machine: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex07_1  bus_bandwidth(nbytes, seconds, p)                            algbw and NCCL-tests' busbw of an allreduce
ex07_2  place_ranks(hosts, n)                                        (host, local rank) of each rank under mpiexec
ex07_3  ring_allreduce_seconds(nbytes, p, latency_s, line_rate_gbit)  ring allreduce time on a link from its data sheet
ex07_4  next_group(current, finished, n_groups)                      the group of the gang scheduler's next slice
"""
from __future__ import annotations


def bus_bandwidth(nbytes, seconds, p):
    """(algbw, busbw) in bytes per second of an allreduce of ``nbytes`` per rank taking ``seconds``
    on p ranks, as NCCL-tests report them (doc/PERFORMANCE.md)."""
    algbw = nbytes / seconds
    # A ring (or any bandwidth-optimal) allreduce makes each rank send and receive 2 (p-1)/p n
    # bytes: busbw is the rate each rank's link ran at, comparable with the link whatever p is.
    return algbw, algbw * 2 * (p - 1) / p


def place_ranks(hosts, n):
    """[(host, local_rank) for rank 0..n-1] as MPICH's mpiexec (Hydra) places them by default on
    ``hosts`` = [(name, slots), ...]."""
    # one entry per slot, in host order: ranks fill the first host's slots, then the next
    # host's, and wrap around to the first host when every slot is taken
    slots = [name for name, count in hosts for _ in range(count)]
    if not slots:
        raise ValueError("the host list has no slots")
    # a rank's local rank counts the ranks placed on its host before it (what
    # MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) and torchrun's LOCAL_RANK give)
    placed: dict = {}
    out = []
    for rank in range(n):
        host = slots[rank % len(slots)]
        out.append((host, placed.get(host, 0)))
        placed[host] = placed.get(host, 0) + 1
    return out


def ring_allreduce_seconds(nbytes, p, latency_s, line_rate_gbit):
    """Seconds of a ring allreduce of ``nbytes`` per rank on p ranks over one link type, from its data
    sheet: 2 (p-1) alpha + 2 (p-1)/p n beta (Patarasuk & Yuan 2009; Thakur et al. 2005)."""
    # alpha is the latency; data sheets give network rates in Gb/s, bits: beta = 8 / (rate in bit/s)
    beta = 8.0 / (line_rate_gbit * 1e9)
    return 2 * (p - 1) * latency_s + 2 * (p - 1) / p * nbytes * beta


def next_group(current, finished, n_groups):
    """The group a gang scheduler runs in the next time slice (Ousterhout 1982), or None when every
    job is finished: round robin from ``current`` (None at the start) over the groups not in ``finished``."""
    # the first of current+1, current+2, ... (mod n_groups, ending with current itself) that is
    # not finished: a finished job's slices go to the others, and a job left alone keeps the machine
    start = 0 if current is None else current + 1
    for k in range(n_groups):
        group = (start + k) % n_groups
        if group not in finished:
            return group
    return None
