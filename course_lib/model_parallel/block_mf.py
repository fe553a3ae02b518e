"""Model parallelism for a matrix too large for one worker: blocked matrix factorisation.

We factorise an n x k_cols ratings-like matrix ``R ~ U V^T`` (U: n x k, V: k_cols x k),
minimising ``1/2 ||R - U V^T||^2 + lam/2 (||U||^2 + ||V||^2)``. The rows are cut in p
blocks and the columns in p blocks, giving a p x p grid of blocks ``R_ij``. Worker r
owns row block r of R, generated where it lives (no process ever holds all of R), and
the factor rows ``U_r``. The column factors ``V_j`` travel around a ring.

Blocks ``(r, (r + s) mod p)`` for r = 0..p-1 share no row and no column (a *stratum*),
so the p workers update them at the same time without conflict: this is DSGD
(Gemulla et al. 2011). Sub-epoch s: worker r updates U_r and V_{(r+s) mod p} with one
gradient step on its block, then passes that V block to worker r-1. After p
sub-epochs every block was visited once and V_j is back home.

Memory per worker: ``(n/p) k_cols`` ratings + ``(n/p + 2 k_cols/p) k`` factors (two V
blocks while one is in flight) instead of ``n k_cols + (n + k_cols) k``.
Bytes per epoch: every V block crosses p links: ``p * k_cols * k * 8``.

Because the blocks of a stratum are disjoint, the result equals a single process doing
the same block updates in the same stratum order (:func:`mf_serial`), bit for bit.
"""
from __future__ import annotations

import numpy as np

from .tensor import split_ranges

__all__ = ["ratings_block", "init_factor", "block_update", "mf_serial", "mf_worker",
           "mf_bytes_per_worker", "mf_full_bytes"]

TAG_V = 6021


def ratings_block(seed, i, j, rows, cols, true_rank=4, noise=0.01):
    """Block (i, j) of a low-rank-plus-noise matrix, generated from the seed alone.

    ``rows`` and ``cols`` are the (start, stop) ranges of the block; the latent row and
    column factors of block i (resp. j) come from their own seeded generators, so any
    worker can build any block without seeing the rest of the matrix.
    """
    A = np.random.default_rng([seed, 0, i]).normal(size=(rows[1] - rows[0], true_rank))
    Bm = np.random.default_rng([seed, 1, j]).normal(size=(cols[1] - cols[0], true_rank))
    E = np.random.default_rng([seed, 2, i, j]).normal(size=(A.shape[0], Bm.shape[0]))
    return A @ Bm.T / np.sqrt(true_rank) + noise * E


def init_factor(seed, which, i, n_rows, k):
    """Small random initial factor block (``which`` = 3 for U, 4 for V)."""
    return 0.3 * np.random.default_rng([seed, which, i]).normal(size=(n_rows, k))


def block_update(R, U, V, lr, lam):
    """One gradient step on ``1/2||R - U V^T||^2 + lam/2(||U||^2+||V||^2)``; returns
    ``(U, V, loss_before)``."""
    E = U @ V.T - R
    loss = 0.5 * float(np.sum(E * E))
    gU = E @ V + lam * U
    gV = E.T @ U + lam * V
    return U - lr * gU, V - lr * gV, loss


def _setup(n, n_cols, p, k):
    if min(n, n_cols, k) < 1:
        raise ValueError(f"need n, n_cols, k >= 1, got {n}, {n_cols}, {k}")
    return split_ranges(n, p), split_ranges(n_cols, p)


def mf_serial(n, n_cols, k, p, epochs=10, lr=0.01, lam=0.01, seed=0):
    """The same block updates in one process: returns ``(U, V, losses_per_epoch)``."""
    rr, cc = _setup(n, n_cols, p, k)
    R = [[ratings_block(seed, i, j, rr[i], cc[j]) for j in range(p)] for i in range(p)]
    U = [init_factor(seed, 3, i, rr[i][1] - rr[i][0], k) for i in range(p)]
    V = [init_factor(seed, 4, j, cc[j][1] - cc[j][0], k) for j in range(p)]
    losses = []
    for _ in range(epochs):
        tot = 0.0
        for s in range(p):
            for i in range(p):
                j = (i + s) % p
                U[i], V[j], block_loss = block_update(R[i][j], U[i], V[j], lr, lam)
                tot += block_loss
        losses.append(tot)
    return np.vstack(U), np.vstack(V), losses


def mf_bytes_per_worker(n, n_cols, k, p, itemsize=8):
    """Largest bytes any worker holds: its R row block, U block and two V blocks."""
    rr, cc = _setup(n, n_cols, p, k)
    rows = max(b - a for a, b in rr)
    cols = max(b - a for a, b in cc)
    return (rows * n_cols + rows * k + 2 * cols * k) * itemsize


def mf_full_bytes(n, n_cols, k, itemsize=8):
    """Bytes of the whole problem in one place: R, U and V."""
    return (n * n_cols + (n + n_cols) * k) * itemsize


def mf_worker(comm, n, n_cols, k, epochs=10, lr=0.01, lam=0.01, seed=0, budget_bytes=None):
    """DSGD on worker ``comm.rank``; returns its U block, its V block and per-epoch losses.

    ``budget_bytes`` is the worker's memory budget: the worker refuses (ValueError)
    when its blocks would not fit. It returns the bytes it actually held at the peak.
    """
    p, r = comm.size, comm.rank
    rr, cc = _setup(n, n_cols, p, k)
    need = (rr[r][1] - rr[r][0]) * (n_cols + k) * 8 + 2 * max(b - a for a, b in cc) * k * 8
    if budget_bytes is not None and need > budget_bytes:
        raise ValueError(f"worker {r} needs {need} bytes for its blocks but its budget is "
                         f"{budget_bytes} bytes: use more workers")
    R_row = [ratings_block(seed, r, j, rr[r], cc[j]) for j in range(p)]
    U = init_factor(seed, 3, r, rr[r][1] - rr[r][0], k)
    V = init_factor(seed, 4, r, cc[r][1] - cc[r][0], k)
    held = sum(b.nbytes for b in R_row) + U.nbytes + V.nbytes
    peak = held
    losses = []
    sent0 = comm.stats.bytes_sent(r)
    for _ in range(epochs):
        tot = 0.0
        for s in range(p):
            j = (r + s) % p
            with comm.compute(f"block {r},{j}"):
                U, V, block_loss = block_update(R_row[j], U, V, lr, lam)
            tot += block_loss
            if p > 1:
                # hand V_j to r-1 (which needs it next) and take V_{j+1} from r+1
                V_new = comm.sendrecv(V, dest=(r - 1) % p, source=(r + 1) % p,
                                      sendtag=TAG_V, recvtag=TAG_V)
                peak = max(peak, held + V_new.nbytes)
                V = np.array(V_new)
        losses.append(tot)
    return {"U": U, "V": V, "losses": losses, "peak_bytes": int(peak), "need_bytes": int(need),
            "bytes_sent": int(comm.stats.bytes_sent(r) - sent0)}
