"""Lesson 05, inside the parameter server: visible checks.

ex05_1  ring_lookup(points, owners, key)          consistent hashing: first point >= key, wrapping around
ex05_2  may_read(t, clocks, tau)                  the bounded-delay (SSP) gate
ex05_3  significantly_modified(keys, residual, theta)   the filter: send big entries, keep the rest
ex05_4  merge_clocks(a, b)                        merge two vector clocks kept per key range
ex05_5  crossover_density(p, busiest_share, key_bytes, value_bytes)   parameter server or ring allreduce
ex05_6  sgd_worker_loop(kv, keys, update, depend)  a worker's iterations as tasks, with or without dependency
"""
import contextlib
import math

import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_array,
    as_int,
    as_number,
    as_sequence,
    call_keeping_inputs,
    formula_mismatch,
    num,
    off_by,
    refuse_helpers,
    shown,
    worst,
)

CHECK_TIMEOUT = 8.0  # seconds a parameter-server run of a check may take (these take well under one)


#: Library functions that do (part of) a question's work: the checks refuse an answer that calls them.
HELPERS = {
    "ex05_4": [("course_lib.ps.vclock", "_coalesce")],                    # joins equal neighbouring segments
    "ex05_5": [("course_lib.ps.crossover", "ring_step_bytes"), ("course_lib.ps.crossover", "ps_step_bytes")],
}


# ------------------------------------------------------------------------------ ex05_1
def assert_lookup(fn, points, owners, cases):
    """``cases``: [(key, owner)]."""
    points, owners = np.asarray(points), np.asarray(owners)
    for key, want in cases:
        got = as_int(call_keeping_inputs(fn, (points, owners, int(key)), ("points", "owners", "key")),
                     f"ring_lookup(points, owners, {int(key)}) (the owner, a server number)")
        assert got == want, (
            f"with points={shown(points, 50)} and owners={shown(owners, 50)}, key {int(key)} belongs to server "
            f"{want}, got {got}. A key goes to the first point >= key; a key after the last point wraps around "
            "to the first point.")


@question("ex05_1", points=2, title="Look up a key on the hash ring", names=("ring_lookup",))
def ex05_1(ns):
    """``ring_lookup(points, owners, key)``: points sorted; return the owner of the first point >= key,
    wrapping around to ``owners[0]`` for keys after the last point."""
    fn = ns["ring_lookup"]
    assert_lookup(fn, [10, 20, 30], [0, 1, 2], [(0, 0), (10, 0), (11, 1), (20, 1), (25, 2), (30, 2), (31, 0), (99, 0)])
    assert_lookup(fn, [5, 40, 70], [3, 1, 2], [(5, 3), (6, 1), (41, 2), (70, 2), (71, 3)])


# ------------------------------------------------------------------------------ ex05_2
def assert_gate(fn, cases):
    """``cases``: [(t, clocks, tau, may the worker read?)]."""
    for t, clocks, tau, want in cases:
        got = call_keeping_inputs(fn, (t, list(clocks), tau), ("t", "clocks", "tau"))
        if not isinstance(got, (bool, np.bool_)):
            raise AssertionError(f"may_read({t}, {list(clocks)}, {tau}) should return a bool, got {shown(got)}.")
        if bool(got) == want:
            continue
        head = f"a worker at clock t={t} with clocks {list(clocks)} and tau={tau}"
        if got:
            why = ("may_read lets it read, yet some worker lags it by more than tau iterations. The bounded delay "
                   "(stale synchronous parallel) bounds the lag of every worker, so the one to watch is the "
                   "slowest.")
        elif math.isinf(tau):
            why = "may_read blocks it, but with tau = inf there is no bound on the delay: the gate never closes."
        else:
            why = ("may_read blocks it, yet no worker lags it by more than tau iterations: a lag of exactly tau is "
                   "still within the bound, and only a lag beyond tau closes the gate.")
        raise AssertionError(f"{head}: {why}")


@question("ex05_2", points=2, title="The bounded-delay gate", names=("may_read",))
def ex05_2(ns):
    """``may_read(t, clocks, tau)``: True iff ``min(clocks) >= t - tau`` (always True for tau = inf), a bool;
    ``clocks`` stays unchanged."""
    assert_gate(ns["may_read"], [(3, [3, 3, 3], 0, True), (3, [2, 3, 3], 0, False), (3, [2, 5, 3], 1, True),
                                 (4, [2, 5, 3], 1, False), (5, [2, 5, 3], 3, True), (6, [2, 5, 3], 3, False),
                                 (100, [0, 0], math.inf, True)])


# ------------------------------------------------------------------------------ ex05_3
def assert_filter(fn, keys, residual, theta, want_keys, want_values, want_kept):
    keys, residual = np.asarray(keys), np.asarray(residual, dtype=float)
    out = call_keeping_inputs(fn, (keys, residual, theta), ("keys", "residual", "theta"))
    k, v, kept = as_sequence(out, 3, "significantly_modified's result (send_keys, send_values, kept)",
                             kinds=(tuple, list))
    head = f"keys {shown(keys, 40)}, residual {shown(residual, 50)}, theta={num(theta)}"
    k = as_array(k, f"{head}: send_keys", kinds="iu")
    if k.ndim != 1:
        raise AssertionError(f"{head}: send_keys should be a 1-D array of keys, got {shown(k)}.")
    assert k.tolist() == list(want_keys), (
        f"{head}: send exactly the keys whose |residual| > theta, in key order: expected {list(want_keys)}, "
        f"got {k.tolist()}.")
    v = as_array(v, f"{head}: send_values", shape=(len(want_values),))
    assert np.allclose(v, want_values, rtol=0, atol=0), (
        f"{head}: send_values should be the residual of the sent keys, {shown(np.asarray(want_values, float))}; "
        f"got {shown(v)}.")
    kept = as_array(kept, f"{head}: kept", shape=residual.shape)
    assert np.allclose(kept, want_kept, rtol=0, atol=0), (
        f"{head}: kept should be the residual with the sent entries set to zero, "
        f"{shown(np.asarray(want_kept, float))}; got "
        f"{shown(kept)}. Entries at or below the threshold stay, to be sent once they add up.")


@question("ex05_3", points=2, title="The significantly-modified filter", names=("significantly_modified",))
def ex05_3(ns):
    """``significantly_modified(keys, residual, theta)`` -> ``(send_keys, send_values, kept)``; ``keys`` and
    ``residual`` stay unchanged."""
    fn = ns["significantly_modified"]
    assert_filter(fn, [2, 5, 7, 9], [0.5, -0.01, -0.3, 0.02], 0.1, [2, 7], [0.5, -0.3], [0.0, -0.01, 0.0, 0.02])
    assert_filter(fn, [1, 2, 3], [0.0, 0.0, 0.0], 0.0, [], [], [0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------ ex05_4
def _segments(x, what):
    if not isinstance(x, (list, tuple)):
        raise AssertionError(f"{what} should be a list of segments (lo, hi, vec), got {shown(x)}.")
    out = []
    for s in x:
        lo, hi, vec = as_sequence(s, 3, f"each segment of {what} (lo, hi, vec)", kinds=(tuple, list))
        if not isinstance(vec, np.ndarray):
            raise AssertionError(f"the vector of segment {shown(s, 40)} of {what} should be a numpy array (the "
                                 f"range clock's lookups return it), got a {type(vec).__name__}.")
        vec = as_array(vec, f"the vector of segment {shown(s, 40)} of {what}", kinds="iuf")
        out.append((as_int(lo, f"lo of a segment of {what}"), as_int(hi, f"hi of a segment of {what}"),
                    [int(v) if float(v).is_integer() else float(v) for v in vec.ravel()]))
    return out


def assert_merge(fn, a, b, want):
    a = [(lo, hi, np.array(v)) for lo, hi, v in a]
    b = [(lo, hi, np.array(v)) for lo, hi, v in b]
    refuse_helpers(fn, (a, b), HELPERS["ex05_4"], "merge_clocks")
    got = _segments(call_keeping_inputs(fn, (a, b), ("a", "b")), "merge_clocks's result")
    want = [(lo, hi, list(v)) for lo, hi, v in want]
    assert got == want, (
        f"merging a = {_short(a)} and b = {_short(b)} should give {_short(want)}, got {_short(got)}. Cut at every "
        "boundary of a and of b, take the elementwise max on each piece, then join neighbouring pieces with equal "
        "vectors.")


def _short(segs, limit=200):
    text = "[" + ", ".join(f"({lo}, {hi}, {[int(v) for v in np.ravel(vec)]})" for lo, hi, vec in segs) + "]"
    return text if len(text) <= limit else text[:limit - 3] + "..."


@question("ex05_4", points=3, title="Merge vector clocks kept per key range", names=("merge_clocks",))
def ex05_4(ns):
    """``merge_clocks(a, b)``: two lists of segments ``(lo, hi, vec)`` covering the same ``[0, K)``, merged
    into a new list of ``(lo, hi, vec)`` with ``vec`` a numpy array; ``a`` and ``b`` stay unchanged."""
    fn = ns["merge_clocks"]
    assert_merge(fn, [(0, 10, [1, 0])], [(0, 10, [0, 2])], [(0, 10, [1, 2])])
    assert_merge(fn, [(0, 5, [1, 0]), (5, 10, [2, 0])], [(0, 3, [0, 4]), (3, 10, [0, 1])],
                 [(0, 3, [1, 4]), (3, 5, [1, 1]), (5, 10, [2, 1])])
    assert_merge(fn, [(0, 4, [1, 1]), (4, 9, [2, 0])], [(0, 2, [1, 1]), (2, 9, [2, 1])],
                 [(0, 2, [1, 1]), (2, 9, [2, 1])])                     # equal neighbours are joined


# ------------------------------------------------------------------------------ ex05_5
def assert_crossover(fn, cases):
    """``cases``: [(p, busiest_share, key_bytes, value_bytes, expected density)]."""
    refuse_helpers(fn, cases[0][:4], HELPERS["ex05_5"], "crossover_density")
    for p, share, kb, vb, want in cases:
        args = (p, share, kb, vb)
        got = as_number(call_keeping_inputs(fn, args, ("p", "busiest_share", "key_bytes", "value_bytes")),
                        f"crossover_density{args}")
        if abs(got - want) > 1e-9 * abs(want):
            raise formula_mismatch(
                f"with p={p} workers, the busiest server holding a share {num(share)} of the keys, {kb}-byte keys and "
                f"{vb}-byte values, your crossover density {num(got)} is {off_by(got, want)}. It is the density k/n "
                "at which both move as many bytes through their busiest rank, sent and received: a worker pulls k "
                "keys, gets k values, pushes k keys and k values; the busiest server sees its share of every "
                "worker's keys (but the busiest rank is at least as busy as a worker); a ring allreduce sends and "
                "receives 2(p-1)/p n values at every rank.", want)


@question("ex05_5", points=2, title="Parameter server or ring allreduce: the crossover density",
          names=("crossover_density",))
def ex05_5(ns):
    """``crossover_density(p, busiest_share, key_bytes, value_bytes)``: the density ``k / n`` where both move
    as many bytes through their busiest rank per step."""
    assert_crossover(ns["crossover_density"], [(3, 0.5, 8, 8, 4 / 9), (2, 0.5, 8, 8, 0.5), (4, 0.25, 8, 8, 0.75),
                                               (8, 1.0, 8, 8, 0.109375), (3, 0.2, 8, 8, 2 / 3)])


# ------------------------------------------------------------------------------ ex05_6
class TaskLog:
    """The worker's ``kv``, handed to the loop under test: it forwards every call and records, in
    order, each task the loop issues (pull, push, wait, advance) and each gradient it asks for.

    For a pull it notes the worker's clock and which earlier pushes were still unacknowledged when
    the pull left. The worker has one thread and handles acknowledgements only inside a wait, so
    this is exact: an unacknowledged push is one no wait has completed yet."""

    def __init__(self, kv, keys):
        self.kv, self.keys, self.log = kv, keys, []
        self.pull_number, self.push_number, self.updates = {}, {}, {}

    def __getattr__(self, name):                 # kv.w, kv.cfg, kv.comm, ... as on the real worker
        return getattr(self.kv, name)

    def _number(self, keys, numbers, ts):
        numbers[ts] = len(numbers)
        n = numbers[ts]
        same = n < len(self.keys) and np.array_equal(np.asarray(keys), self.keys[n])
        return n, bool(same)

    def pull(self, keys, after=()):
        ts = self.kv.pull(keys, after=after)     # returns once sent (after its dependencies)
        n, same = self._number(keys, self.pull_number, ts)
        unacked = [i for t, i in self.push_number.items() if t in self.kv.pending and self.kv.pending[t].todo]
        self.log.append({"op": "pull", "n": n, "keys_ok": same, "clock": self.kv.clock, "unacked": unacked})
        return ts

    def push(self, keys, values, after=()):
        ts = self.kv.push(keys, values, after=after)
        n, same = self._number(keys, self.push_number, ts)
        made = self.updates.get(n)
        same_values = made is not None and np.array_equal(np.asarray(values, dtype=float), made)
        self.log.append({"op": "push", "n": n, "keys_ok": same, "values_ok": bool(same_values),
                         "clock": self.kv.clock})
        return ts

    def wait(self, ts):
        self.log.append({"op": "wait", "pull": self.pull_number.get(ts, -1)})
        return self.kv.wait(ts)

    def wait_for(self, timestamps):
        for ts in timestamps:
            self.wait(ts)

    def wait_all(self):
        self.log.append({"op": "wait", "pull": "all"})
        self.kv.wait_all()

    def advance(self):
        self.kv.advance()
        self.log.append({"op": "advance", "clock": self.kv.clock})


LOOP_BATCH, LOOP_ETA = 16, 0.5


def loop_data(seed):
    """The click data of the runs: big enough steps that one iteration of delay changes the model."""
    from course_lib.ps import make_ctr

    return make_ctr(n=600, n_keys=2048, nnz=10, seed=3 + seed)


def _loop_driver(kv, loop, data, iters, batch, eta, depend, seed):
    """One worker: minibatches as :func:`course_lib.ps.tasks.delayed_sgd` draws them, the loop under
    test on a :class:`TaskLog`. Every push also adds 1 to the last key (a counter, not a weight), so
    the counter a read returns says how many pushes it contains: its staleness is measured."""
    from course_lib.ps import minibatch_grad

    rows = np.arange(kv.w, len(data.y), kv.cfg.n_workers)
    rng = np.random.default_rng(seed * 1000 + kv.w)
    batches = [rng.choice(rows, size=batch, replace=False) for _ in range(iters)]
    keys = [np.append(np.unique(data.idx[b]), data.n_keys) for b in batches]
    spy = TaskLog(kv, keys)

    def update(t, w):
        if not isinstance(t, (int, np.integer)) or not 0 <= t < iters:
            raise ValueError(f"update(t, w) takes the iteration t in 0..{iters - 1}, got t={shown(t)}")
        w = np.asarray(w, dtype=float)
        if w.shape != keys[t].shape:
            raise ValueError(f"update({t}, w) takes w, the values read for keys[{t}] (shape {keys[t].shape}), "
                             f"got shape {w.shape}: pass what kv.wait returned for the pull of keys[{t}]")
        g, _ = minibatch_grad(data.idx[batches[t]], data.y[batches[t]], keys[t][:-1], w[:-1])
        spy.log.append({"op": "update", "t": int(t), "staleness": t - w[-1] / kv.cfg.n_workers})
        spy.updates[int(t)] = np.append(-eta * g, 1.0)
        return spy.updates[int(t)].copy()

    loop(spy, [k.copy() for k in keys], update, depend)
    return spy.log


class _NoRangeClock:
    """The servers' range clocks (question ex05_4's merge) are bookkeeping the loop's checks do not
    read: this one keeps nothing, so a slow or wrong merge_clocks cannot change ex05_6's grade."""

    def __init__(self, n_keys, n_nodes):
        self.segments = [(0, int(n_keys), np.zeros(int(n_nodes), dtype=np.int64))]

    def update(self, lo, hi, node, t):
        pass

    def merge(self, other):
        pass

    def __len__(self):
        return len(self.segments)


@contextlib.contextmanager
def _parts_of_other_questions_fixed():
    """The servers of ex05_6's checks keep range clocks (question ex05_4's merge), bookkeeping the
    checks do not read: they keep none here, so a slow or wrong merge_clocks cannot change ex05_6's
    grade. They do route keys and gate reads with the lesson's library, which in the student release
    runs the student's own ring_lookup (ex05_1) and may_read (ex05_2): a correct routing or gate for
    any ring and any tau *is* those answers, so no other copy of them may ship with these checks.
    The statement says ex05_6 builds on them, and a failure names them (:func:`_builds_on`)."""
    from course_lib.ps import kv_server

    saved = vars(kv_server)["RangeClock"]
    vars(kv_server)["RangeClock"] = _NoRangeClock    # looked up at call time, in the module's globals
    try:
        yield
    finally:
        vars(kv_server)["RangeClock"] = saved


def _ps_node_alone(comm, cfg, *args):
    """:func:`course_lib.ps.ps_node` with the parts other questions answer fixed (in this process)."""
    from course_lib.ps import ps_node

    with _parts_of_other_questions_fixed():
        return ps_node(comm, cfg, *args)


@harness
def run_sgd_loop(fn, n_servers, n_workers, iters, latency=0.0, seed=0, replicas=0):
    """The student's loop on ``n_workers`` worker processes and ``n_servers`` sequential servers
    (``tau = 0``; ``replicas`` copies of each key range down a chain), once with ``depend=True`` and
    once with ``depend=False``; each message delayed by ``latency`` seconds (emulated). Returns, per
    run, each worker's task log and the final model."""
    from course_lib import Cluster, Network
    from course_lib.ps import PSConfig, gather_store

    data = loop_data(seed)
    cfg = PSConfig(n_servers=n_servers, n_workers=n_workers, n_keys=data.n_keys + 1, tau=0, replicas=replicas)
    out = []
    with Cluster(cfg.size, timeout=CHECK_TIMEOUT) as c:
        for depend in (True, False):
            res = c.run(_ps_node_alone, cfg, _loop_driver, fn, data, iters, LOOP_BATCH, LOOP_ETA, depend, seed,
                        network=Network(latency=latency) if latency else None)
            with _parts_of_other_questions_fixed():
                w = gather_store(list(res), cfg).ravel()
            out.append({"logs": [r["result"] for r in res[n_servers:]], "w": w})
    return out


def _positions(log, iters):
    """Where in the log each iteration's pull, gradient, push and first wait on its pull are."""
    at = {k: [None] * iters for k in ("pull", "update", "push", "wait")}
    for i, e in enumerate(log):
        n = e.get("n", e.get("t", e.get("pull")))
        if e["op"] == "wait" and n == "all":
            for m in range(iters):
                at["wait"][m] = i if at["wait"][m] is None else at["wait"][m]
        elif e["op"] in at and isinstance(n, int) and 0 <= n < iters and at[e["op"]][n] is None:
            at[e["op"]][n] = i
    return at


def assert_worker_tasks(log, iters, depend, who):
    """One worker's tasks: one pull, gradient and push per iteration, in the order ``depend`` asks for."""
    ops = [e["op"] for e in log]
    for op, what in (("pull", "pull"), ("push", "push"), ("update", "call of update")):
        assert ops.count(op) == iters, (
            f"{who}: {iters} iterations make {iters} {what}s, one per iteration; your loop made {ops.count(op)}.")
    bad = [e for e in log if e["op"] in ("pull", "push") and not e["keys_ok"]]
    assert not bad, (f"{who}: {bad[0]['op']} number {bad[0]['n']} should be of keys[{bad[0]['n']}], "
                     "one per iteration in order.")
    updates = [e["t"] for e in log if e["op"] == "update"]
    assert updates == list(range(iters)), f"{who}: update should be called with t = 0, 1, ..., got {updates}."
    bad = [e for e in log if e["op"] == "push" and not e["values_ok"]]
    assert not bad, f"{who}: push {bad[0]['n']} should send update({bad[0]['n']}, w), what update returned."
    pushes = [e["clock"] for e in log if e["op"] == "push"]
    clock = max([e["clock"] for e in log if e["op"] == "advance"], default=0)
    assert pushes == list(range(iters)) and clock == iters, (
        f"{who}: call kv.advance() once per iteration, right after its push (push t leaves at clock t, and "
        f"the clock ends at {iters}); your pushes left at clocks {pushes}, and the clock ended at {clock}.")
    at = _positions(log, iters)
    pulls = {e["n"]: e for e in log if e["op"] == "pull"}
    for t in range(iters - 1):
        nxt = pulls[t + 1]
        if depend:
            assert t not in nxt["unacked"] and at["pull"][t + 1] > at["push"][t], (
                f"{who}, depend=True: pull {t + 1} left before push {t} was acknowledged. With the dependency "
                f"the next read is a task that waits for the push: kv.pull(keys[{t + 1}], after=[the push's "
                "timestamp]).")
            assert nxt["clock"] == t + 1, (
                f"{who}, depend=True: pull {t + 1} left at clock {nxt['clock']}: advance the clock after push {t} "
                f"and before pull {t + 1}, or the sequential server answers it before the other workers' "
                f"iteration {t} arrives.")
        else:
            assert at["pull"][t + 1] < at["update"][t], (
                f"{who}, depend=False: pull {t + 1} should leave before the gradient of iteration {t} is computed "
                f"(before update({t}, w)), so that its round trip runs during the computation; yours left after.")
            assert at["wait"][t + 1] is None or at["wait"][t + 1] > at["update"][t], (
                f"{who}, depend=False: your loop waited for pull {t + 1} before computing the gradient of "
                f"iteration {t}: wait for it only at the start of iteration {t + 1}, or nothing overlaps.")


def _listed(values):
    return ", ".join(num(v) for v in values)


_BUILDS_ON = (" (ex05_6 runs the parameter server of this lesson, which routes keys with your ring_lookup, "
              "ex05_1, and gates reads with your may_read, ex05_2: if either is wrong, fix it first.)")


def check_sgd_loop(fn, n_servers, n_workers, iters, latency=0.0, seed=0, replicas=0):
    """Both variants of the loop: measured staleness, task order, final model against the baseline.
    A failure says which earlier answers the run builds on."""
    try:
        _check_sgd_loop(fn, n_servers, n_workers, iters, latency, seed, replicas)
    except AssertionError as e:
        raise AssertionError(str(e) + _BUILDS_ON) from None


def _check_sgd_loop(fn, n_servers, n_workers, iters, latency=0.0, seed=0, replicas=0):
    from course_lib.ps.tasks import delayed_sgd

    runs = run_sgd_loop(fn, n_servers, n_workers, iters, latency, seed, replicas)
    data = loop_data(seed)
    setup = f"{n_workers} workers, {n_servers} servers (tau = 0), {iters} iterations"
    for depend, run in zip((True, False), runs):
        delay = 0 if depend else 1
        for k, log in enumerate(run["logs"]):
            who = f"worker {k} ({setup})"
            stale = [e["staleness"] for e in log if e["op"] == "update"]
            want = [0.0] + [float(delay)] * (iters - 1)
            assert np.allclose(stale, want, rtol=0, atol=1e-9), (
                f"{who}, depend={depend}: the reads of iterations 0, 1, ... should miss {_listed(want)} iterations "
                f"of updates, yours missed {_listed(stale)} (measured by a counter every push adds 1 to). "
                + ("With the dependency pull t+1 leaves once push t is acknowledged and the clock says t is done."
                   if depend else "Without it pull t+1 leaves before push t, so it cannot contain iteration t."))
            assert_worker_tasks(log, iters, depend, who)
        w = as_array(run["w"], "the final model", shape=(data.n_keys + 1,))
        want = delayed_sgd(data, n_workers, iters, LOOP_BATCH, LOOP_ETA, delay, seed=seed)
        assert np.allclose(w[:-1], want, rtol=0, atol=1e-12), (
            f"{setup}, depend={depend}: the final model should be that of "
            + ("synchronous SGD" if depend else "SGD delayed by one iteration") + f", but {worst(w[:-1], want, 'w')}.")


@question("ex05_6", points=3, title="A worker's iterations as tasks, with and without the dependency",
          names=("sgd_worker_loop",), builds_on=("ex05_1", "ex05_2"))
def ex05_6(ns):
    """``sgd_worker_loop(kv, keys, update, depend)``: ``len(keys)`` iterations of wait for the read of
    ``keys[t]``, push ``update(t, w)``, ``kv.advance()``; the pull of ``t + 1`` depends on push ``t``
    (``depend``) or leaves before the gradient of ``t``."""
    check_sgd_loop(ns["sgd_worker_loop"], n_servers=2, n_workers=3, iters=6)
