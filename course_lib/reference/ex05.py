"""Lesson 05, inside the parameter server: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex05_1  ring_lookup(points, owners, key)               consistent hashing: first point >= key, wrapping
ex05_2  may_read(t, clocks, tau)                       the bounded-delay (SSP) gate
ex05_3  significantly_modified(keys, residual, theta)  the filter: send big entries, keep the rest
ex05_4  merge_clocks(a, b)                             merge two vector clocks kept per key range
ex05_5  crossover_density(p, busiest_share, key_bytes, value_bytes)   parameter server or ring allreduce
ex05_6  sgd_worker_loop(kv, keys, update, depend)      a worker's iterations as tasks, with or without dependency

The parameter server (:mod:`course_lib.ps`) routes keys with :func:`ring_lookup`, gates its
reads with :func:`may_read`, filters pushes with :func:`significantly_modified` and merges its
range clocks with :func:`merge_clocks`; :mod:`course_lib.ps.crossover` predicts with
:func:`crossover_density` where a ring allreduce starts to move fewer bytes than the server.
:func:`sgd_worker_loop` is the loop of :func:`course_lib.ps.tasks.prefetch_worker` without its
bookkeeping (minibatches, the staleness counter, the timeline events).
"""
from __future__ import annotations

import math

import numpy as np


def ring_lookup(points, owners, key):
    """Owner of ``key`` on a consistent-hashing ring: the owner of the first point >= key, wrapping
    around to points[0]. ``points`` sorted ascending, ``owners[i]`` the server of ``points[i]``."""
    # point i owns the arc (points[i-1], points[i]]: the first point >= key, by bisection
    i = np.searchsorted(np.asarray(points), key, side="left")
    i = np.where(i == len(points), 0, i)          # past the last point: wrap around to the first
    out = np.asarray(owners)[i]
    # the question asks for one integer key (an int back); the library also looks up an array
    # of keys at once, which the same lines do (an array back)
    return out if np.ndim(key) else int(out)


def may_read(t, clocks, tau):
    """True if a worker at clock ``t`` may read now under bounded delay ``tau``:
    ``min(clocks) >= t - tau``. tau = 0 is sequential, tau = inf eventual (never wait)."""
    if tau == math.inf:
        return True
    # the slowest worker is at most tau iterations behind
    return bool(min(clocks) >= t - tau)


def significantly_modified(keys, residual, theta):
    """Split ``residual`` (aligned with ``keys``) into ``(send_keys, send_values, kept)``.

    Send the entries with |r_k| > theta, in key order; ``kept`` is the residual with those
    entries zeroed."""
    keys = np.asarray(keys)
    residual = np.asarray(residual, dtype=np.float64)
    mask = np.abs(residual) > theta
    # np.where makes a new array: the small entries stay, to go out once they add up, and
    # the caller's residual is left unchanged. Nothing is lost.
    return keys[mask], residual[mask], np.where(mask, 0.0, residual)


def merge_clocks(a, b):
    """Merge two range vector clocks ``[(lo, hi, vec), ...]`` over the same key space: the elementwise
    max on each piece, in as few segments as possible (numpy arrays as vectors)."""
    # cut at every boundary of either clock: on each piece both clocks are constant
    cuts = sorted({s[0] for s in a} | {s[1] for s in a} | {s[0] for s in b} | {s[1] for s in b})
    out, i, j = [], 0, 0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        # the segment of a, and of b, that holds this piece (both lists are sorted by lo)
        while a[i][1] <= lo:
            i += 1
        while b[j][1] <= lo:
            j += 1
        v = np.maximum(np.asarray(a[i][2]), np.asarray(b[j][2]))
        if out and np.array_equal(out[-1][2], v):
            out[-1] = (out[-1][0], hi, out[-1][2])      # the same vector as the piece before: join them
        else:
            out.append((lo, hi, v))
    return out


def crossover_density(p, busiest_share, key_bytes, value_bytes):
    """The density ``d = k / n`` at which a key-range parameter server and a ring allreduce carry as
    many bytes through their busiest rank per SGD step (``p`` workers, ``n`` weights, ``k`` keys
    touched per worker, the busiest server holding a share ``busiest_share`` of the keys)."""
    # Parameter server, per worker: pull k keys out and k values back, push k keys and k values
    # out: 2 k (b_key + b_val). The busiest server sees a share s of each of the p workers' keys:
    # 2 k (b_key + b_val) p s; the busiest rank is it or a worker, so 2 k (b_key + b_val) max(1, p s).
    # Ring allreduce of the dense gradient: 2 (p-1)/p n values out and as many in, 4 (p-1)/p n b_val.
    # Equal at d* = k / n = 4 (p-1)/p b_val / (2 (b_key + b_val) max(1, p s)).
    ring_per_weight = 4 * (p - 1) / p * value_bytes
    ps_per_key = 2 * (key_bytes + value_bytes) * max(1.0, p * busiest_share)
    return ring_per_weight / ps_per_key


def sgd_worker_loop(kv, keys, update, depend):
    """One worker's ``len(keys)`` SGD iterations as asynchronous tasks (Li et al., OSDI 2014, section 3.4).

    Iteration ``t``: wait for the read of ``keys[t]``, push ``update(t, w)``, then ``kv.advance()``;
    the pull of ``t + 1`` depends on push ``t`` (``depend``) or overlaps the gradient of ``t``."""
    last = len(keys) - 1
    read = kv.pull(keys[0])
    for t in range(len(keys)):
        w = kv.wait(read)
        if not depend and t < last:
            # leaves before the gradient of t is computed: its round trip overlaps the computation,
            # and the read misses iteration t (staleness 1), T ~ max(c, 2 alpha) per iteration
            read = kv.pull(keys[t + 1])
        push = kv.push(keys[t], update(t, w))
        kv.advance()
        if depend and t < last:
            # leaves once push t is acknowledged and the clock says t is done: the sequential server
            # answers it with every update of iteration t (staleness 0), T ~ c + 4 alpha
            read = kv.pull(keys[t + 1], after=[push])
