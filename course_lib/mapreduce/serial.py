"""The pieces of MapReduce gradient descent that need no processes, and the serial baseline.

One iteration, with M workers and the N rows split into M shards S_1..S_M:

    broadcast:  the server sends w_t to every worker
    map:        worker m computes  h_m = sum_{i in S_m} g_i(w_t)   (and its loss sum)
    reduce:     the server forms   g(w_t) = (1/N) sum_m h_m
    update:     w_{t+1} = w_t - lr * g(w_t)

Three reduce functions, as in the source notes (000 and 003):

* ``"sum"``: workers send h_m (P numbers, P = w.size); the server adds them, divides by N.
* ``"mean"``: workers send their shard's mean h_m / n_m; the server takes the mean weighted
  by shard size, sum_m (n_m / N) (h_m / n_m) (weights are needed when N % M != 0).
* ``"collect"``: workers send every per-sample gradient g_i (an n_m x P matrix); the server
  stacks them and sums. Same answer, N*P numbers up instead of M*P.

Every message also carries the shard's loss sum (one more number), so the server can
report the loss without touching the data.

Minibatch SGD (``batch_size=B``) replaces the N rows of an iteration by B rows drawn without
replacement (:func:`minibatch`): g_B(w) = (1/B) sum_{i in batch} g_i(w). It is unbiased,
E[g_B] = grad L(w), and its noise is

    E ||g_B - grad L||^2 = (N - B) / (N - 1) * sigma^2 / B,   sigma^2 = (1/N) sum_i ||g_i - grad L||^2

(sampling without replacement from a finite population: Cochran, *Sampling Techniques*, 1977,
section 2.6, applied to each coordinate). Worker m maps the drawn rows of its shard; the
reduce divides by B instead of N.
"""
from __future__ import annotations

import numpy as np

from course_lib.datasets import contiguous_shards
from course_lib.reference.ex01 import reduce_update

from .losses import get_problem

REDUCES = ("sum", "mean", "collect")


def shard_ranges(n: int, m: int) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of m shards of n rows, with ``numpy.array_split`` semantics.

    The first n % m shards get one row more, so n need not be a multiple of m
    (:func:`course_lib.datasets.contiguous_shards`, here with every shard non-empty).
    """
    if not (isinstance(m, (int, np.integer)) and m >= 1):
        raise ValueError(f"the number of shards must be an int >= 1, got {m!r}")
    if not (isinstance(n, (int, np.integer)) and n >= m):
        raise ValueError(f"cannot split {n!r} rows into {m} non-empty shards")
    return contiguous_shards(n, m)


def check_reduce(reduce: str) -> str:
    if reduce not in REDUCES:
        raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    return reduce


def map_shard(problem, X, y, w, reduce="sum"):
    """The map task of one shard, packed as the numbers a worker sends.

    sum:     [h_m (P numbers), loss sum]                    shape (P + 1,)
    mean:    [h_m / n_m,       loss sum / n_m]              shape (P + 1,)
    collect: [g_i (P numbers), l_i] for every row i         shape (n_m, P + 1)
    """
    problem = get_problem(problem)
    if reduce == "collect":
        G, losses = problem.per_sample(X, y, w)
        return np.concatenate([G, losses[:, None]], axis=1)
    g, loss = problem.shard_sums(X, y, w)
    out = np.empty(g.size + 1)
    out[:-1] = g.ravel()
    out[-1] = loss
    if reduce == "mean" and len(X):  # an empty shard (no row of a minibatch) sends zeros, weighted 0
        out /= len(X)
    elif reduce != "sum":
        check_reduce(reduce)
    return out


def reduce_results(results, counts, reduce="sum"):
    """Reduce the map outputs of all shards, *in shard order*, to (mean gradient, mean loss).

    results: list of map_shard outputs, one per shard, ordered by shard index.
    counts:  rows per shard (n_m). The fixed order makes floating point reproducible:
    a re-executed shard gives bit-for-bit the same final w.
    """
    check_reduce(reduce)
    if len(results) != len(counts):
        raise ValueError(f"{len(results)} results for {len(counts)} shards")
    n = int(sum(counts))
    if reduce == "collect":
        total = np.concatenate(results, axis=0).sum(axis=0) / n
    elif reduce == "sum":
        total = np.array(results[0], dtype=np.float64, copy=True)
        for r in results[1:]:
            total += r
        total /= n
    else:  # mean, weighted by shard size
        total = results[0] * (counts[0] / n)
        for r, c in zip(results[1:], counts[1:]):
            total += r * (c / n)
    return total[:-1], float(total[-1])


def reduce_and_update(results, counts, reduce, w, lr):
    """One iteration's reduce and update at the server: ``(new w, mean loss)``.

    With ``reduce="sum"`` the gradient parts of the map outputs go through
    :func:`course_lib.reference.ex01.reduce_update` (question ex01_3: add the partial sums in
    shard order, divide by N once, step); ``mean`` and ``collect`` reduce with
    :func:`reduce_results`, then step with :func:`gd_update`.
    """
    check_reduce(reduce)
    if reduce == "sum":
        if len(results) != len(counts):
            raise ValueError(f"{len(results)} results for {len(counts)} shards")
        n = int(sum(counts))
        shape = np.shape(w)
        partials = [np.reshape(np.asarray(r)[:-1], shape) for r in results]
        loss = 0.0
        for r in results:  # in shard order, as the gradient parts
            loss += float(np.asarray(r)[-1])
        return reduce_update(partials, n, w, lr), loss / n
    grad, loss = reduce_results(results, counts, reduce)
    return gd_update(w, grad, lr), loss


def gd_update(w, grad, lr):
    """w_{t+1} = w_t - lr * g(w_t) (grad may come flat; it takes w's shape)."""
    return w - lr * np.reshape(grad, np.shape(w))


def default_lr(problem, X) -> float:
    """Step 1/L, with L the gradient's Lipschitz bound: safe and fast for these problems."""
    return 1.0 / get_problem(problem).lipschitz(np.asarray(X))


def initial_w(y, d):
    """Zeros with the shape of w: (d,) or (d, k) when y has k columns."""
    y = np.asarray(y)
    return np.zeros((d,) if y.ndim == 1 else (d, y.shape[1]))


def minibatch(n: int, batch_size: int, t: int, seed: int = 0) -> np.ndarray:
    """The rows of iteration ``t``'s minibatch: ``batch_size`` distinct rows of ``n``, sorted.

    Drawn by ``numpy.random.default_rng([seed, t])``, so every process that knows (seed, t)
    draws the same rows: the server and the workers of MapReduce SGD need not send them.
    """
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be between 1 and the {n} rows, got {batch_size}")
    return np.sort(np.random.default_rng([seed, t]).choice(n, size=batch_size, replace=False))


def batch_counts(rows: np.ndarray, ranges) -> list[int]:
    """How many of the sorted ``rows`` fall in each shard ``[lo, hi)`` of ``ranges``."""
    return [int(np.searchsorted(rows, hi) - np.searchsorted(rows, lo)) for lo, hi in ranges]


def shard_batch(rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The sorted ``rows`` that fall in the shard ``[lo, hi)``."""
    return rows[np.searchsorted(rows, lo):np.searchsorted(rows, hi)]


def sgd_serial(problem, X, y, batch_size, iters=100, lr=None, w0=None, seed=0):
    """Minibatch SGD in one process, on the batches :func:`minibatch` draws: MapReduce SGD's baseline.

    Returns (w, batch_losses, losses): batch_losses[t] is the mean loss over iteration t's batch
    at w_t (what the MapReduce server reports), losses[t] = L(w_t) over all N rows.
    """
    problem = get_problem(problem)
    X = np.asarray(X)
    y = np.asarray(y)
    lr = default_lr(problem, X) if lr is None else float(lr)
    w = initial_w(y, X.shape[1]) if w0 is None else np.array(w0, dtype=np.float64)
    batch_losses, losses = np.empty(iters), np.empty(iters)
    for t in range(iters):
        rows = minibatch(len(X), batch_size, t, seed)
        g, loss = problem.shard_sums(X[rows], y[rows], w)
        batch_losses[t] = loss / batch_size
        losses[t] = problem.loss(X, y, w)
        w = gd_update(w, g / batch_size, lr)
    return w, batch_losses, losses


def gd_serial(problem, X, y, iters=100, lr=None, w0=None):
    """Full-batch gradient descent in one process: the baseline everything is checked against.

    Returns (w, losses) where losses[t] = L(w_t) for t = 0..iters-1.
    """
    problem = get_problem(problem)
    X = np.asarray(X)
    y = np.asarray(y)
    lr = default_lr(problem, X) if lr is None else float(lr)
    w = initial_w(y, X.shape[1]) if w0 is None else np.array(w0, dtype=np.float64)
    n = len(X)
    losses = np.empty(iters)
    for t in range(iters):
        g, loss = problem.shard_sums(X, y, w)
        losses[t] = loss / n
        w = gd_update(w, g / n, lr)
    return w, losses
