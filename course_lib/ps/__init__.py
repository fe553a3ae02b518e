"""Lesson 05: inside the parameter server (Li et al., OSDI 2014).

* :mod:`.ring`: consistent hashing with virtual nodes; key ranges are arcs; keys moved on join/leave.
* :mod:`.keys`: request validation (sorted, distinct, in range, right length) and slicing by range.
* :mod:`.node`: the SPMD entry point (which rank plays which node) and the final parameters.
* :mod:`.messages`: every message of the protocol, a frozen dataclass each, and the wire codec.
* :mod:`.kv_server`: a server process, ps-lite's KVServer (summing or l1 update, bounded-delay gate), a
  handler per message.
* :mod:`.replication`: chain replication, replication after aggregation; a dead server's replica takes over.
* :mod:`.worker`: the worker API ``push / pull / wait``; re-sends to the next replica.
* :mod:`.join`: a server joins the ring while training runs.
* :mod:`.payload`: compressed values and cached key lists.
* :mod:`.consistency`: the bounded-delay (SSP) read gate and the SSP invariant.
* :mod:`.filters`: significantly-modified and KKT filters.
* :mod:`.vclock`: vector clocks per key range.
* :mod:`.scheduler`: hands out blocks of data and gives a dead worker's block to a survivor.
* :mod:`.workload`: sparse logistic regression on hashed features, run on the servers.
* :mod:`.tasks`: asynchronous tasks with dependencies: a pull that waits for the last push, or not.
* :mod:`.crossover`: the same training on the servers and with a ring allreduce; bytes and time per
  step against the density of the gradient, and the exact bytes of the protocol.
"""
from .config import PSConfig
from .consistency import INF, may_answer_pull, may_read, model_name, ssp_violations
from .filters import kkt_filter, significantly_modified, soft_threshold
from .keys import BadRequest, check_request, request_nbytes, slice_request
from .kv_server import Server, serve
from .node import gather_store, ps_node
from .ring import HashRing, arc_of, keys_moved, modulo_owner, ring_lookup
from .scheduler import schedule
from .vclock import RangeClock, merge_clocks
from .worker import KVWorker

__all__ = ["INF", "may_answer_pull", "may_read", "model_name", "ssp_violations", "kkt_filter", "significantly_modified",
           "soft_threshold", "BadRequest", "check_request", "request_nbytes", "slice_request", "KVWorker",
           "PSConfig", "gather_store", "ps_node", "serve", "Server", "HashRing", "arc_of", "keys_moved",
           "modulo_owner", "ring_lookup", "RangeClock", "merge_clocks", "schedule"]
from .workload import CTRData, RunSummary, logloss, lr_worker, make_ctr, minibatch_grad, replay, sequential_lr, train

__all__ += ["CTRData", "RunSummary", "logloss", "lr_worker", "make_ctr", "minibatch_grad", "replay", "sequential_lr",
            "train"]
