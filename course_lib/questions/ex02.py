"""Lesson 02, collective communication: visible checks.

ex02_1  ring_allreduce(comm, x)          reduce-scatter + allgather around a ring, with sendrecv
ex02_2  rd_allgather(comm, x)            recursive-doubling allgather (p a power of two)
ex02_3  merge_stats(a, b)                merge two (count, mean, M2) summaries (Chan et al. 1979)
ex02_4  ring_allreduce_time(p, n, alpha, beta, gamma)   the alpha-beta-gamma cost of ex02_1
ex02_5  switch_loop(comm, hosts, n_chunks)  in-network aggregation: the switch adds chunks as they arrive
"""

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_array,
    as_number,
    as_sequence,
    assert_unchanged,
    call_keeping_inputs,
    formula_mismatch,
    num,
    off_by,
    readable,
    shown,
    unnamed,
    worst,
)

CHECK_TIMEOUT = 6.0     # seconds a check's cluster run may take
DEADLOCK_TIMEOUT = 4.0  # a run that moves 800 kB on two workers takes well under a second



def _collective_spy():
    """A profiler that notes the first function of course_lib.collectives the student's code enters.

    ex02_1 and ex02_2 ask for an algorithm built from send and recv; the course's own collectives
    (``comm.allreduce``, ``comm.allgather``, ``course_lib.collectives.*``) would answer them in one
    line. Those the communicator runs by default live in the runtime
    (``course_lib.runtime.base_collectives``), the variants in lesson 02's package: both are
    watched. Their helpers (``_p2p`` and ``runtime.algorithm_helpers``: chunk bounds), the barrier
    and the choice of the default allreduce stay allowed. The ring allgather and reduce-scatter that
    lesson 06's tensor-parallel layers use (``course_lib.model_parallel.exchange``) are the two
    halves of ex02_1's ring: refused too."""
    import os
    import sys

    import course_lib.collectives as pkg
    import course_lib.model_parallel.exchange as exchange
    import course_lib.runtime.base_collectives as base

    root = os.path.dirname(pkg.__file__) + os.sep
    allowed = {os.path.join(root, "_p2p.py"), os.path.join(root, "barrier.py"), os.path.join(root, "__init__.py")}
    allowed_in_base = {"barrier_dissemination", "allreduce_default"}
    rings = {"ring_allgather", "ring_reduce_scatter"}
    seen = []

    def spy(frame, event, arg):
        if event == "call" and not seen:
            path = frame.f_code.co_filename
            if path.startswith(root) and path not in allowed:
                seen.append(f"{os.path.basename(path)[:-3]}.{frame.f_code.co_name}")
            elif path == base.__file__ and frame.f_code.co_name not in allowed_in_base:
                seen.append(f"base_collectives.{frame.f_code.co_name}")
            elif path == exchange.__file__ and frame.f_code.co_name in rings:
                seen.append(f"model_parallel.exchange.{frame.f_code.co_name}")
        return None

    sys.setprofile(spy)
    return seen


def _on_rank(comm, fn, xs):
    import sys

    x = xs[comm.rank]
    seen = _collective_spy()
    try:
        out = fn(comm, x)
    finally:
        sys.setprofile(None)
    return readable(out), x, (seen[0] if seen else "")


@harness
def run_collective(fn, xs, ring=False, timeout=CHECK_TIMEOUT):
    """Run ``fn(comm, xs[rank])`` on len(xs) workers (a ring if ``ring``).

    Returns (per-rank results, per-rank x after the call, total bytes, messages sent per rank,
    bytes sent per rank, the first course collective each rank called or "")."""
    import networkx as nx

    from course_lib import Cluster

    p = len(xs)
    with Cluster(p, graph=nx.cycle_graph(p) if ring and p > 2 else None, timeout=timeout) as cluster:
        res = cluster.run(_on_rank, fn, list(xs))
        st = res.stats
        return ([r[0] for r in res], [r[1] for r in res], int(st.total_bytes),
                [int(st.messages_sent(r)) for r in range(p)], [int(st.bytes_sent(r)) for r in range(p)],
                [r[2] for r in res])


def assert_no_course_collective(name, used):
    """``name`` must be built from send and recv, not from the course's own collectives."""
    called = sorted({u for u in used if u})
    assert not called, (
        f"{name} should be built from comm.send, comm.recv and comm.sendrecv, but it called the course's own "
        f"collective {called[0]} (comm.allreduce, comm.allgather, course_lib.collectives and the ring helpers of "
        "course_lib.model_parallel are not allowed here).")


def rank_data(p, n, dtype, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * 10).astype(dtype) for _ in range(p)]


# ------------------------------------------------------------------------------ ex02_1
def assert_ring_allreduce(fn, p, n, dtype=np.float64, seed=0, timeout=CHECK_TIMEOUT, within=unnamed):
    xs = rank_data(p, n, dtype, seed)
    res, after, total, msgs, _, used = run_collective(fn, xs, True, timeout)
    with within("collective"):
        assert_no_course_collective("ring_allreduce", used)
    want = np.sum(np.stack(xs), axis=0, dtype=dtype)        # what every rank must hold: the sum over ranks
    with within("inputs"):
        for r in range(p):
            assert_unchanged("ring_allreduce", ["x"], [xs[r]], [after[r]], on=f"on rank {r}")
    tol = 1e-4 if np.dtype(dtype) == np.float32 else 1e-9
    for r, got in enumerate(res):
        with within("result"):
            if not isinstance(got, np.ndarray):
                raise AssertionError(f"rank {r} should return a numpy array of shape ({n},), got {shown(got)}.")
            assert got.shape == want.shape, (
                f"p={p}, n={n}: rank {r} should return shape {want.shape}, got {got.shape}.")
        with within("dtype"):
            assert got.dtype == want.dtype, (
                f"p={p}: rank {r} should return an array of the input's dtype {want.dtype}, got {got.dtype}.")
        with within("result"):
            assert np.allclose(got, want, rtol=tol, atol=tol), (
                f"p={p}, n={n}: rank {r} should return the sum over ranks, but its {worst(got, want, 'result')}.")
    with within("traffic"):
        _assert_ring_traffic(p, n, dtype, total, msgs)


def _assert_ring_traffic(p, n, dtype, total, msgs):
    itemsize = np.dtype(dtype).itemsize
    expected = 2 * (p - 1) * n * itemsize
    assert total == expected, (
        f"p={p}, n={n} {np.dtype(dtype).name}: a ring allreduce moves exactly 2(p-1) n itemsize = {expected} bytes "
        f"in all, yours moved {total}. Send one chunk (from np.array_split) per step, never the whole buffer, "
        "and send arrays, not lists.")
    for r, m in enumerate(msgs):
        assert m == 2 * (p - 1), (
            f"p={p}: each rank sends 2(p-1) = {2 * (p - 1)} messages (p-1 reduce-scatter steps, p-1 allgather steps), "
            f"rank {r} sent {m}.")


@question("ex02_1", points=3, title="Ring allreduce", names=("ring_allreduce",))
def ex02_1(ns):
    """``ring_allreduce(comm, x)``: every rank returns the element-wise sum over ranks of x,
    sending only to its right neighbour and receiving from its left one."""
    fn = ns["ring_allreduce"]
    assert_ring_allreduce(fn, 4, 10, seed=1)                       # on a ring; 10 not a multiple of 4
    # two workers, 800 kB each: send() blocks once the Pipe is full, so send-then-recv deadlocks
    assert_ring_allreduce(fn, 2, 100_000, seed=2, timeout=DEADLOCK_TIMEOUT)


# ------------------------------------------------------------------------------ ex02_2
def assert_rd_allgather(fn, p, shape, dtype=np.float64, seed=0, within=unnamed):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(shape) * 10).astype(dtype) for _ in range(p)]
    res, after, _, msgs, sent, used = run_collective(fn, xs)
    with within("collective"):
        assert_no_course_collective("rd_allgather", used)
    with within("inputs"):
        for r in range(p):
            assert_unchanged("rd_allgather", ["x"], [xs[r]], [after[r]], on=f"on rank {r}")
    with within("result"):
        _assert_gathered(p, xs, res)
    with within("traffic"):
        _assert_rd_traffic(p, xs, msgs, sent)


def _assert_gathered(p, xs, res):
    for r, got in enumerate(res):
        if not isinstance(got, list) or len(got) != p:
            raise AssertionError(f"p={p}: rank {r} should return a list of {p} arrays (one per rank, in rank order), "
                                 f"got {shown(got)}.")
        for i, (g, w) in enumerate(zip(got, xs)):
            if not (isinstance(g, np.ndarray) and g.shape == w.shape and np.array_equal(g, w)):
                raise AssertionError(f"p={p}: item {i} of rank {r}'s list should be rank {i}'s block {shown(w)}, "
                                     f"got {shown(g)}.")


def _assert_rd_traffic(p, xs, msgs, sent):
    lgp = p.bit_length() - 1
    nbytes = xs[0].nbytes
    for r in range(p):
        assert msgs[r] == lgp, (
            f"p={p}: recursive doubling takes lg p = {lgp} rounds of one message each (to partner rank ^ 2^k); "
            f"rank {r} sent {msgs[r]} messages.")
        lo, hi = (p - 1) * nbytes, (p - 1) * nbytes + 256 * lgp
        assert lo <= sent[r] <= hi, (
            f"p={p}: each rank sends (p-1) blocks of {nbytes} bytes = {lo} bytes in all (in round k the 2^k blocks it "
            f"holds, concatenated into one array); rank {r} sent {sent[r]} bytes.")


@question("ex02_2", points=2, title="Recursive-doubling allgather", names=("rd_allgather",))
def ex02_2(ns):
    """``rd_allgather(comm, x)`` for p a power of two: lg p rounds, exchanging with rank ^ 2^k."""
    assert_rd_allgather(ns["rd_allgather"], 4, (3,), seed=3)


# ------------------------------------------------------------------------------ ex02_3
def summary(x):
    """(count, mean, M2) of the rows of x: the summary of one shard."""
    x = np.asarray(x)
    m = x.mean(axis=0)
    return x.shape[0], m, ((x - m) ** 2).sum(axis=0)


def merged(fn, a, b, what, within=unnamed):
    with within("inputs"):
        out = call_keeping_inputs(fn, (a, b), ("a", "b"))
    with within("result"):
        n, mean, m2 = as_sequence(out, 3, f"{what}merge_stats's result (count, mean, M2)", kinds=(tuple, list))
        d = np.shape(a[1])
        return (as_number(n, f"{what}the count"), as_array(mean, f"{what}the mean", shape=d),
                as_array(m2, f"{what}M2", shape=d))


def assert_merge(fn, parts, rtol=1e-9, what="", within=unnamed):
    """Merging the shards' summaries one by one must give the count, mean and variance of their union."""
    acc = summary(parts[0])
    for p in parts[1:]:
        acc = merged(fn, acc, summary(p), what, within)
    with within("result"):
        _assert_union(parts, acc, rtol, what)


def _assert_union(parts, acc, rtol, what):
    x = np.concatenate(parts).astype(np.float64)
    n, mean, m2 = acc
    assert n == len(x), f"{what}the merged count should be {len(x)} (counts add up), got {num(n)}."
    assert np.allclose(mean, x.mean(axis=0), rtol=rtol, atol=rtol), (
        f"{what}the merged mean should be {shown(x.mean(axis=0))}, got {shown(mean)}: weight each mean by its count.")
    var = np.asarray(m2, float) / len(x)
    assert np.allclose(var, x.var(axis=0), rtol=rtol, atol=rtol * x.var(axis=0).max()), (
        f"{what}M2 / n should be the variance {shown(x.var(axis=0))}, got {shown(var)}. M2 of the union is "
        "M2a + M2b + delta^2 na nb / n with delta = mean_b - mean_a: the spread between the shards' means counts too.")


def assert_float32_merge(fn, big, parts, within=unnamed):
    acc = summary(parts[0])
    for p in parts[1:]:
        acc = merged(fn, acc, summary(p), "float32 data: ", within)
    with within("result"):
        _assert_float32_variance(big, acc)


def _assert_float32_variance(big, acc):
    n, _, m2 = acc
    var = float(np.asarray(m2, np.float64)[0]) / n
    true = float(big.astype(np.float64).var())
    mean = float(big.astype(np.float64).mean())
    assert abs(var - true) < 1e-2 * true, (
        f"float32 data with mean {num(mean, 3)} and variance {num(true, 4)}: the merged variance should be within 1% "
        f"of it, got {num(var, 4)}. Sums of squares (E[x^2] - E[x]^2) subtract two numbers near {num(mean ** 2, 1)} "
        "that float32 holds to 7 digits only: merge M2 with the delta term instead.")


@question("ex02_3", points=2, title="Merge batch statistics (SyncBatchNorm)", names=("merge_stats",))
def ex02_3(ns):
    """``merge_stats(a, b)``: merge (count, mean, M2) of two shards into those of their union."""
    fn = ns["merge_stats"]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((30, 2)) * [1.0, 4.0] + [0.0, 3.0]
    x = x[np.argsort(x[:, 0])]                                     # non-iid shards
    assert_merge(fn, np.array_split(x, 3), what="non-iid shards: ")
    # float32, mean 1e4, spread 1: what the E[x^2] - E[x]^2 shortcut cannot do
    big = (1e4 + rng.standard_normal((4000, 1))).astype(np.float32)
    assert_float32_merge(fn, big, np.array_split(big, 4))


# ------------------------------------------------------------------------------ ex02_4
#: The three terms of the cost model, each read alone by zeroing the other two coefficients.
TERMS = (("the latency term (alpha alone, beta = gamma = 0)",
          "count the messages each rank sends one after the other, over both phases"),
         ("the bandwidth term (beta alone, alpha = gamma = 0)",
          "count the bytes each rank sends over all the steps: a chunk of n/p bytes a step"),
         ("the reduction term (gamma alone, alpha = beta = 0)",
          "count the bytes each rank adds: only the reduce-scatter phase adds, a chunk a step"))


def assert_time(fn, p, n, a, b, c, want):
    """``want``: the (latency, bandwidth, reduction) terms in seconds, or their total. A wrong total
    names the term that is off (each term read alone from the student's function), never its value."""
    terms = tuple(want) if isinstance(want, (tuple, list)) else None
    total = sum(terms) if terms else want
    got = as_number(fn(p, n, a, b, c), "ring_allreduce_time's result (seconds)")
    if np.isclose(got, total, rtol=1e-9, atol=0):
        return
    call = f"ring_allreduce_time({p}, {num(n)}, alpha={num(a)}, beta={num(b)}, gamma={num(c)})"
    off = []
    for k, ((term, how), coef) in (enumerate(zip(TERMS, (a, b, c))) if terms else ()):
        alone = [0.0, 0.0, 0.0]
        alone[k] = coef
        part = as_number(fn(p, n, *alone), f"ring_allreduce_time's result with only {term.split(' (')[0]}")
        if not np.isclose(part, terms[k], rtol=1e-9, atol=1e-300):
            off.append(f"{term} is {off_by(part, terms[k])}: {how}")
    why = ("; ".join(off) + ".") if off else (
        "Count per rank: how many messages (steps), how many bytes each step, how many bytes added.")
    raise formula_mismatch(f"{call} = {num(got)} s is {off_by(got, total)}. {why[0].upper() + why[1:]}", total)


@question("ex02_4", points=1, title="Cost of the ring allreduce", names=("ring_allreduce_time",))
def ex02_4(ns):
    """``ring_allreduce_time(p, n_bytes, alpha, beta, gamma)``: seconds, Thakur et al. (2005)."""
    fn = ns["ring_allreduce_time"]
    # the expected (latency, bandwidth, reduction) terms, in seconds
    assert_time(fn, 4, 1e6, 1e-5, 1e-9, 2e-10, (6e-5, 1.5e-3, 1.5e-4))
    assert_time(fn, 8, 4e6, 3e-6, 5e-10, 0.0, (4.2e-5, 3.5e-3, 0.0))


# ------------------------------------------------------------------------------ ex02_5
SWITCH_TIMEOUT = 4.0    # a correct switch finishes these runs in well under a second


def _fabric_rank(comm, fn, xs, chunk_bytes, slots, n_chunks, switch):
    """Rank ``switch`` runs the student's switch; the other ranks, the hosts in rank order, stream
    their vectors (host k holds ``xs[k]``) with the course's host side."""
    import sys

    from course_lib.collectives import sharp

    hosts = [r for r in range(len(xs) + 1) if r != switch]
    if comm.rank != switch:
        return sharp.stream_to_switch(comm, xs[hosts.index(comm.rank)], switch, chunk_bytes, slots), ""
    seen = _collective_spy()
    try:
        fn(comm, hosts, n_chunks)
    finally:
        sys.setprofile(None)
    return None, (seen[0] if seen else "")


@harness
def run_switch(fn, xs, chunk_bytes, slots, n_chunks, timeout=SWITCH_TIMEOUT, switch=None):
    """p hosts (xs) and the student's switch at rank ``switch`` (default p, the last; the hosts are the
    other ranks). Returns None if the run did not finish, else (the hosts' results, bytes[i][j] and
    messages[i][j] sent from rank i to rank j, the first course collective the switch called or "")."""
    from course_lib import Cluster
    from course_lib.runtime.cluster import WorkerTimeout

    p = len(xs)
    switch = p if switch is None else int(switch)
    with Cluster(p + 1, timeout=timeout) as cluster:
        try:
            res = cluster.run(_fabric_rank, fn, list(xs), chunk_bytes, slots, n_chunks, switch)
        except WorkerTimeout:
            return None
        hosts = [r for r in range(p + 1) if r != switch]
        return ([res[r][0] for r in hosts], res.stats.bytes.tolist(), res.stats.messages.tolist(), res[switch][1])


def integer_vectors(p, n, dtype, seed):
    """Integer-valued floats: every order of addition gives the exact sum."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-99, 100, n).astype(dtype) for _ in range(p)]


def assert_switch(fn, p, n, dtype, chunk_bytes, slots, seed, switch=None, within=unnamed):
    """``switch``: the switch's rank (default p, after the hosts); the hosts are the other ranks."""
    xs = integer_vectors(p, n, dtype, seed)
    itemsize = np.dtype(dtype).itemsize
    per = chunk_bytes // itemsize
    k = -(-n // per)
    switch = p if switch is None else switch
    hosts = [r for r in range(p + 1) if r != switch]
    where = (f"p={p} hosts, n={n} {np.dtype(dtype).name}, {k} chunks of {per} values, {slots} in flight per host, "
             f"the switch at rank {switch}")
    out = run_switch(fn, xs, chunk_bytes, slots, k, switch=switch)
    with within("finish"):
        _assert_finished(out, where, slots)
    results, nbytes, msgs, used = out
    with within("collective"):
        assert_no_course_collective("switch_loop", [used])
    with within("result"):
        _assert_sums(xs, results, where)
    with within("traffic"):
        _assert_switch_traffic(hosts, switch, nbytes, msgs, n * itemsize, k, where)


def _assert_finished(out, where, slots):
    assert out is not None, (
        f"{where}: the run did not finish. A host sends chunk j + {slots} only after the sum of chunk j has come "
        "back, so the switch must send each chunk's sum down as soon as all hosts' copies of that chunk are in, "
        "not wait for the whole vector.")


def _assert_sums(xs, results, where):
    want = np.sum(np.stack(xs), axis=0)
    for h, got in enumerate(results):
        assert isinstance(got, np.ndarray) and np.array_equal(got, want), (
            f"{where}: host {h} should get the sum over hosts, but its {worst(got, want, 'result')}. Add chunk j's "
            "arrays element-wise (the message's tag is j) and send the complete sum.")


def _assert_switch_traffic(hosts, switch, nbytes, msgs, total_bytes, k, where):
    for h in hosts:
        for what, table, want_n in (("bytes", nbytes, total_bytes), ("messages", msgs, k)):
            assert table[switch][h] == want_n, (
                f"{where}: the switch should send host {h} each chunk's sum once, {want_n} {what} in all (as it "
                f"received from each host), but sent {table[switch][h]}.")


@question("ex02_5", points=2, title="In-network aggregation: the switch's loop", names=("switch_loop",))
def ex02_5(ns):
    """``switch_loop(comm, hosts, n_chunks)``: receive every host's chunks (tag = chunk index), add them as
    they arrive, send each complete sum to every host once (tag = its chunk)."""
    assert_switch(ns["switch_loop"], 3, 50, np.float64, 64, 2, seed=5)    # 7 chunks, the last of 2 values
