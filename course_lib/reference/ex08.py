"""Lesson 08, data parallelism as it is practised: reference answers (instructor-only, see :mod:`course_lib.reference`).

ex08_1  assign_buckets(param_nbytes, cap_bytes)                  DDP's buckets, last parameter first
ex08_2  update_scale(scale, clean_steps, found_overflow, growth_interval, growth_factor, backoff_factor)
                                                                (new scale, new clean count, skip this step)
ex08_3  shard_range(n_params, n_ranks, rank)                    [start, stop) that reduce_scatter leaves on rank
ex08_4  zero_bytes_per_param(stage, n_ranks)                    ZeRO's model-state bytes per parameter per rank
ex08_5  reduce_in_buckets(comm, grads, buckets, offsets, n_params)
                                                                DDP's step: a bucket's ring allreduce started
                                                                as soon as backward completes it

The library keeps its names as wrappers: :func:`course_lib.data_parallel.ddp.assign_buckets` turns
ex08_1's lists into a ``BucketPlan``, :func:`course_lib.data_parallel.mixed_precision.update_scale`
ex08_2's triple into a ``ScaleUpdate``, and :mod:`course_lib.data_parallel.zero` re-exports ex08_3
and checks the stage before ex08_4. :func:`course_lib.data_parallel.ddp.ddp_train` sums every overlapped
step's gradients with ex08_5. This module imports none of them (they import it).
"""
from __future__ import annotations


def assign_buckets(param_nbytes, cap_bytes):
    """DDP's buckets (Li et al., "PyTorch Distributed", VLDB 2020, section 4.2.2): lists of parameter
    indices (model order 0..n-1), filled from the last parameter, each within ``cap_bytes``.

    Returns ``[[n-1, n-2, ...], ...]``; a parameter larger than the cap gets a bucket alone."""
    # backward makes the last parameters' gradients first, so buckets fill in reverse model order
    buckets, current, size = [], [], 0
    for q in reversed(range(len(param_nbytes))):
        n = int(param_nbytes[q])
        # the parameter that would exceed the cap opens the next bucket (a parameter is never split)
        if current and size + n > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(q)
        size += n
    if current:
        buckets.append(current)
    return buckets


def update_scale(scale, clean_steps, found_overflow, growth_interval, growth_factor=2.0, backoff_factor=0.5):
    """One step of dynamic loss scaling (Micikevicius et al., "Mixed Precision Training", ICLR 2018,
    section 3.2; PyTorch's GradScaler): ``(new_scale, new_clean_steps, skip_step)``."""
    # an inf or nan in the gradient: the scale was too large; back off, skip the update, and
    # restart the count of clean steps
    if found_overflow:
        return scale * backoff_factor, 0, True
    # a clean step is applied and counted; after growth_interval of them in a row, try a larger scale
    clean_steps += 1
    if clean_steps >= growth_interval:
        return scale * growth_factor, 0, False
    return scale, clean_steps, False


def shard_range(n_params, n_ranks, rank):
    """``[start, stop)`` of the flat vector that ``comm.reduce_scatter`` leaves on ``rank``: chunk
    ``rank`` of ``np.array_split(np.arange(n_params), n_ranks)``."""
    # with q, m = divmod(n, N) the first m chunks hold q + 1 elements, the others q: rank r
    # starts after r chunks of q and min(r, m) extra elements
    q, m = divmod(int(n_params), int(n_ranks))
    start = rank * q + min(rank, m)
    return start, start + q + (1 if rank < m else 0)


def zero_bytes_per_param(stage, n_ranks):
    """Model-state bytes per parameter each of N = ``n_ranks`` workers holds with mixed-precision
    Adam under ZeRO (Rajbhandari et al., "ZeRO", SC 2020), ``stage`` 0 (plain data parallel) to 3."""
    # fp16 parameters (2 B), fp16 gradients (2 B), fp32 master weights, m and v (12 B): stage 1
    # shards the optimizer states over the N ranks, stage 2 also the gradients, stage 3 also the
    # parameters (an unknown stage is a KeyError)
    n = int(n_ranks)
    return {0: 2 + 2 + 12, 1: 2 + 2 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]


def reduce_in_buckets(comm, grads, buckets, offsets, n_params):
    """DDP's overlapped gradient reduction (Li et al., "PyTorch Distributed", VLDB 2020, section 4.2.3).

    ``grads`` yields ``(q, gradient of parameter q)`` in the order backward makes them; ``buckets``
    are lists of parameter indices (ex08_1's); ``offsets[q] = (start, stop)`` is parameter q's slice
    of the flat gradient. Start each bucket's ``comm.iallreduce(..., algorithm="ring")`` as soon as
    its last gradient arrives; return the flat gradient summed over ranks: ``n_params`` numbers in
    the gradients' dtype."""
    import numpy as np

    where = {q: i for i, members in enumerate(buckets) for q in members}
    arrived = [{} for _ in buckets]
    requests = [None] * len(buckets)
    dtype = np.float32
    for q, grad in grads:
        i = where[q]
        arrived[i][q] = grad
        dtype = grad.dtype
        if len(arrived[i]) == len(buckets[i]):
            # the bucket's last gradient: its allreduce starts now, in the background, and runs
            # while the loop asks backward for the next gradient (the layers below)
            bucket_flat = np.concatenate([arrived[i][m].ravel() for m in buckets[i]])
            requests[i] = comm.iallreduce(bucket_flat, algorithm="ring")
    # backward is done: wait for each bucket's sum and put every parameter's part where it belongs
    total = np.empty(n_params, dtype=dtype)
    for i, members in enumerate(buckets):
        reduced, at = requests[i].wait(), 0
        for m in members:
            start, stop = offsets[m]
            total[start:stop] = reduced[at:at + (stop - start)]
            at += stop - start
    return total
