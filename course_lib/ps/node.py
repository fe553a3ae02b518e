"""The nodes of a small parameter server (after Li et al., OSDI 2014 and ps-lite), and who plays which.

Ranks ``0 .. S-1`` are servers (:mod:`.kv_server`), ranks ``S .. S+W-1`` workers (:mod:`.worker`,
worker id ``w = rank - S``), and with ``cfg.scheduler`` the last rank hands out data
(:mod:`.scheduler`). Every rank runs :func:`ps_node` (SPMD); they talk in the messages of
:mod:`.messages`, over the runtime's Pipes.

Keys live on a consistent-hashing ring (:mod:`.ring`); the arc of point ``i`` is key range ``i``,
held by its chain: the owner of point ``i`` then the next ``k = cfg.replicas`` distinct live
servers (:mod:`.replication`). A push is acknowledged by the tail of each range's chain, so an
acknowledged update is on every replica; a worker re-sends every unanswered slice to the new head
when a server dies. Reads wait at the server until the bounded-delay gate holds
(:mod:`.consistency`); a server can join while training runs (:mod:`.join`); key lists and values
can travel smaller (:mod:`.payload`).
"""
from __future__ import annotations

import numpy as np

from .config import PSConfig
from .kv_server import serve
from .worker import KVWorker


def ps_node(comm, cfg: PSConfig, worker_fn, *args):
    """SPMD entry point: servers serve, workers run ``worker_fn(kv, *args)`` then finish."""
    if comm.size != cfg.size:
        raise ValueError(f"the cluster has {comm.size} ranks, the config needs {cfg.size} "
                         f"({cfg.n_servers} servers + {cfg.n_workers} workers)")
    if comm.rank < cfg.n_servers:
        return serve(comm, cfg)
    if comm.rank == cfg.scheduler_rank:
        from .scheduler import schedule
        return schedule(comm, range(cfg.n_servers, cfg.n_servers + cfg.n_workers), cfg.n_tasks)
    kv = KVWorker(comm, cfg)
    try:
        out = worker_fn(kv, *args)
        kv.finish()
    except BaseException:
        kv.pending.clear()               # failing: release the servers, then report the error
        kv.finish()
        raise
    return {"result": out, "wait_time": kv.wait_time, "log": kv.log, "resent": kv.resent,
            "dead_seen": sorted(kv.dead), "epoch": kv.epoch}


def gather_store(results, cfg: PSConfig):
    """Final parameters: each key from the first surviving server of its chain, in the ring the
    workers ended with (the new one if a joining server switched any of them)."""
    workers = [r for r in results[cfg.n_servers:cfg.n_servers + cfg.n_workers] if r is not None]
    ring = cfg.final_ring() if any(r.get("epoch", 0) for r in workers) else cfg.ring()
    dead = {r for r in range(cfg.n_servers) if results[r] is None}
    out = np.zeros((cfg.n_keys, cfg.val_len))
    arcs = ring.arcs(np.arange(cfg.n_keys))
    for a in range(len(ring.points)):
        chain = ring.chain(a, cfg.replicas, dead)
        if not chain:
            raise RuntimeError(f"key range {a} was lost: all {cfg.replicas + 1} copies died")
        m = arcs == a
        out[m] = results[chain[0]]["store"][m]
    return out


__all__ = ["PSConfig", "serve", "KVWorker", "ps_node", "gather_store"]
