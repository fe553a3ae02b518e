"""Sparse logistic regression on hashed features, trained on the parameter server.

Click-through data as in Li et al. (OSDI 2014, section 5.1) and the course's source note on data, model
and pipeline parallelism (README, "Source notes"), which takes click-through prediction with many
hashed features and logistic regression as its example: each example has a few dozen
active binary features, hashed into ``K`` keys (``10^5``-``10^6``). The loss of a minibatch
``B`` touches only the keys of its examples, so a worker pulls and pushes only those:

    p_i = sigmoid(sum_{k in x_i} w_k),   grad_k = (1/|B|) sum_{i in B, k in x_i} (p_i - y_i)

With the summing server a worker pushes ``-eta * grad`` (``w += v``); with the l1 server it
pushes ``grad`` and the server applies ``w <- soft(w - eta grad, eta lam)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .config import PSConfig
from .consistency import ssp_violations
from .filters import kkt_filter, significantly_modified
from .node import gather_store, ps_node


@dataclass
class CTRData:
    idx: np.ndarray        # (n, nnz) active keys of each example
    y: np.ndarray          # (n,) labels in {0, 1}
    n_keys: int
    w_true: np.ndarray


def make_ctr(n: int = 4000, n_keys: int = 1 << 17, nnz: int = 30, n_informative: int = 2000,
             seed: int = 0) -> CTRData:
    """Synthetic hashed click data: feature popularity is skewed (Zipf-like), as in real logs."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, n_keys + 1) ** 0.6
    perm = rng.permutation(n_keys)               # hashing scatters popular features over the key space
    p = np.empty(n_keys)
    p[perm] = pop / pop.sum()
    idx = np.sort(rng.choice(n_keys, size=(n, nnz), p=p), axis=1)
    w_true = np.zeros(n_keys)
    inf = np.argsort(-p)[:n_informative]         # the common features carry the signal
    w_true[inf] = rng.normal(0, 1.0, n_informative)
    margin = w_true[idx].sum(1)
    y = (rng.random(n) < 1 / (1 + np.exp(-margin))).astype(float)
    return CTRData(idx, y, n_keys, w_true)


def logloss(data: CTRData, w, rows=None) -> float:
    """Mean logistic loss log(1 + e^m) - y m, m = sum of w over each row's keys (all rows, or ``rows``)."""
    idx = data.idx if rows is None else data.idx[rows]
    y = data.y if rows is None else data.y[rows]
    m = np.asarray(w).ravel()[idx].sum(1)
    return float(np.mean(np.logaddexp(0, m) - y * m))


def minibatch_grad(idx_b, y_b, keys, w_keys):
    """Gradient of the mean log loss on a minibatch, on its sorted touched ``keys``."""
    pos = np.searchsorted(keys, idx_b)
    m = w_keys[pos].sum(1)
    r = 1 / (1 + np.exp(-m)) - y_b
    g = np.bincount(pos.ravel(), weights=np.repeat(r, idx_b.shape[1]), minlength=len(keys)) / len(y_b)
    loss = float(np.mean(np.logaddexp(0, m) - y_b * m))
    return g, loss


def lr_worker(kv, data: CTRData, iters: int, batch: int, eta: float, theta: float = 0.0, kkt: bool = False,
              seed: int = 0, work: float = 0.0, spike: float = 6.0, p_spike: float = 0.15):
    """One worker's loop: pull touched keys, gradient, (filtered) push, advance the clock.

    ``work`` seconds of emulated compute per iteration; with probability ``p_spike`` an iteration
    takes ``spike`` times longer (a transient straggler: a busy machine, a garbage collection)."""
    comm, cfg = kv.comm, kv.cfg
    if cfg.scheduler:                                           # data comes from the scheduler, task by task
        from .scheduler import next_task, report
        tasks = []
        out = {"trace": [], "pulled_keys": 0, "pushed_keys": 0, "unfiltered_keys": 0}
        while (task := next_task(comm, cfg.scheduler_rank)) is not None:
            rows = np.arange(len(data.y))[task::cfg.n_tasks]
            o = _iterate(kv, data, rows, iters, batch, eta, theta, kkt, seed * 1000 + task, work, spike, p_spike)
            out = {k: out[k] + o[k] for k in out}
            kv.wait_all()                                       # the task's updates are acknowledged
            report(comm, cfg.scheduler_rank, task)
            tasks.append(task)
        out["tasks"] = tasks
        return out
    rows = np.arange(kv.w, len(data.y), cfg.n_workers)          # this worker's shard
    return _iterate(kv, data, rows, iters, batch, eta, theta, kkt, seed * 1000 + kv.w, work, spike, p_spike,
                    jitter_seed=[seed, kv.w, 1])


def _iterate(kv, data, rows, iters, batch, eta, theta, kkt, batch_seed, work, spike, p_spike, jitter_seed=None):
    comm, cfg = kv.comm, kv.cfg
    rng = np.random.default_rng(batch_seed)                     # minibatches (as in sequential_lr)
    jitter = np.random.default_rng(jitter_seed if jitter_seed is not None else [batch_seed, 1])
    residual = {}                                               # significantly-modified filter state
    trace, pulled_keys, pushed_keys, sent_full = [], 0, 0, 0
    for t in range(iters):
        b = rng.choice(rows, size=batch, replace=False)
        keys = np.unique(data.idx[b])
        wk = kv.wait(kv.pull(keys)).reshape(-1)
        pulled_keys += len(keys)
        with comm.compute("gradient"):
            if work:
                time.sleep(work * (spike if jitter.random() < p_spike else 1.0))
            g, loss = minibatch_grad(data.idx[b], data.y[b], keys, wk)
            if cfg.updater == "l1":
                upd = g
                k_send, v_send = kkt_filter(keys, g, wk, cfg.lam) if kkt else (keys, g)
            else:
                upd = -eta * g
                if theta > 0:
                    acc = upd + np.array([residual.pop(int(k), 0.0) for k in keys])
                    k_send, v_send, kept = significantly_modified(keys, acc, theta)
                    for k, r in zip(keys[kept != 0], kept[kept != 0]):
                        residual[int(k)] = r
                else:
                    k_send, v_send = keys, upd
        sent_full += len(keys)
        pushed_keys += len(k_send)
        trace.append((comm.now(), t, loss))
        if len(k_send):
            kv.push(k_send, v_send)
        kv.advance()
    return {"trace": trace, "pulled_keys": pulled_keys, "pushed_keys": pushed_keys, "unfiltered_keys": sent_full}


@dataclass
class RunSummary:
    w: np.ndarray
    loss: float
    wait_time: list            # per worker, seconds blocked in wait()
    traces: list               # per worker [(time, iteration, minibatch loss)]
    reads: list                # every served read: (worker, t, min clock, seconds deferred), all servers
    pulled_keys: int
    pushed_keys: int
    unfiltered_keys: int
    bytes_server_to_worker: int
    bytes_worker_to_server: int
    wall_time: float

    @property
    def gate_wait(self) -> float:
        """Mean seconds a read was held back by the bounded-delay gate."""
        return float(np.mean([r[3] for r in self.reads])) if self.reads else 0.0

    def ssp_violations(self, tau) -> list:
        return ssp_violations([(t, m) for _, t, m, _ in self.reads], tau)

    failures: dict
    raw: object


def train(cluster, data: CTRData, cfg: PSConfig, iters: int = 30, batch: int = 32, eta: float = 0.5,
          theta: float = 0.0, kkt: bool = False, seed: int = 0, work: float = 0.0, **run_kw) -> RunSummary:
    """Run sparse logistic regression on ``cluster`` (``cfg.size`` ranks) and summarise it."""
    res = cluster.run(ps_node, cfg, lr_worker, data, iters, batch, eta, theta, kkt, seed, work, **run_kw)
    S = cfg.n_servers
    w = gather_store(list(res), cfg).ravel()
    workers = [r for r in res[S:S + cfg.n_workers] if r is not None]
    B = np.asarray(res.stats.bytes)
    return RunSummary(
        w=w, loss=logloss(data, w), wait_time=[r["wait_time"] for r in workers],
        traces=[r["result"]["trace"] for r in workers],
        reads=[x for r in res[:S] if r is not None for x in r["reads"]],
        pulled_keys=sum(r["result"]["pulled_keys"] for r in workers),
        pushed_keys=sum(r["result"]["pushed_keys"] for r in workers),
        unfiltered_keys=sum(r["result"]["unfiltered_keys"] for r in workers),
        bytes_server_to_worker=int(B[:S, S:S + cfg.n_workers].sum()),
        bytes_worker_to_server=int(B[S:S + cfg.n_workers, :S].sum()),
        wall_time=res.wall_time, failures=dict(res.failures), raw=res)


def replay(logs, n_keys: int) -> np.ndarray:
    """Single-process replay of every worker's push log on a summing server."""
    w = np.zeros(n_keys)
    for log in logs:
        for keys, vals in log:
            w[keys] += vals
    return w


__all__ = ["CTRData", "make_ctr", "logloss", "minibatch_grad", "lr_worker", "RunSummary", "train", "replay",
           "sequential_lr"]


def sequential_lr(data: CTRData, n_workers: int, iters: int, batch: int, eta: float, seed: int = 0) -> np.ndarray:
    """Single-process baseline of ``lr_worker`` under the sequential model (tau = 0): at every
    iteration all workers read the same parameters, then all their updates are summed in."""
    w = np.zeros(data.n_keys)
    rngs = [np.random.default_rng(seed * 1000 + k) for k in range(n_workers)]
    rows = [np.arange(k, len(data.y), n_workers) for k in range(n_workers)]
    for _ in range(iters):
        delta = np.zeros_like(w)
        for k in range(n_workers):
            b = rngs[k].choice(rows[k], size=batch, replace=False)
            keys = np.unique(data.idx[b])
            g, _ = minibatch_grad(data.idx[b], data.y[b], keys, w[keys])
            delta[keys] += -eta * g
        w += delta
    return w
