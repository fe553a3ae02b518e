"""In-network aggregation: an allreduce whose sum is computed by the switch.

SHARP (Graham et al., "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC 2016)
and SwitchML (Sapio et al., "Scaling Distributed Machine Learning with In-Network
Aggregation", NSDI 2021) move the reduction into the network: every host sends its
vector **once** up its link to the switch, the switch adds what arrives and sends the
sum **once** down every link. Per host link, for an n-byte vector and p hosts:

==================  ==========================  ==========================  ===========
allreduce           bytes up (= bytes down)     latency steps (alpha)        sum by
==================  ==========================  ==========================  ===========
in-network (SHARP)  n                           2                            the switch
ring                2 (p-1)/p n                 2 (p-1)                      the hosts
binomial tree       lg p n (at the root)        2 lg p                       the hosts
==================  ==========================  ==========================  ===========

The switch is a real process here, a rank of the job's world communicator that is not one
of the hosts (the hosts get their own communicator with ``comm.Split``). It behaves like a
switch with little memory (SwitchML's *pool*): it has ``slots`` chunk-sized accumulators.
A host cuts its vector into chunks of ``chunk_bytes`` (the packets; the last one is
shorter) and keeps at most ``slots`` chunks in flight: it sends chunk j + slots only
after the sum of chunk j has come back, which frees that slot on the switch. The switch
adds each chunk into its slot **in the order the chunks arrive** and, once all p hosts'
chunk j are in, sends the sum down to every host (one message per port, at once).

Time (alpha-beta-gamma, Hockney 1994), when the window covers the round trip of a chunk
(``slots * c beta >= 2 alpha + 2 c beta``, :func:`window_slots`): the uplink streams the n
bytes back to back, the downlink streams the sums behind them, and only the last chunk
(c_last bytes) pays both ways::

    T = 2 alpha + n beta + c_last beta + (p - 1) c_last gamma

where p enters only through the last chunk's additions (the switch keeps up with its ports
as long as (p - 1) gamma <= beta). Floating-point sums are rounded in the switch's order of arrival,
so a float32 result can differ in the last bits from a sum in rank order; every host gets
the same bits, because the switch computes each sum once and sends copies.
"""
from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from ..runtime.ops import SUM
from ..runtime.p2p import Request
from ..runtime.registry import Algorithm
from ._p2p import TrafficCount

CHUNK_BYTES = 64 * 1024   # one "packet" of the streaming reduction
SLOTS = 4                 # the switch's accumulators (its memory: SLOTS * CHUNK_BYTES)


@dataclass(frozen=True)
class Fabric:
    """Who is who in one in-network allreduce: the hosts (world ranks, in host order) and the switch."""

    hosts: tuple[int, ...]
    switch: int

    @classmethod
    def first(cls, p: int, switch: int) -> "Fabric":
        """Hosts 0..p-1 and the switch at world rank ``switch``."""
        return cls(tuple(range(p)), switch)


@dataclass
class SwitchReport:
    """What the switch did in one allreduce (returned on the switch's rank)."""

    chunks: int                      # chunks reduced
    chunk_bytes: int                 # bytes of a full chunk (the last may be shorter)
    slots: int                       # accumulators the switch has
    peak_slots_in_use: int           # most accumulators busy at once
    arrival_order: list[tuple[int, ...]] = field(default_factory=list)  # per chunk: hosts, in the order added

    @property
    def peak_memory_bytes(self) -> int:
        """The switch's state at its fullest: one chunk-sized accumulator per busy slot."""
        return self.peak_slots_in_use * self.chunk_bytes


def chunk_edges(n_elements: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> list[int]:
    """Element boundaries of the chunks (packets): full chunks of ``chunk_bytes``, a shorter last one."""
    per = max(1, chunk_bytes // itemsize)
    return list(range(0, n_elements, per)) + [n_elements] if n_elements else [0, 0]


def window_slots(alpha: float, beta: float, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Slots that keep a host's link busy: a chunk's round trip 2 alpha + 2 c beta over the
    time c beta the host needs to send one (the bandwidth-delay product, in chunks), plus one."""
    c_beta = chunk_bytes * beta
    return math.ceil((2 * alpha + 2 * c_beta) / c_beta) + 1 if c_beta > 0 else 2


def sharp_allreduce(comm, x, fabric: Fabric, op=SUM, chunk_bytes: int = CHUNK_BYTES, slots: int = SLOTS):
    """Allreduce of ``x`` over ``fabric.hosts`` by the switch ``fabric.switch``; call it on all of them.

    Returns the reduced vector on the hosts, a :class:`SwitchReport` on the switch, None on
    other ranks. On the switch, ``x`` only tells the length and dtype of the vectors (an
    aggregation tree is configured per job, as SHARP's is). ``op`` must be commutative: the
    switch adds in order of arrival."""
    x = np.asarray(x)
    if comm.rank == fabric.switch:
        return _switch(comm, fabric, chunk_edges(x.size, x.dtype.itemsize, chunk_bytes), op, slots, chunk_bytes)
    if comm.rank in fabric.hosts:
        return stream_to_switch(comm, x, fabric.switch, chunk_bytes, slots)
    return None


def stream_to_switch(comm, x, switch: int, chunk_bytes: int = CHUNK_BYTES, slots: int = SLOTS):
    """A host's side: send chunk j of x (tag j) to ``switch``, at most ``slots`` in flight; receive
    sum j (tag j), then send chunk j + slots. Returns the reduced vector.

    The sends go through the host's uplink thread, so this loop is always free to take the sums
    that come down while chunks are still going up (both directions of a link at once)."""
    x = np.asarray(x)
    edges = chunk_edges(x.size, x.dtype.itemsize, chunk_bytes)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    k = len(edges) - 1
    uplink = _Link(comm, switch)
    try:
        for j in range(min(slots, k)):
            uplink.put(j, flat[edges[j]:edges[j + 1]])
        for j in range(k):
            out[edges[j]:edges[j + 1]] = comm.recv(source=switch, tag=j)
            if j + slots < k:                     # slot j % slots is free again on the switch
                uplink.put(j + slots, flat[edges[j + slots]:edges[j + slots + 1]])
    finally:
        uplink.close()
    return out.reshape(x.shape)


class _Link:
    """One direction of one link: a thread that sends what is queued for ``dest``, in order.

    Neither the host's loop nor the switch's ever waits for a send (a switch forwards on every
    port at once, a network card sends while its host receives); if they did, a host busy sending
    its next chunk up and a switch waiting to send a sum down to that host could each wait for the
    other once the Pipes between them are full."""

    def __init__(self, comm, dest: int):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(comm, dest), daemon=True)
        self.thread.start()

    def _run(self, comm, dest):
        while (item := self.queue.get()) is not None:
            try:
                comm.send(item[1], dest, tag=item[0])
            except BaseException as exc:       # re-raised by close()
                self.error.append(exc)
                return

    def put(self, chunk: int, data) -> None:
        self.queue.put((chunk, data))

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error:
            raise self.error[0]


def _switch(comm, fabric: Fabric, edges: list[int], op, slots: int, chunk_bytes: int) -> SwitchReport:
    """SwitchML's loop: add each chunk, as it is delivered, into slot j % slots; when all p hosts'
    chunk j are in, send the sum down every port and listen for chunk j + slots in that slot.

    Receives are posted for the chunks of free slots only, and taken in the order the (emulated)
    network delivers them (``waitany``), not in the order their bytes reached the Pipes."""
    p, k = len(fabric.hosts), len(edges) - 1
    acc: list = [None] * slots                        # the switch's whole memory
    order: list[list[int]] = [[] for _ in range(k)]
    report = SwitchReport(k, chunk_bytes, slots, 0)
    ports = [_Link(comm, h) for h in fabric.hosts]
    listening: list[tuple[Request, int, int]] = []    # (receive, chunk, host), earliest chunk first

    def listen(j):
        listening.extend((comm.irecv(source=h, tag=j), j, h) for h in fabric.hosts)

    try:
        for j in range(min(slots, k)):
            listen(j)
        while listening:
            i, got = Request.waitany([r for r, _, _ in listening])
            _, j, host = listening.pop(i)
            slot = j % slots
            acc[slot] = got.copy() if not order[j] else op(acc[slot], got)
            order[j].append(host)
            report.peak_slots_in_use = max(report.peak_slots_in_use, sum(a is not None for a in acc))
            if len(order[j]) == p:                    # chunk j complete: down every port at once
                for port in ports:
                    port.put(j, acc[slot])
                acc[slot] = None
                if j + slots < k:
                    listen(j + slots)
    finally:
        for port in ports:
            port.close()
    report.arrival_order = [tuple(o) for o in order]
    return report


def sum_in_order(vectors, order):
    """Left to right over ``vectors[h]`` for h in ``order``: the rounding of a sequential sum in that order."""
    acc = np.array(vectors[order[0]], copy=True)
    for h in order[1:]:
        acc = acc + vectors[h]
    return acc


def replay(vectors, report: SwitchReport):
    """The switch's result, rounding included: each chunk summed in the order the switch took it
    (``report.arrival_order``). ``vectors[h]`` is host h's 1-D vector."""
    vectors = [np.asarray(v).reshape(-1) for v in vectors]
    edges = chunk_edges(vectors[0].size, vectors[0].dtype.itemsize, report.chunk_bytes)
    return np.concatenate([sum_in_order([v[a:b] for v in vectors], order)
                           for a, b, order in zip(edges[:-1], edges[1:], report.arrival_order)])


# -- the cost row (p hosts; the switch is entry p of the traffic arrays) ----------------------
def _chunks(n_bytes: float, chunk_bytes: int) -> tuple[int, float]:
    """(number of chunks, bytes of the last one) of an n-byte vector."""
    k = max(1, math.ceil(n_bytes / chunk_bytes))
    return k, n_bytes - (k - 1) * chunk_bytes


def sharp_seconds(p, n, alpha, beta, gamma, chunk_bytes: int = CHUNK_BYTES) -> float:
    """2 alpha + n beta + c_last (beta + (p - 1) gamma): the pipelined up-and-down of the module doc."""
    _, last = _chunks(n, chunk_bytes)
    return 2 * alpha + n * beta + last * beta + (p - 1) * last * gamma


def sharp_traffic(p, n, itemsize, root=0, ndim=1, chunk_bytes: int = CHUNK_BYTES):
    """Bytes and messages sent: hosts 0..p-1 each n itemsize in k chunks; the switch (entry p)
    sends every chunk's sum to every host, p n itemsize in p k messages."""
    count = TrafficCount(p + 1, itemsize)
    k = len(chunk_edges(n, itemsize, chunk_bytes)) - 1
    for h in range(p):
        count.add(h, n, k)
    count.add(p, p * n, p * k)
    return count.result()


def link_traffic(stats, fabric: Fabric) -> dict[str, list[int]]:
    """Per host link, from the runtime's per-destination counters: bytes and messages up
    (host -> switch) and down (switch -> host), in host order."""
    s = fabric.switch
    return {"up_bytes": [int(stats.bytes[h, s]) for h in fabric.hosts],
            "down_bytes": [int(stats.bytes[s, h]) for h in fabric.hosts],
            "up_messages": [int(stats.messages[h, s]) for h in fabric.hosts],
            "down_messages": [int(stats.messages[s, h]) for h in fabric.hosts]}


ROW = Algorithm("allreduce", "sharp", sharp_allreduce, "2 alpha + n beta + c_last (beta + (p-1) gamma)",
                seconds=sharp_seconds, rounds=lambda p: 2, traffic=sharp_traffic)
