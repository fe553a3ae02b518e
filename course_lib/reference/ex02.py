"""Lesson 02, collective communication: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex02_1  ring_allreduce(comm, x)                               reduce-scatter + allgather around a ring
ex02_2  rd_allgather(comm, x)                                 recursive-doubling allgather, p a power of two
ex02_3  merge_stats(a, b)                                     merge two (count, mean, M2) summaries
ex02_4  ring_allreduce_time(p, n_bytes, alpha, beta, gamma)   the alpha-beta-gamma cost of ex02_1
ex02_5  switch_loop(comm, hosts, n_chunks)                    the switch of an in-network allreduce

SyncBatchNorm (:mod:`course_lib.collectives.sync_batchnorm`) reduces its statistics with :func:`merge_stats`;
:func:`course_lib.costs.predict` takes the ring allreduce's time from :func:`ring_allreduce_time`.
"""
from __future__ import annotations

import numpy as np

from course_lib.runtime import MPI


def ring_allreduce(comm, x):
    """Element-wise sum of ``x`` over all ranks, on every rank, talking only to ring neighbours.

    A ring reduce-scatter then a ring allgather over p chunks of x (np.array_split of the
    flattened array): 2(p-1) messages per rank. Returns an array of x's shape and dtype."""
    x = np.asarray(x)
    p, r = comm.size, comm.rank
    if p == 1:
        return x.copy()
    left, right = (r - 1) % p, (r + 1) % p
    chunks = [c.copy() for c in np.array_split(x.reshape(-1), p)]
    # reduce-scatter: at step s send chunk r-s-1 right and add what comes from the left into
    # chunk r-s-2; after p-1 steps chunk r+1 holds the sum over every rank
    for s in range(p - 1):
        got = comm.sendrecv(chunks[(r - s - 1) % p], dest=right, source=left)
        k = (r - s - 2) % p
        chunks[k] = chunks[k] + got
    # allgather: pass the finished chunks on around the ring, each one p-1 steps
    for s in range(p - 1):
        chunks[(r - s - 1) % p] = comm.sendrecv(chunks[(r - s) % p], dest=right, source=left)
    return np.concatenate(chunks).astype(x.dtype, copy=False).reshape(x.shape)


def rd_allgather(comm, x):
    """Every rank's x, as a list in rank order, by recursive doubling: lg p rounds, p a power of two."""
    x = np.asarray(x)
    p, r = comm.size, comm.rank
    if p & (p - 1):
        raise ValueError(f"recursive doubling needs a power of two ranks, got {p}")
    blocks = {r: x}
    k = 1
    while k < p:
        # round k: exchange with partner r ^ k everything held so far (the k blocks of r's
        # aligned group), as one message; the partner holds the mirror group
        partner = r ^ k
        mine = sorted(blocks)
        got = comm.sendrecv(np.concatenate([blocks[i].reshape(-1) for i in mine]), dest=partner, source=partner)
        theirs = sorted(i ^ k for i in mine)
        for i, piece in zip(theirs, np.split(np.asarray(got), len(theirs))):
            blocks[i] = piece.reshape(x.shape)
        k *= 2
    return [blocks[i] for i in range(p)]


def merge_stats(a, b):
    """(count, mean, M2) of the union of two shards, from theirs (Chan, Golub & LeVeque 1979).

    n = na + nb, d = mb - ma, mean = ma + d nb / n, M2 = M2a + M2b + d^2 na nb / n; feature-wise
    on arrays."""
    na, ma, m2a = a
    nb, mb, m2b = b
    # a shard of count 0 changes nothing (and would divide by n = 0 if both were empty)
    if na == 0:
        return b
    if nb == 0:
        return a
    n = na + nb
    d = mb - ma
    mean = ma + d * (nb / n)
    m2 = m2a + m2b + d * d * (na * nb / n)
    return n, mean, m2


def ring_allreduce_time(p, n_bytes, alpha, beta, gamma):
    """Alpha-beta-gamma seconds of :func:`ring_allreduce` on p ranks for an n-byte vector (Thakur et al. 2005)."""
    # 2(p-1) steps of one message each; every step moves a chunk of n/p bytes, and the p-1
    # reduce-scatter steps also add one chunk
    steps = 2 * (p - 1)
    return steps * alpha + steps / p * n_bytes * beta + (p - 1) / p * n_bytes * gamma


def switch_loop(comm, hosts, n_chunks):
    """The switch of an in-network allreduce (SwitchML, Sapio et al. 2021): add each host's chunk j
    (tag j) as it arrives, from whichever host; send each complete sum to every host once, tag j."""
    partial, arrived = {}, {}
    status = MPI.Status()
    for _ in range(len(hosts) * n_chunks):
        got = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
        j = status.Get_tag()
        partial[j] = got if j not in partial else partial[j] + got
        arrived[j] = arrived.get(j, 0) + 1
        # once all hosts are in, the sum goes out and is forgotten: the hosts keep only a few
        # chunks in flight, so the switch holds only a few partial sums at any time
        if arrived[j] == len(hosts):
            total = partial.pop(j)
            del arrived[j]
            for h in hosts:
                comm.send(total, h, tag=j)
