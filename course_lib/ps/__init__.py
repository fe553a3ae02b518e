"""Lesson 05: inside the parameter server (Li et al., OSDI 2014).

* :mod:`.ring`: consistent hashing with virtual nodes; key ranges are arcs; keys moved on join/leave.
* :mod:`.keys`: request validation (sorted, distinct, in range, right length) and slicing by range.
* :mod:`.node`: server processes (summing or l1 update, chain replication, bounded-delay gate)
  and the worker API ``push / pull / wait``; a dead server's replica takes over.
* :mod:`.consistency`: the bounded-delay (SSP) read gate and the SSP invariant.
* :mod:`.filters`: significantly-modified and KKT filters.
* :mod:`.vclock`: vector clocks per key range.
* :mod:`.scheduler`: hands out blocks of data and gives a dead worker's block to a survivor.
* :mod:`.workload`: sparse logistic regression on hashed features, run on the servers.
"""
from .consistency import INF, may_answer_pull, may_read, model_name, ssp_violations
from .filters import kkt_filter, significantly_modified, soft_threshold
from .keys import BadRequest, check_request, request_nbytes, slice_request
from .node import KVWorker, PSConfig, gather_store, ps_node, serve
from .ring import HashRing, arc_of, keys_moved, modulo_owner, ring_lookup
from .scheduler import schedule
from .vclock import RangeClock, merge_clocks

__all__ = ["INF", "may_answer_pull", "may_read", "model_name", "ssp_violations", "kkt_filter", "significantly_modified",
           "soft_threshold", "BadRequest", "check_request", "request_nbytes", "slice_request", "KVWorker",
           "PSConfig", "gather_store", "ps_node", "serve", "HashRing", "arc_of", "keys_moved",
           "modulo_owner", "ring_lookup", "RangeClock", "merge_clocks", "schedule"]
from .workload import CTRData, RunSummary, logloss, lr_worker, make_ctr, minibatch_grad, replay, sequential_lr, train

__all__ += ["CTRData", "RunSummary", "logloss", "lr_worker", "make_ctr", "minibatch_grad", "replay", "sequential_lr",
            "train"]
