"""Lesson 00, the cluster in your laptop: visible checks.

ex00_1  sum_shard(comm, sa)                 each worker sums its block of a shared array
ex00_2  fit_latency_bandwidth(sizes, times) least squares fit of  t = latency + size / bandwidth
ex00_3  ring_pass(comm, token)              pass a token once around a ring with send/recv
"""
import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness

CHECK_TIMEOUT = 30.0  # seconds a check's cluster run may take


def block(n, rank, size):
    """Indices [lo, hi) of the contiguous block of ``rank``: lo = rank*n//size, hi = (rank+1)*n//size.

    The blocks tile 0..n-1 exactly and their sizes differ by at most one."""
    return rank * n // size, (rank + 1) * n // size


@harness
def run_sum_shard(fn, values, n_workers):
    """Run the student's ``fn`` on a cluster; return the per-rank results (on the student's side)."""
    from course_lib import Cluster

    with Cluster(n_workers, timeout=CHECK_TIMEOUT) as cluster:
        sa = cluster.share(np.asarray(values, dtype=np.float64))
        return list(cluster.run(fn, sa))


def assert_shard_sums(fn, values, n_workers):
    res = run_sum_shard(fn, values, n_workers)
    n = len(values)
    assert len(res) == n_workers, f"expected one result per rank, got {len(res)}"
    for r, got in enumerate(res):
        lo, hi = block(n, r, n_workers)
        want = float(np.sum(values[lo:hi]))
        assert got is not None, f"rank {r} returned None: return the sum of its block as a float"
        assert np.isclose(float(got), want, rtol=1e-12, atol=1e-12), (
            f"with n={n} values on {n_workers} workers, rank {r} should sum values[{lo}:{hi}] = {want:g}, "
            f"got {got!r}. Use lo = rank*n//size and hi = (rank+1)*n//size.")
    assert np.isclose(sum(float(x) for x in res), float(np.sum(values))), "the blocks must cover every value once"


@question("ex00_1", points=2, title="Sum your shard", names=("sum_shard",))
def ex00_1(ns):
    """Write ``sum_shard(comm, sa)``: rank r of `size` workers sums its contiguous block
    ``sa.array[r*n//size:(r+1)*n//size]`` of the shared array and returns it as a float."""
    values = np.arange(1.0, 13.0)                      # 12 values on 3 workers: 4 each
    assert_shard_sums(ns["sum_shard"], values, 3)


def ping_pong_table(latency, bandwidth, sizes, noise=0.0, seed=0):
    """Synthetic ping-pong times t = latency + size/bandwidth, with relative noise."""
    rng = np.random.default_rng(seed)
    t = latency + np.asarray(sizes, dtype=float) / bandwidth
    return t * (1 + noise * rng.standard_normal(len(t)))


def assert_fit(fn, sizes, times, latency, bandwidth, rtol):
    out = fn(sizes, times)
    assert isinstance(out, tuple) and len(out) == 2, (
        f"return a tuple (latency_seconds, bandwidth_bytes_per_second), got {type(out).__name__}")
    lat, bw = map(float, out)
    assert np.isclose(bw, bandwidth, rtol=rtol), (
        f"bandwidth {bw:.4g} B/s, expected about {bandwidth:.4g} B/s. The slope of time against size is "
        "seconds per byte: bandwidth is 1/slope.")
    assert np.isclose(lat, latency, rtol=rtol), (
        f"latency {lat:.4g} s, expected about {latency:.4g} s: it is the intercept of the fitted line "
        "(the time of an empty message).")


@question("ex00_2", points=2, title="Fit latency and bandwidth", names=("fit_latency_bandwidth",))
def ex00_2(ns):
    """Write ``fit_latency_bandwidth(sizes, times)``: fit ``time = latency + size / bandwidth`` by
    least squares on a ping-pong table and return ``(latency_seconds, bandwidth_bytes_per_second)``."""
    fn = ns["fit_latency_bandwidth"]
    sizes = np.array([0, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22], dtype=float)
    assert_fit(fn, sizes, ping_pong_table(20e-6, 2e9, sizes), 20e-6, 2e9, rtol=1e-6)
    assert_fit(fn, sizes, ping_pong_table(50e-6, 5e8, sizes, noise=0.01, seed=1), 50e-6, 5e8, rtol=0.05)


@harness
def run_ring(fn, n_workers, token):
    """Run the student's ``fn`` on a ring; return (per-rank results, messages[src, dst])."""
    import networkx as nx

    from course_lib import Cluster

    with Cluster(n_workers, graph=nx.cycle_graph(n_workers), timeout=CHECK_TIMEOUT) as cluster:
        res = cluster.run(fn, token)
        return list(res), np.asarray(res.stats.messages)


def assert_ring(fn, n_workers, token):
    res, m = run_ring(fn, n_workers, token)
    want = [token] + list(range(1, n_workers))
    assert res[0] == want, (f"on a ring of {n_workers}, rank 0 should get back {want!r}, got {res[0]!r}. "
                            "Rank r receives from (r-1) % size and sends to (r+1) % size.")
    others = [r for r in range(1, n_workers) if res[r] is not None]
    assert not others, f"ranks other than 0 should return None; ranks {others} did not"
    for r in range(n_workers):
        nxt = (r + 1) % n_workers
        assert m[r, nxt] == 1, f"rank {r} should send exactly one message to rank {nxt}, sent {int(m[r, nxt])}"
    assert int(m.sum()) == n_workers, f"a ring pass takes {n_workers} messages, yours took {int(m.sum())}"


@question("ex00_3", points=1, title="Pass the token around the ring", names=("ring_pass",))
def ex00_3(ns):
    """Write ``ring_pass(comm, token)``: rank 0 sends ``[token]`` to rank 1; every other rank receives
    the list from its left neighbour, appends its rank and sends it to its right neighbour; rank 0
    receives the list back and returns it. Other ranks return None."""
    assert_ring(ns["ring_pass"], 4, "hello")
