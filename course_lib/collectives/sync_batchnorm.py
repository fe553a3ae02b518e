"""Synchronized batch normalization: per-worker statistics vs the whole batch.

Batch norm normalizes each feature with the mean and variance of the *batch*. With
data parallelism each worker sees only its shard of the batch, so its statistics are
not the single-device ones (the course's source notes, listed in the README: "multi-GPU
data parallelism is not equivalent to one GPU, mainly because of batch norm"), badly so
when shards are not iid.

The fix reduces per-worker summaries. Each worker computes (count n, mean m, M2), with
M2 = sum (x - m)^2, and two summaries merge exactly by the pairwise update of Chan, Golub &
LeVeque, "Updating formulae and a pairwise algorithm for computing sample variances"
(Stanford report STAN-CS-79-773, 1979; COMPSTAT 1982)::

    n = na + nb,  d = mb - ma,  m = ma + d nb / n,  M2 = M2a + M2b + d^2 na nb / n

so an allreduce with this merge as its op gives every worker the statistics of the
whole batch. Each worker's own summary is computed in float64 and stored in the data's
dtype: numpy sums a 2-D array down its columns one row at a time (pairwise summation
only runs along the contiguous axis), so a float32 running sum of 4096 values near 1e4
drifts by about 1e-2, a hundred float32 steps. The textbook shortcut var = E[x^2] - E[x]^2
(reduce sums of x and x^2) needs one sum-allreduce but subtracts two large, nearly equal
numbers: in float32 it loses every digit when the mean is large compared with the spread
(see :func:`naive_stats`; the rounding errors of both are analysed in Chan, Golub & LeVeque,
"Algorithms for computing the sample variance: analysis and recommendations", The American
Statistician, 1983).

The backward pass needs two more sums over the whole batch. With
``xhat = (x - mean) / sigma`` and ``y = weight * xhat + bias``, for a loss L with
``dy = dL/dy``::

    dbias   = sum dy,    dweight = sum dy * xhat,
    dx      = weight / sigma * (dy - dbias / N - xhat * dweight / N)

where the sums and N run over the whole batch, not the worker's shard (Ioffe &
Szegedy 2015, section 3). So a worker allreduces ``(sum dy, sum dy * xhat)``, one sum of
``2 * features`` numbers, exactly what PyTorch's SyncBatchNorm does in its backward.
"""
from __future__ import annotations

import numpy as np

from ..reference.ex02 import merge_stats  # question ex02_3: Chan et al. (1979)
from ..runtime.ops import Op

__all__ = ["local_stats", "merge_stats", "merge_all", "naive_stats", "sync_stats", "batch_norm",
           "batch_norm_backward", "SyncBatchNorm", "MERGE"]


def local_stats(x, dtype=None):
    """(count, mean, M2) per feature (columns) of a batch x of shape (n, features).

    Two passes accumulated in float64, returned in x's dtype: the mean first, then
    ``M2 = sum (x - mean)^2`` around it, so nothing large is subtracted from anything
    large (the shortcut E[x^2] - E[x]^2 does; see :func:`naive_stats`)."""
    x = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
    out = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    n = x.shape[0]
    if n == 0:
        z = np.zeros(x.shape[1:], out)
        return 0, z, z.copy()
    mean = x.mean(axis=0, dtype=np.float64)
    m2 = ((x.astype(np.float64) - mean) ** 2).sum(axis=0)
    return n, mean.astype(out), m2.astype(out)


def merge_all(summaries):
    """Merge a list of summaries left to right."""
    out = summaries[0]
    for s in summaries[1:]:
        out = merge_stats(out, s)
    return out


MERGE = Op(merge_stats, commute=True, name="merge_stats")


def naive_stats(x, dtype=np.float32):
    """Mean and variance the shortcut way, E[x^2] - E[x]^2, accumulated in ``dtype``."""
    x = np.asarray(x, dtype=dtype)
    n = x.dtype.type(x.shape[0])
    s = x.sum(axis=0, dtype=x.dtype)
    ss = (x * x).sum(axis=0, dtype=x.dtype)
    mean = s / n
    return mean, ss / n - mean * mean


def sync_stats(comm, x, algorithm="recursive_doubling"):
    """Mean and (biased) variance of the union of every worker's batch x.

    One allreduce of (count, mean, M2) with :data:`MERGE` as the op. Recursive
    doubling combines in the same order on every rank, so all ranks get bit-identical
    statistics (a ring would too, but would need the summaries cut into chunks)."""
    n, mean, m2 = comm.allreduce(local_stats(x), op=MERGE, algorithm=algorithm)
    return mean, m2 / n


def batch_norm(x, mean, var, weight=1.0, bias=0.0, eps=1e-5):
    """y = weight (x - mean) / sqrt(var + eps) + bias, per feature."""
    return weight * (np.asarray(x) - mean) / np.sqrt(var + eps) + bias


def batch_norm_backward(dy, xhat, sigma, weight, n, sums=None):
    """Gradients of batch norm: ``(dx, dweight, dbias)``.

    ``sums = (sum dy, sum dy * xhat)`` over the whole batch of ``n`` rows; None means this
    batch is the whole batch (one device). ``dx = weight / sigma * (dy - sum dy / n -
    xhat * sum(dy xhat) / n)``: the mean and variance depend on every row, hence the two
    batch-wide sums."""
    dy = np.asarray(dy)
    dbias, dweight = (dy.sum(axis=0), (dy * xhat).sum(axis=0)) if sums is None else sums
    dx = weight / sigma * (dy - dbias / n - xhat * dweight / n)
    return dx, dweight, dbias


class SyncBatchNorm:
    """Batch norm over features whose batch statistics come from all workers.

    ``forward(x, comm)`` normalizes with the statistics of the whole (distributed) batch
    in training mode and updates running averages the way ``torch.nn.BatchNorm1d`` does
    (unbiased variance for the running estimate); ``comm=None`` is plain batch norm on
    one device. ``training=False`` uses the running averages.

    ``backward(dy, comm)`` returns dL/dx for this worker's rows and sets ``grad_weight``
    and ``grad_bias`` (the whole batch's, equal on every worker): one sum-allreduce of
    ``2 * features`` numbers."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        self.eps, self.momentum = eps, momentum
        self.weight = np.ones(num_features)
        self.bias = np.zeros(num_features)
        self.running_mean = np.zeros(num_features)
        self.running_var = np.ones(num_features)
        self.grad_weight = self.grad_bias = None
        self._saved = None  # (xhat, sigma, n) of the last training forward, for backward

    def forward(self, x, comm=None, training=True):
        if not training:
            return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
        if comm is None:
            n, mean, m2 = local_stats(x)
        else:
            n, mean, m2 = comm.allreduce(local_stats(x), op=MERGE, algorithm="recursive_doubling")
        var = m2 / n
        unbiased = m2 / max(n - 1, 1)
        self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean
        self.running_var = (1 - self.momentum) * self.running_var + self.momentum * unbiased
        sigma = np.sqrt(var + self.eps)
        xhat = (np.asarray(x) - mean) / sigma
        self._saved = (xhat, sigma, n)
        return self.weight * xhat + self.bias

    __call__ = forward

    def backward(self, dy, comm=None):
        if self._saved is None:
            raise RuntimeError("backward() needs a forward() in training mode first")
        xhat, sigma, n = self._saved
        dy = np.asarray(dy)
        sums = None
        if comm is not None:
            both = np.concatenate([dy.sum(axis=0), (dy * xhat).sum(axis=0)])
            both = comm.allreduce(both, algorithm="recursive_doubling")
            sums = (both[:xhat.shape[1]], both[xhat.shape[1]:])
        dx, self.grad_weight, self.grad_bias = batch_norm_backward(dy, xhat, sigma, self.weight, n, sums)
        return dx
