"""The configuration of a parameter-server run: who is who, and which variant of each mechanism."""
from __future__ import annotations

from dataclasses import dataclass

from .consistency import INF
from .join import check_config
from .ring import HashRing


@dataclass
class PSConfig:
    """Ranks ``0 .. n_servers-1`` are servers, the next ``n_workers`` ranks workers, and with
    ``scheduler`` the last rank hands out data (:mod:`.scheduler`)."""
    n_servers: int = 2
    n_workers: int = 2
    n_keys: int = 1 << 16
    val_len: int = 1
    vnodes: int = 4
    replicas: int = 0          # k: each range also lives on the next k servers
    tau: float = INF           # bounded delay; 0 sequential, INF eventual
    updater: str = "sum"       # "sum": w += v ; "l1": w <- soft(w - eta v, eta lam)
    eta: float = 0.1
    lam: float = 0.0
    key_cache: bool = False    # send a key list a server has seen before as its 8-byte hash
    scheduler: bool = False    # one more rank (the last) hands out data tasks (:mod:`.scheduler`)
    n_tasks: int = 0           # with a scheduler: the data is cut into this many blocks
    replicate: str = "push"    # "push": forward every push; "aggregate": forward summed updates in batches
    aggregate_every: int = 0   # "aggregate": flush after this many worker clock ticks (0: n_workers)
    compress: bool = False     # values travel zlib-compressed (lossless; sparse models have many zeros)
    joiner: int = -1           # a server rank that is off the ring until it joins (:mod:`.join`)
    join_at: int = 0           # ... when it hears a worker clock >= join_at
    join_vnodes: int = 1       # points the joiner takes (1: it takes one range from one server)
    precopy_chunk: int = 4096  # keys per message of a joiner's snapshot, sent between two served messages

    def ring(self) -> HashRing:
        """The ring at the start (without the joiner)."""
        return HashRing([s for s in range(self.n_servers) if s != self.joiner], self.n_keys, self.vnodes)

    def rings(self) -> tuple:
        """The rings by epoch: ``(R0,)``, or ``(R0, R1)`` with a joiner."""
        return (self.ring(), self.final_ring()) if self.joiner >= 0 else (self.ring(),)

    def final_ring(self) -> HashRing:
        """The ring at the end (with the joiner, if any)."""
        r = self.ring()
        if self.joiner >= 0:
            r.add(self.joiner, self.join_vnodes)
        return r

    def __post_init__(self):
        check_config(self)

    @property
    def size(self) -> int:
        return self.n_servers + self.n_workers + int(self.scheduler)

    @property
    def scheduler_rank(self) -> int:
        return self.n_servers + self.n_workers if self.scheduler else -1

    def worker_rank(self, worker: int) -> int:
        """The rank of worker ``worker`` (workers are numbered from 0 after the servers)."""
        return self.n_servers + worker


__all__ = ["PSConfig"]
