"""Lesson 02, collective communication: visible checks.

ex02_1  ring_allreduce(comm, x)          reduce-scatter + allgather around a ring, with sendrecv
ex02_2  rd_allgather(comm, x)            recursive-doubling allgather (p a power of two)
ex02_3  merge_stats(a, b)                merge two (count, mean, M2) summaries (Chan et al. 1979)
ex02_4  ring_allreduce_time(p, n, alpha, beta, gamma)   the alpha-beta-gamma cost of ex02_1
"""
import networkx as nx
import numpy as np

from course_lib.grading import question

CHECK_TIMEOUT = 8.0     # seconds a check's cluster run may take
DEADLOCK_TIMEOUT = 4.0  # a run that moves 800 kB on two workers takes well under a second


def _cluster(p, ring=False, timeout=CHECK_TIMEOUT):
    from course_lib import Cluster

    return Cluster(p, graph=nx.cycle_graph(p) if ring and p > 2 else None, timeout=timeout)


def _data(p, n, dtype, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * 10).astype(dtype) for _ in range(p)]


def _run_rank_data(fn):
    def body(comm, xs):
        return fn(comm, xs[comm.rank])
    return body


def assert_ring_allreduce(fn, p, n, dtype=np.float64, seed=0, ring=True, timeout=CHECK_TIMEOUT):
    xs = _data(p, n, dtype, seed)
    with _cluster(p, ring, timeout) as cluster:
        res = cluster.run(_run_rank_data(fn), xs)
    want = np.sum(np.stack(xs), axis=0, dtype=dtype)
    for r, got in enumerate(res):
        assert isinstance(got, np.ndarray), f"rank {r} returned {type(got).__name__}: return a numpy array"
        assert got.shape == want.shape, f"rank {r} returned shape {got.shape}, expected {want.shape}"
        assert got.dtype == want.dtype, f"rank {r} returned dtype {got.dtype}; keep the input's dtype {want.dtype}"
        tol = 1e-4 if np.dtype(dtype) == np.float32 else 1e-9
        assert np.allclose(got, want, rtol=tol, atol=tol), (
            f"p={p}, n={n}: rank {r} got the wrong sum (largest error {np.max(np.abs(got - want)):.3g}).")
    itemsize = np.dtype(dtype).itemsize
    total = res.stats.total_bytes
    expected = 2 * (p - 1) * n * itemsize
    assert total == expected, (
        f"p={p}, n={n} {np.dtype(dtype).name}: your allreduce moved {total} bytes in total, a ring allreduce "
        f"moves exactly 2(p-1) n itemsize = {expected}. Send one chunk per step (chunks from "
        "np.array_split), never the whole buffer, and send arrays, not lists.")
    for r in range(p):
        m = res.stats.messages_sent(r)
        assert m == 2 * (p - 1), (
            f"rank {r} sent {m} messages; the ring takes p-1 reduce-scatter steps and p-1 allgather steps, "
            f"one message each: {2 * (p - 1)}")


@question("ex02_1", points=3, title="Ring allreduce", names=("ring_allreduce",), timeout=30)
def ex02_1(ns):
    """``ring_allreduce(comm, x)``: every rank returns the element-wise sum over ranks of x,
    sending only to its right neighbour and receiving from its left one."""
    fn = ns["ring_allreduce"]
    assert_ring_allreduce(fn, 4, 10, seed=1)                       # on a ring; 10 not a multiple of 4
    # two workers, 800 kB each: send() blocks once the Pipe is full, so send-then-recv deadlocks
    assert_ring_allreduce(fn, 2, 100_000, seed=2, timeout=DEADLOCK_TIMEOUT)


def assert_rd_allgather(fn, p, shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(shape) * 10).astype(dtype) for _ in range(p)]
    with _cluster(p) as cluster:
        res = cluster.run(_run_rank_data(fn), xs)
    for r, got in enumerate(res):
        assert isinstance(got, list) and len(got) == p, (
            f"rank {r} must return a list of {p} arrays (one per rank, in rank order), got {type(got).__name__}"
            + (f" of length {len(got)}" if hasattr(got, "__len__") else ""))
        for i, (g, w) in enumerate(zip(got, xs)):
            g = np.asarray(g)
            assert g.shape == w.shape and np.array_equal(g, w), (
                f"p={p}: rank {r}'s item {i} should be rank {i}'s array (shape {w.shape}), got shape {g.shape}"
                + ("" if g.shape != w.shape else " with other values"))
    lgp = p.bit_length() - 1
    nbytes = xs[0].nbytes
    for r in range(p):
        m = res.stats.messages_sent(r)
        assert m == lgp, (f"p={p}: rank {r} sent {m} messages; recursive doubling takes lg p = {lgp} rounds with "
                          "one message each (exchange with partner rank ^ 2^k)")
        b = res.stats.bytes_sent(r)
        assert (p - 1) * nbytes <= b <= (p - 1) * nbytes + 256 * lgp, (
            f"p={p}: rank {r} sent {b} bytes; each rank must send (p-1) blocks of {nbytes} bytes = "
            f"{(p - 1) * nbytes} in all (round k: the 2^k blocks it holds, concatenated into one array)")


@question("ex02_2", points=2, title="Recursive-doubling allgather", names=("rd_allgather",), timeout=30)
def ex02_2(ns):
    """``rd_allgather(comm, x)`` for p a power of two: lg p rounds, exchanging with rank ^ 2^k."""
    assert_rd_allgather(ns["rd_allgather"], 4, (3,), seed=3)


def _summary(x):
    x = np.asarray(x)
    m = x.mean(axis=0)
    return x.shape[0], m, ((x - m) ** 2).sum(axis=0)


def assert_merge(fn, parts, rtol=1e-9, what=""):
    acc = _summary(parts[0])
    for p in parts[1:]:
        out = fn(acc, _summary(p))
        assert isinstance(out, tuple) and len(out) == 3, "merge_stats must return a tuple (count, mean, M2)"
        acc = out
    x = np.concatenate(parts).astype(np.float64)
    n, mean, m2 = acc
    assert int(n) == len(x), f"{what}count {n}, expected {len(x)}: counts add up"
    assert np.allclose(np.asarray(mean, float), x.mean(axis=0), rtol=rtol, atol=rtol), (
        f"{what}mean {np.asarray(mean)}, expected {x.mean(axis=0)}: weight each mean by its count")
    var = np.asarray(m2, float) / len(x)
    assert np.allclose(var, x.var(axis=0), rtol=rtol, atol=rtol * x.var(axis=0).max()), (
        f"{what}variance {var}, expected {x.var(axis=0)}. M2 of the union is M2a + M2b + "
        "delta^2 na nb / n with delta = mean_b - mean_a: the shards' means differ, and that spread counts too.")


@question("ex02_3", points=2, title="Merge batch statistics (SyncBatchNorm)", names=("merge_stats",), timeout=30)
def ex02_3(ns):
    """``merge_stats(a, b)``: merge (count, mean, M2) of two shards into those of their union."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((30, 2)) * [1.0, 4.0] + [0.0, 3.0]
    x = x[np.argsort(x[:, 0])]                                     # non-iid shards
    assert_merge(ns["merge_stats"], np.array_split(x, 3), what="non-iid shards: ")
    # float32, mean 1e4, spread 1: what the E[x^2] - E[x]^2 shortcut cannot do
    big = (1e4 + rng.standard_normal((4000, 1))).astype(np.float32)
    parts = np.array_split(big, 4)
    acc = _summary(parts[0])
    for p in parts[1:]:
        acc = ns["merge_stats"](acc, _summary(p))
    n, _, m2 = acc
    var = float(np.asarray(m2, np.float64)[0]) / n
    true = float(big.astype(np.float64).var())
    assert abs(var - true) < 1e-2 * true, (
        f"float32 data with mean 1e4 and variance {true:.3f}: your merged variance is {var:.3f}. Merging sums of "
        "squares (E[x^2] - E[x]^2) subtracts two numbers near 1e8 that float32 holds to 8 digits only: merge "
        "M2 with the delta term instead.")


def assert_time(fn, p, n, a, b, c):
    want = 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * c
    got = float(fn(p, n, a, b, c))
    assert np.isclose(got, want, rtol=1e-9, atol=0), (
        f"ring_allreduce_time({p}, {n}, alpha={a:g}, beta={b:g}, gamma={c:g}) = {got:.6g} s, expected {want:.6g} s. "
        "Count per rank: how many messages (steps), how many bytes each step, how many bytes reduced.")


@question("ex02_4", points=1, title="Cost of the ring allreduce", names=("ring_allreduce_time",), timeout=10)
def ex02_4(ns):
    """``ring_allreduce_time(p, n_bytes, alpha, beta, gamma)``: seconds, Thakur et al. (2005)."""
    fn = ns["ring_allreduce_time"]
    assert_time(fn, 4, 1e6, 1e-5, 1e-9, 2e-10)
    assert_time(fn, 8, 4e6, 3e-6, 5e-10, 0.0)
