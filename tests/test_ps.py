"""Lesson 05: the parameter server internals (course_lib.ps), against single-process baselines."""
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from course_lib import Cluster, Fault, WorkerError
from course_lib.ps import (
    INF,
    BadRequest,
    HashRing,
    KVWorker,
    PSConfig,
    RangeClock,
    Server,
    check_request,
    gather_store,
    keys_moved,
    kkt_filter,
    logloss,
    make_ctr,
    may_answer_pull,
    merge_clocks,
    modulo_owner,
    ps_node,
    replay,
    ring_lookup,
    significantly_modified,
    slice_request,
    ssp_violations,
    train,
)
from course_lib.ps.join import JoinSide, moving_keys
from course_lib.ps.messages import (
    MESSAGE_TYPES,
    Ack,
    Aggregate,
    Answer,
    Bye,
    Clock,
    CopyBack,
    Delta,
    Done,
    Flush,
    Forward,
    HandoffDone,
    JoinAbort,
    JoinRequest,
    NextTask,
    Precopy,
    Pull,
    Push,
    RangeSum,
    Slice,
    SliceValues,
    Switch,
    Switched,
    TaskFinished,
    UnknownMessage,
    decode,
    encode,
)
from course_lib.ps.scheduler import Scheduler


# ---------------------------------------------------------------- ring and key ranges
def test_ring_lookup_wraps_around():
    points, owners = [10, 20, 30], [7, 8, 9]
    assert ring_lookup(points, owners, 0) == 7 and ring_lookup(points, owners, 10) == 7
    assert ring_lookup(points, owners, 11) == 8 and ring_lookup(points, owners, 30) == 9
    assert ring_lookup(points, owners, 31) == 7                      # past the last point: wrap
    assert list(ring_lookup(points, owners, np.array([5, 25, 99]))) == [7, 9, 7]


@pytest.mark.parametrize("S", [4, 8])
def test_a_join_moves_about_K_over_S_plus_1_keys_a_leave_its_own_modulo_moves_most(S):
    K = 1 << 15
    ring = HashRing(range(S), K, vnodes=64)
    bigger = ring.copy()
    bigger.add(S)
    moved = keys_moved(ring.lookup, bigger.lookup, K)
    assert 0.4 * K / (S + 1) < moved < 2.0 * K / (S + 1)
    # every moved key went to the new server
    k = np.arange(K)
    assert np.all(bigger.lookup(k)[ring.lookup(k) != bigger.lookup(k)] == S)
    naive = keys_moved(modulo_owner(S), modulo_owner(S + 1), K)
    assert naive > 0.8 * K * (1 - 1 / (S + 1)) and naive > 3 * moved
    smaller = ring.copy()
    smaller.remove(0)
    left = keys_moved(ring.lookup, smaller.lookup, K)
    assert left == ring.load()[0]                                  # only server 0's keys move


def test_join_with_one_point_moves_keys_of_one_range_only():
    K = 10_000
    ring = HashRing(range(5), K, vnodes=3)
    new = ring.copy()
    new.add(99, vnodes=1)
    (p,) = new.points[new.owners == 99]
    k = np.arange(K)
    changed = k[ring.lookup(k) != new.lookup(k)]
    assert len(changed) > 0
    assert len(np.unique(ring.arcs(changed))) == 1                 # all from the arc p fell into
    assert np.all(new.lookup(changed) == 99) and changed.max() == p


@pytest.mark.parametrize("seed", range(5))
def test_slices_concatenate_back(seed):
    rng = np.random.default_rng(seed)
    ring = HashRing(range(3), 5000, vnodes=5)
    keys = np.unique(rng.integers(0, 5000, 300))
    vals = rng.standard_normal(2 * len(keys))
    pieces = slice_request(ring.points, keys, vals, val_len=2)
    assert np.array_equal(np.concatenate([p[1] for p in pieces]), keys)
    assert np.array_equal(np.concatenate([p[2] for p in pieces]), vals)
    for arc, ks, _ in pieces:
        assert np.all(ring.arcs(ks) == arc)


@pytest.mark.parametrize("keys, values, match", [
    ([3, 1, 2], None, "sorted"), ([1, 2, 2], None, "duplicate"), ([1, 5, 100], None, "outside"),
    ([-1, 2], None, "outside"), ([1, 2, 3], [1.0, 2.0], "need 3 values"), ([0.5, 1.0], None, "integers")])
def test_bad_requests_are_rejected(keys, values, match):
    with pytest.raises(BadRequest, match=match):
        check_request(keys, values, n_keys=100)


# ---------------------------------------------------------------- vector clocks and filters
@pytest.mark.parametrize("seed", range(4))
def test_range_clock_equals_per_key_clock(seed):
    rng = np.random.default_rng(seed)
    K, n = 200, 3
    rc, other = RangeClock(K, n), RangeClock(K, n)
    per_key = np.zeros((K, n), dtype=int)
    for c in (rc, other):
        for _ in range(30):
            lo, hi = sorted(rng.integers(0, K + 1, 2))
            node, t = int(rng.integers(n)), int(rng.integers(1, 50))
            c.update(lo, hi, node, t)
            per_key[lo:hi, node] = np.maximum(per_key[lo:hi, node], t)
    rc.merge(other)
    assert all(np.array_equal(rc.at(k), per_key[k]) for k in range(K))
    assert len(rc) < K                                           # ranges, not one clock per key
    segs = rc.segments
    assert segs[0][0] == 0 and segs[-1][1] == K and all(a[1] == b[0] for a, b in zip(segs, segs[1:]))


def test_merge_clocks_takes_the_max_on_the_common_refinement():
    a = [(0, 5, np.array([1, 0])), (5, 10, np.array([2, 0]))]
    b = [(0, 3, np.array([0, 4])), (3, 10, np.array([0, 1]))]
    got = merge_clocks(a, b)
    want = [(0, 3, [1, 4]), (3, 5, [1, 1]), (5, 10, [2, 1])]
    assert [(lo, hi, list(v)) for lo, hi, v in got] == want


def test_significantly_modified_loses_nothing():
    rng = np.random.default_rng(0)
    keys = np.arange(50)
    r = rng.standard_normal(50) * 0.01
    k, v, kept = significantly_modified(keys, r, 0.01)
    assert np.all(np.abs(v) > 0.01) and np.all(np.abs(kept) <= 0.01)
    total = kept.copy()
    total[k] += v
    assert np.allclose(total, r)


def test_kkt_filter_drops_only_updates_that_keep_zero():
    from course_lib.ps import soft_threshold
    keys = np.arange(6)
    w = np.array([0, 0, 0, 0.5, 0, -1.0])
    g = np.array([0.05, -0.2, 0.09, 0.01, -0.1, 0.0])
    k, v = kkt_filter(keys, g, w, lam=0.1)
    assert list(k) == [1, 3, 5]
    eta = 0.3
    dropped = np.setdiff1d(keys, k)
    assert np.all(soft_threshold(w[dropped] - eta * g[dropped], eta * 0.1) == 0)


# ---------------------------------------------------------------- messages
def example_messages() -> list:
    """One message of every kind, with payloads like the real ones."""
    keys, values, tag = np.arange(4), np.ones(4), (1, 7, 0)
    pushed = Slice(0, 2, keys, values)
    return [Push(1, 7, 3, [pushed, Slice(1, 0, b"digest!!", values)], 0), Pull(1, 8, 3, [Slice(0, 2, keys, None)], 1),
            Forward(1, 7, 3, [pushed], 0), Aggregate([RangeSum(2, keys, values.reshape(-1, 1), [tag], 3)]),
            Ack(7, [0, 1]), Answer(8, [SliceValues(0, values)]), Clock(1, 4), Flush(), Done(1), JoinRequest(keys),
            Precopy(0, keys, values, {tag}, True), Delta(tag, 3, keys, values), CopyBack(keys, values), Switch(),
            Switched(1), HandoffDone(0), JoinAbort(), Bye(0), NextTask(), TaskFinished(5)]


def test_every_message_kind_has_an_example():
    assert sorted(type(m).__name__ for m in example_messages()) == sorted(t.__name__ for t in MESSAGE_TYPES)
    assert len({t.kind for t in MESSAGE_TYPES}) == len(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", example_messages(), ids=lambda m: type(m).__name__)
def test_a_message_survives_the_wire(msg):
    wire = encode(msg)
    assert wire[0] == msg.kind
    back = decode(pickle.loads(pickle.dumps(wire, protocol=5)))
    assert type(back) is type(msg)
    assert pickle.dumps(encode(back), protocol=5) == pickle.dumps(wire, protocol=5)


def test_a_message_travels_as_the_plain_tuple_of_its_fields():
    """No class names on the wire: the byte counts are those of the payload."""
    keys, values = np.arange(3), np.ones(3)
    push = Push(1, 7, 2, [Slice(0, 5, keys, values)], 0)
    assert pickle.dumps(encode(push), protocol=5) == pickle.dumps(("push", 1, 7, 2, [(0, 5, keys, values)], 0),
                                                                  protocol=5)
    assert encode(Ack(7, [0, 2])) == ("ack", 7, [0, 2]) and encode(JoinAbort()) == ("join_abort",)


@pytest.mark.parametrize("wire", [("hello", 1), (), "push", 42, (7, 1)])
def test_a_wire_object_of_no_known_kind_is_a_clear_error(wire):
    with pytest.raises(UnknownMessage, match="not a parameter-server message"):
        decode(wire)


def test_every_message_type_has_a_handler_at_its_receiver():
    tables = {"server": Server.HANDLERS, "worker": KVWorker.HANDLERS, "scheduler": Scheduler.HANDLERS}
    for kind in MESSAGE_TYPES:
        receivers = [name for name, table in tables.items() if kind in table]
        assert receivers, f"nobody handles {kind.__name__}"
        # the docstring says who sends it to whom; JoinAbort goes to servers and workers alike
        assert len(receivers) == 1 or kind is JoinAbort, (kind.__name__, receivers)
    assert set().union(*tables.values()) == set(MESSAGE_TYPES)
    assert all(callable(h) for table in tables.values() for h in table.values())


class OneMessageComm:
    """A stand-in for a rank's communicator that receives ``wire`` from rank 2 (one process, no Pipes)."""

    def __init__(self, rank, size, wire):
        self.rank, self.size, self.wire = rank, size, wire

    def recv_any(self):
        return 2, self.wire

    def iprobe(self):
        return True


@pytest.mark.parametrize("msg, who", [(Ack(0, [0]), "server 0"), (Switch(), "server 0"), (NextTask(), "server 0")])
def test_a_server_names_the_message_it_has_no_handler_for(msg, who):
    cfg = PSConfig(n_servers=2, n_workers=1, n_keys=100)
    with pytest.raises(UnknownMessage, match=f"{who} has no handler for {type(msg).__name__} messages"):
        Server(OneMessageComm(0, cfg.size, encode(msg)), cfg).run()


def test_a_worker_names_the_message_it_has_no_handler_for():
    cfg = PSConfig(n_servers=2, n_workers=1, n_keys=100)
    kv = KVWorker(OneMessageComm(2, cfg.size, encode(Clock(0, 1))), cfg)
    with pytest.raises(UnknownMessage, match="worker 0 has no handler for Clock messages"):
        kv._handle_one()


def sends_a_stranger(kv):
    kv.comm.send(("hello", 1), 0)


def test_a_server_process_stops_on_a_message_of_no_known_kind():
    cfg = PSConfig(n_servers=2, n_workers=1, n_keys=100)
    with Cluster(cfg.size, timeout=30) as c:
        with pytest.raises(WorkerError, match="not a parameter-server message: \\('hello', 1\\)"):
            c.run(ps_node, cfg, sends_a_stranger)


# ---------------------------------------------------------------- the SSP read gate
@pytest.mark.parametrize("pull_clock, clocks, staleness, allowed", [
    (3, [3, 3, 3], 0, True),        # sequential: every worker has finished iterations 0..2
    (3, [2, 3, 3], 0, False),       # ... but one is still in iteration 2
    (5, [3, 4], 2, True),           # the boundary: slowest clock = t - s
    (5, [2, 4], 2, False),          # one iteration beyond it
    (5, [3, 4], 1, False),
    (5, [9, 7], 0, True),           # the others ahead of the reader
    (9, [0, 0], INF, True),         # eventual: never wait
    (4, [INF, 1], 3, True),         # a finished (or dead) worker, clock inf, holds no one back
    (4, [INF, 0], 3, False),
    (7, [INF, INF], 0, True),       # all finished
    (0, [], 0, True),               # no worker clock at all
])
def test_ssp_gate_lets_a_pull_through_when_the_slowest_clock_is_within_the_bound(pull_clock, clocks, staleness,
                                                                                 allowed):
    assert may_answer_pull(pull_clock, clocks, staleness) is allowed
    assert may_answer_pull(pull_clock, np.array(clocks, dtype=float), staleness) is allowed   # as the server holds them


def test_ssp_gate_and_the_invariant_check_agree():
    for t in range(6):
        for clocks in ([0, 0], [1, 4], [2, INF], [5, 3]):
            for s in (0, 1, 2, INF):
                assert may_answer_pull(t, clocks, s) == (ssp_violations([(t, min(clocks))], s) == [])


# ---------------------------------------------------------------- real processes
def pushes(kv, R, keys, v):
    for _ in range(R):
        kv.push(keys, v)
        kv.advance()
    kv.wait_all()
    return kv.wait(kv.pull(keys))


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_summing_server_R_pushes_then_pull(start_method):
    cfg = PSConfig(n_servers=3, n_workers=2, n_keys=4096, val_len=2, vnodes=3, tau=0)  # the last pull sees all
    keys = np.unique(np.random.default_rng(1).integers(0, 4096, 500))
    v = np.random.default_rng(2).integers(-3, 4, 2 * len(keys)).astype(float)
    with Cluster(cfg.size, start_method=start_method, timeout=60) as c:
        res = c.run(ps_node, cfg, pushes, 4, keys, v)
    for r in res[3:]:
        assert np.array_equal(r["result"], 2 * 4 * v)              # W * R * v, in key order
    w = gather_store(list(res), cfg)
    assert np.array_equal(w[keys].ravel(), 8 * v) and np.count_nonzero(w) == np.count_nonzero(v)
    M = np.asarray(res.stats.messages)
    assert all(M[s, 3:].sum() > 0 for s in range(3))                 # every server answered


def bad_worker(kv):
    errors = []
    for keys, vals in [([5, 3], [1.0, 1.0]), ([1, 1], [1.0, 1.0]), ([1, 9999], [1.0, 1.0]), ([1, 2], [1.0])]:
        try:
            kv.push(keys, vals)
        except BadRequest as exc:
            errors.append(str(exc))
    return errors


def test_bad_input_fails_at_the_worker_before_sending():
    cfg = PSConfig(n_servers=2, n_workers=1, n_keys=1000)
    with Cluster(cfg.size, timeout=30) as c:
        res = c.run(ps_node, cfg, bad_worker)
    assert len(res[2]["result"]) == 4
    M = np.asarray(res.stats.messages)
    assert M[2, :2].tolist() == [1, 1]                              # only the final "done" to each server
    assert res[0]["n_push"] == res[1]["n_push"] == 0


@pytest.fixture(scope="module")
def data():
    return make_ctr(n=3000, n_keys=1 << 17, nnz=30, seed=0)


def test_workers_pull_only_touched_keys(data):
    cfg = PSConfig(n_servers=2, n_workers=2, n_keys=data.n_keys)
    with Cluster(cfg.size, timeout=60) as c:
        r = train(c, data, cfg, iters=15, batch=32, eta=0.5)
    dense = 2 * 15 * data.n_keys * 8
    assert r.pulled_keys * 8 <= r.bytes_server_to_worker < 1.3 * r.pulled_keys * 8 + 20_000
    assert r.bytes_server_to_worker < 0.03 * dense
    assert r.loss < logloss(data, np.zeros(data.n_keys)) - 0.01


@pytest.mark.parametrize("tau", [0, 1, 3])
def test_ssp_invariant_holds_on_every_read(data, tau):
    cfg = PSConfig(n_servers=2, n_workers=3, n_keys=data.n_keys, tau=tau)
    with Cluster(cfg.size, timeout=60) as c:
        for seed in range(3):
            r = train(c, data, cfg, iters=12, batch=16, eta=0.5, seed=seed, work=0.003)
            assert len(r.reads) >= 3 * 12                          # every read recorded, on some server
            assert r.ssp_violations(tau) == []
            if tau == 0:                                           # sequential: nobody reads ahead
                assert all(m >= t for _, t, m, _ in r.reads)


@pytest.mark.timing   # compares measured time with a model: run alone, after the parallel tests
@pytest.mark.slow  # a long scenario: make test, not make test-fast
def test_gate_wait_does_not_grow_with_tau(data):
    cfg = PSConfig(n_servers=2, n_workers=3, n_keys=data.n_keys)
    waits = {}
    with Cluster(cfg.size, timeout=60) as c:
        for tau in (0, 2, INF):
            cfg.tau = tau
            waits[tau] = np.mean([train(c, data, cfg, iters=12, batch=16, eta=0.5, seed=s, work=0.01).gate_wait
                                  for s in range(2)])
    assert waits[INF] < 0.002                                     # eventual: never held back
    assert waits[INF] <= waits[2] * 1.5 + 1e-3 and waits[2] <= waits[0] * 1.5 + 1e-3
    assert waits[0] > 2 * waits[INF]


def test_significantly_modified_filter_saves_traffic(data):
    cfg = PSConfig(n_servers=2, n_workers=2, n_keys=data.n_keys)
    with Cluster(cfg.size, timeout=60) as c:
        full = train(c, data, cfg, iters=15, batch=32, eta=0.5)
        filt = train(c, data, cfg, iters=15, batch=32, eta=0.5, theta=1e-2)
    assert full.pushed_keys == full.unfiltered_keys
    assert filt.pushed_keys < 0.6 * filt.unfiltered_keys
    assert filt.bytes_worker_to_server < 0.8 * full.bytes_worker_to_server
    assert filt.loss < logloss(data, np.zeros(data.n_keys))


def deterministic_pushes(kv, R, n_keys, seed):
    rng = np.random.default_rng(seed * 100 + kv.w)
    for _ in range(R):
        keys = np.unique(rng.integers(0, n_keys, 40))
        kv.wait(kv.pull(keys))
        kv.push(keys, rng.integers(-5, 6, len(keys)).astype(float))
        kv.advance()
    return None


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_killed_server_loses_no_acknowledged_update(start_method):
    cfg = PSConfig(n_servers=3, n_workers=2, n_keys=2000, vnodes=3, replicas=1)
    with Cluster(cfg.size, start_method=start_method, timeout=60, on_failure="continue") as c:
        clean = c.run(ps_node, cfg, deterministic_pushes, 25, cfg.n_keys, 0)
        hurt = c.run(ps_node, cfg, deterministic_pushes, 25, cfg.n_keys, 0, faults={1: Fault("kill", step=12)})
    assert list(hurt.failures) == [1] and hurt[1] is None
    w_clean, w_hurt = gather_store(list(clean), cfg), gather_store(list(hurt), cfg)
    assert np.array_equal(w_hurt, w_clean)                          # same update sequence, same parameters
    assert np.array_equal(w_hurt.ravel(), replay([r["log"] for r in hurt[3:]], cfg.n_keys))
    assert all(1 in r["dead_seen"] for r in hurt[3:])


def test_training_survives_a_killed_server(data):
    cfg = PSConfig(n_servers=3, n_workers=2, n_keys=data.n_keys, replicas=1)
    with Cluster(cfg.size, timeout=60, on_failure="continue") as c:
        r = train(c, data, cfg, iters=20, batch=32, eta=0.5, faults={0: Fault("kill", step=15)})
    assert list(r.failures) == [0]
    logs = [x["log"] for x in r.raw[3:]]
    assert np.allclose(r.w, replay(logs, cfg.n_keys), rtol=0, atol=1e-12)
    assert r.loss < logloss(data, np.zeros(data.n_keys)) - 0.01


def test_without_replicas_a_killed_server_loses_its_ranges():
    cfg = PSConfig(n_servers=3, n_workers=1, n_keys=2000, replicas=0)
    with Cluster(cfg.size, timeout=60, on_failure="continue") as c:
        res = c.run(ps_node, cfg, deterministic_pushes, 10, cfg.n_keys, 0, faults={2: Fault("kill", step=3)})
    assert 2 in res.failures
    with pytest.raises(RuntimeError, match="lost"):
        gather_store(list(res), cfg)


@pytest.mark.parametrize("seed", [0, 1])
def test_tau_zero_equals_the_sequential_baseline(data, seed):
    from course_lib.ps import sequential_lr
    cfg = PSConfig(n_servers=2, n_workers=3, n_keys=data.n_keys, tau=0)
    with Cluster(cfg.size, timeout=60) as c:
        r = train(c, data, cfg, iters=12, batch=32, eta=0.5, seed=seed, work=0.002)
        loose = PSConfig(n_servers=2, n_workers=3, n_keys=data.n_keys, tau=INF)
        e = train(c, data, loose, iters=12, batch=32, eta=0.5, seed=seed, work=0.002)
    w = sequential_lr(data, 3, 12, 32, 0.5, seed=seed)
    assert np.allclose(r.w, w, rtol=0, atol=1e-12)
    assert np.abs(e.w - w).max() > 1e-9                           # eventual: reads differ, so do the weights


def test_key_caching_sends_each_key_list_once(data):
    runs = {}
    with Cluster(5, timeout=60) as c:
        for cache in (False, True):
            cfg = PSConfig(n_servers=2, n_workers=3, n_keys=data.n_keys, tau=0, key_cache=cache)
            runs[cache] = train(c, data, cfg, iters=10, batch=32, eta=0.5)
    plain, cached = runs[False], runs[True]
    assert np.allclose(plain.w, cached.w, rtol=0, atol=1e-12)      # same run (up to summation order), fewer bytes
    key_bytes = plain.pulled_keys * 8                               # each push repeats its pull's keys
    saved = plain.bytes_worker_to_server - cached.bytes_worker_to_server
    assert 0.8 * key_bytes < saved < 1.05 * key_bytes


def test_scheduler_reassigns_a_dead_workers_data(data):
    cfg = PSConfig(n_servers=2, n_workers=2, n_keys=data.n_keys, scheduler=True, n_tasks=6)
    with Cluster(cfg.size, timeout=60, on_failure="continue") as c:
        r = train(c, data, cfg, iters=3, batch=16, eta=0.5, faults={2: Fault("kill", step=4)})
    sched = r.raw[cfg.scheduler_rank]
    assert list(r.failures) == [2] and sched["lost"] == [2]
    assert sorted(sched["done_by"]) == list(range(6))              # every block of data was trained on
    assert all(w == 3 for w in sched["done_by"].values() if w != 2)
    assert [t for t, w in sched["reassigned"]] and all(w == 2 for _, w in sched["reassigned"])
    back = {t for t, _ in sched["reassigned"]}
    assert all(sched["done_by"][t] == 3 for t in back)             # the survivor did the dead worker's part


JOIN_ROUNDS = 40


def pushes_through_join(kv, R, n_keys, seed):
    """``deterministic_pushes`` for at least R rounds, and on until the join has settled (switched,
    abandoned or joiner dead), so that the join happens during training however slow the machine is."""
    rng = np.random.default_rng(seed * 100 + kv.w)
    rounds = 0
    while rounds < R or not kv.join_settled:
        keys = np.unique(rng.integers(0, n_keys, 40))
        kv.wait(kv.pull(keys))
        kv.push(keys, rng.integers(-5, 6, len(keys)).astype(float))
        kv.advance()
        rounds += 1
    return rounds


def _join_cfg(n_servers=3, replicas=0, **kw):
    return PSConfig(n_servers=n_servers, n_workers=2, n_keys=2000, vnodes=3, joiner=n_servers - 1, join_at=8,
                    join_vnodes=1, replicas=replicas, **kw)


def _assert_no_update_lost(cfg, res):
    """Final parameters equal the single-process replay of every push the workers made."""
    w = gather_store(list(res), cfg)
    assert np.array_equal(w.ravel(), replay([r["log"] for r in res[cfg.n_servers:]], cfg.n_keys))
    return w


def _assert_every_copy_agrees(cfg, res, w):
    """Chain replication in the new ring: every live member of a range's chain holds the same values."""
    ring = cfg.final_ring()
    arcs = ring.arcs(np.arange(cfg.n_keys))
    dead = {r for r in range(cfg.n_servers) if res[r] is None}
    for a in range(len(ring.points)):
        for s in ring.chain(a, cfg.replicas, dead):
            assert np.array_equal(res[s]["store"][arcs == a], w[arcs == a]), (a, s)


@pytest.mark.slow  # a long scenario: make test, not make test-fast
@pytest.mark.parametrize("n_servers,replicas", [(3, 0), (3, 1), (4, 2)])
def test_a_server_joins_in_two_phases_and_then_serves(n_servers, replicas):
    cfg = _join_cfg(n_servers, replicas)
    J = cfg.joiner
    with Cluster(cfg.size, timeout=60) as c:
        res = c.run(ps_node, cfg, pushes_through_join, JOIN_ROUNDS, cfg.n_keys, 1)
    j = res[J]["join"]
    assert j["requested"] and j["switched"] and not j["aborted"]
    assert all(r["epoch"] == 1 for r in res[n_servers:])           # every worker moved to the new ring
    w = _assert_no_update_lost(cfg, res)
    _assert_every_copy_agrees(cfg, res, w)
    assert res[J]["n_push"] > 0                                     # ... and the joiner served its pushes
    holds = moving_keys(cfg)
    assert j["precopy_keys"] == holds.sum()                         # phase 1 copied exactly the keys it holds
    before, after = cfg.ring(), cfg.final_ring()
    k = np.arange(cfg.n_keys)
    moved = k[before.lookup(k) != after.lookup(k)]
    assert np.all(after.lookup(moved) == J) and len(np.unique(before.arcs(moved))) == 1   # one range changed owner
    # the snapshot crossed the wire: at least 8 bytes per copied key went from the donors to the joiner
    donors = sorted(set(before.lookup(np.flatnonzero(holds)).tolist()))
    assert sum(res.stats.bytes[d, J] for d in donors) >= 8 * j["precopy_keys"]
    assert res[J]["reads"]                                          # and, after the hand-off, its reads


def _joiner_alone(cfg, dead=()):
    """The joiner's side of a join in this process: its messages are recorded in ``J.sent``."""
    J = SimpleNamespace(me=cfg.joiner, store=np.zeros((cfg.n_keys, 1)), dead=set(dead), done=np.zeros(2, bool),
                        applied=set(), sent=[])
    J.send = lambda msg, dest: J.sent.append((msg, dest)) or True
    J.write = lambda k, v, clock: np.add.at(J.store, k, v)
    return J, JoinSide(J, cfg, cfg.rings())


def test_the_joiner_counts_each_update_once_across_snapshot_chunks_and_deltas():
    """Single process, fixed order: a donor streams two chunks while updates keep coming."""
    cfg = _join_cfg(3, replicas=0)
    keys = np.flatnonzero(moving_keys(cfg))[:4]
    a, c = keys[:2], keys[2:]
    J, side = _joiner_alone(cfg)
    side.owed = {0}
    u = {i: ((0, i, 0), np.full((4, 1), 10.0 ** (i - 1))) for i in (1, 2, 3, 4)}   # u1 = 1, u2 = 10, ...
    # u1 came before the join began (no delta); u2 after it, before chunk 1; u3 between the chunks; u4 after
    side.on_delta(u[2][0], 0, keys, u[2][1])
    side.on_precopy(0, a, np.full((2, 1), 11.0), {u[1][0], u[2][0]}, False)
    side.on_delta(u[3][0], 0, keys, u[3][1])
    side.on_delta(u[3][0], 0, keys, u[3][1])                 # the same delta again: counted once
    side.on_precopy(0, c, np.full((2, 1), 111.0), {u[3][0]}, True)
    assert side.stats["switched"]
    side.on_delta(u[4][0], 0, keys, u[4][1])
    side.on_delta(u[4][0], 0, keys, u[4][1])                 # re-sent after the switch: once
    assert np.array_equal(J.store[keys].ravel(), [1111.0] * 4)


def test_the_joiner_judges_a_delta_by_the_snapshot_of_the_keys_it_touches():
    """A tag in one donor's snapshot says nothing about another donor's keys; and an update that a
    new head passes on after the old one died is not added to keys whose snapshot already had it."""
    cfg = _join_cfg(3, replicas=1)
    keys = np.flatnonzero(moving_keys(cfg))
    A, B = keys[:3], keys[-3:]
    J, side = _joiner_alone(cfg)
    side.owed = {0, 1}
    u5, u6 = (1, 5, 0), (1, 6, 0)
    side.on_precopy(0, A, np.full((3, 1), 6.0), {u5, u6}, True)       # donor 0 had applied u5 (1) and u6 (5)
    side.on_precopy(1, B, np.zeros((3, 1)), set(), True)              # donor 1 had applied neither
    assert side.stats["switched"]
    side.on_delta(u5, 0, B, np.ones((3, 1)))                          # donor 1 applies u5 on its keys now
    side.on_delta(u6, 0, A, np.full((3, 1), 5.0))                     # re-sent u6 reaches a new head of A
    assert np.array_equal(J.store[A].ravel(), [6.0] * 3) and np.array_equal(J.store[B].ravel(), [1.0] * 3)


def test_a_join_with_a_range_already_lost_is_abandoned_and_everyone_hears_it():
    cfg = _join_cfg(3, replicas=0)
    J, side = _joiner_alone(cfg, dead={_donors(cfg)[0]})
    sent = J.sent
    side.on_clock(np.array([cfg.join_at - 1.0, 0.0]))
    assert not side.stats["requested"] and not sent                  # not yet
    side.on_clock(np.array([cfg.join_at, 0.0]))
    assert side.stats["aborted"] and not side.stats["switched"]
    live = sorted(set(range(cfg.size)) - J.dead - {cfg.joiner})
    assert sorted(dest for msg, dest in sent if isinstance(msg, JoinAbort)) == live


@pytest.mark.parametrize("replicas", [0, 1])
def test_a_snapshot_in_small_chunks_interleaved_with_training_loses_nothing(replicas):
    cfg = _join_cfg(3, replicas, precopy_chunk=32)
    with Cluster(cfg.size, timeout=60) as c:
        res = c.run(ps_node, cfg, pushes_through_join, JOIN_ROUNDS, cfg.n_keys, 2)
    assert res[cfg.joiner]["join"]["switched"]
    heads = cfg.ring().lookup(np.flatnonzero(moving_keys(cfg)))
    for d in _donors(cfg):                                          # every chunk was a message of its own
        assert res.stats.messages[d, cfg.joiner] >= -(-np.sum(heads == d) // 32) > 1
    w = _assert_no_update_lost(cfg, res)
    _assert_every_copy_agrees(cfg, res, w)


def _donors(cfg):
    return sorted(set(cfg.ring().lookup(np.flatnonzero(moving_keys(cfg))).tolist()))


def _join_with_a_kill(cfg, rank, fault):
    """A join run in which ``rank`` is killed by ``fault``; the others carry on."""
    with Cluster(cfg.size, timeout=60, on_failure="continue") as c:
        res = c.run(ps_node, cfg, pushes_through_join, JOIN_ROUNDS, cfg.n_keys, 1, faults={rank: fault})
    assert list(res.failures) == [rank]
    return res


def test_a_donor_dying_before_its_snapshot_abandons_the_join_and_loses_nothing():
    cfg = _join_cfg(3, replicas=1)
    res = _join_with_a_kill(cfg, _donors(cfg)[0], Fault("kill", 0, label="join_req"))
    j = res[cfg.joiner]["join"]
    assert j["requested"] and j["aborted"] and not j["switched"]
    assert all(r["epoch"] == 0 for r in res[cfg.n_servers:])       # nobody moved: the old ring carries on
    _assert_no_update_lost(cfg, res)


@pytest.mark.parametrize("when", ["first snapshot", "after the switch"])
def test_the_joiner_dying_loses_no_update(when):
    cfg = _join_cfg(3, replicas=1)
    fault = Fault("kill", 0, label="precopy") if when == "first snapshot" else Fault("kill", 5, label="apply")
    res = _join_with_a_kill(cfg, cfg.joiner, fault)
    epochs = [r["epoch"] for r in res[cfg.n_servers:]]
    assert epochs == ([0, 0] if when == "first snapshot" else [1, 1])
    w = _assert_no_update_lost(cfg, res)
    if when == "after the switch":
        assert all(cfg.joiner in r["dead_seen"] for r in res[cfg.n_servers:])
        _assert_every_copy_agrees(cfg, res, w)


def test_a_donor_dying_during_the_hand_off_loses_no_update():
    """Killed when the first worker tells it that it switched: the other worker may still be
    sending it old-ring requests, which it must re-send to the next copy."""
    cfg = _join_cfg(3, replicas=1)
    res = _join_with_a_kill(cfg, _donors(cfg)[0], Fault("kill", 0, label="switched"))
    assert res[cfg.joiner]["join"]["switched"]
    _assert_no_update_lost(cfg, res)


@pytest.mark.parametrize("bad", [dict(tau=0), dict(updater="l1"), dict(replicate="aggregate"), dict(joiner=7)])
def test_join_config_limits_are_clear_errors(bad):
    kw = dict(n_servers=3, n_workers=2, joiner=2, replicas=1)
    kw.update(bad)
    with pytest.raises(ValueError, match="join"):
        PSConfig(**kw)


def test_value_compression_is_lossless_and_saves_bytes():
    cfg = PSConfig(n_servers=2, n_workers=2, n_keys=4000, tau=0)
    keys = np.arange(0, 4000, 2)
    v = np.zeros(len(keys))
    v[::50] = 1.0                                                   # mostly zeros, as sparse updates are
    with Cluster(cfg.size, timeout=60) as c:
        plain = c.run(ps_node, cfg, pushes, 3, keys, v)
        cfg.compress = True
        packed = c.run(ps_node, cfg, pushes, 3, keys, v)
    for r in packed[2:]:
        assert np.array_equal(r["result"], 2 * 3 * v)
    assert np.array_equal(gather_store(list(packed), cfg), gather_store(list(plain), cfg))
    assert packed.stats.total_bytes < 0.6 * plain.stats.total_bytes


@pytest.mark.parametrize("fault", [False, True])
def test_replication_after_aggregation_saves_traffic_and_loses_nothing(fault):
    base = dict(n_servers=3, n_workers=2, n_keys=2000, vnodes=3, replicas=1)
    with Cluster(5, timeout=60, on_failure="continue") as c:
        each = c.run(ps_node, PSConfig(**base), deterministic_pushes, 20, 2000, 0)
        cfg = PSConfig(**base, replicate="aggregate", aggregate_every=4)
        faults = {0: Fault("kill", step=15)} if fault else None
        batched = c.run(ps_node, cfg, deterministic_pushes, 20, 2000, 0, faults=faults)
    assert list(batched.failures) == ([0] if fault else [])
    w_each, w_batched = gather_store(list(each), cfg), gather_store(list(batched), cfg)
    assert np.array_equal(w_batched, w_each)
    assert np.array_equal(w_batched.ravel(), replay([r["log"] for r in batched[3:]], 2000))
    if not fault:
        def between_servers(res):
            return int(np.asarray(res.stats.messages)[:3, :3].sum())
        assert between_servers(batched) < 0.5 * between_servers(each)


# ---------------------------------------------------------------- parameter server or ring allreduce
from course_lib.ps.crossover import (  # noqa: E402
    KEY_BYTES,
    VALUE_BYTES,
    Workload,
    compare,
    crossover_density,
    minibatch,
    ps_step_bytes,
    ps_traffic,
    ring_step_bytes,
)
from course_lib.ps.tasks import delayed_sgd, prefetch_worker  # noqa: E402
from course_lib.runtime import registry  # noqa: E402


@pytest.mark.parametrize("p, share", [(2, 0.5), (3, 0.635), (4, 0.1), (8, 1.0)])
def test_the_crossover_density_is_where_the_two_byte_formulas_meet(p, share):
    n = 10_000
    d = crossover_density(p, share, KEY_BYTES, VALUE_BYTES)
    assert ps_step_bytes(d * n, p, share) == pytest.approx(ring_step_bytes(n, p), rel=1e-12)
    assert ps_step_bytes(0.9 * d * n, p, share) < ring_step_bytes(n, p) < ps_step_bytes(1.1 * d * n, p, share)


def test_a_minibatch_touches_exactly_the_keys_it_names():
    work = Workload(n_keys=1000, touched=37, batch=8)
    keys, idx, y = minibatch(work, worker=1, step=2)
    assert len(keys) == 37 and np.array_equal(np.unique(idx), keys)
    assert all(len(set(row)) == len(row) for row in idx.tolist())          # no key twice in one example
    assert set(y.tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("density", [0.001, 0.05, 0.4, 1.0])
def test_ps_and_ring_bytes_match_the_formulas_exactly(cluster5, density):
    """The counters against the protocol, message by message (PS) and against lesson 02's exact ring
    row; the arrays of the PS against 2 k (b_key + b_val) per worker and step; the same model both ways."""
    cfg = PSConfig(n_servers=2, n_workers=3, n_keys=4096, tau=0)
    work = Workload(cfg.n_keys, max(1, round(density * cfg.n_keys)), steps=2)
    c = compare(cluster5, cfg, work)
    want = ps_traffic(cfg, work)
    assert np.array_equal(c.ps_matrix, want.total)
    for w in range(3):                                           # a worker's arrays, sent + received
        r = cfg.worker_rank(w)
        assert want.arrays[r].sum() + want.arrays[:, r].sum() == 2 * work.touched * 16 * work.steps
    for s in range(2):                                           # a server's: its share of every worker's keys
        mine = sum(int(np.sum(cfg.ring().lookup(minibatch(work, w, t)[0]) == s))
                   for w in range(3) for t in range(work.steps))
        assert want.arrays[s].sum() + want.arrays[:, s].sum() == 2 * mine * 16
    sent, _ = registry.lookup("allreduce", "ring").traffic(3, cfg.n_keys, VALUE_BYTES, 0, 1)
    per_rank = [sent[i] + sent[(i - 1) % 3] for i in range(3)]   # rank i receives what i - 1 sends
    assert c.ring_bytes == max(per_rank)                           # per step, at the busiest worker
    assert np.array_equal(c.ring_matrix[2:, 2:].sum(1), sent * work.steps)
    assert np.allclose(c.ps_w, c.ring_w, rtol=0, atol=1e-12) and np.any(c.ps_w != 0)


def test_a_pull_after_a_push_sees_it():
    def pull_after(kv):
        keys = np.arange(3) + 10 * kv.w
        pushed = kv.push(keys, np.ones(3))
        return kv.wait(kv.pull(keys, after=[pushed]))

    cfg = PSConfig(n_servers=2, n_workers=2, n_keys=100)
    with Cluster(cfg.size, timeout=30) as c:
        res = c.run(ps_node, cfg, pull_after)
    assert all(np.array_equal(r["result"], np.ones(3)) for r in res[2:])


@pytest.mark.parametrize("depend, delay", [(True, 0), (False, 1)])
def test_the_dependency_gives_synchronous_sgd_and_its_absence_a_delay_of_one(cluster5, depend, delay):
    data = make_ctr(n=600, n_keys=2048, nnz=10, seed=3)
    cfg = PSConfig(n_servers=2, n_workers=3, n_keys=data.n_keys + 1, tau=0)
    res = cluster5.run(ps_node, cfg, prefetch_worker, data, 6, 16, 0.5, depend)
    w = gather_store(list(res), cfg).ravel()
    assert np.allclose(w[:-1], delayed_sgd(data, 3, 6, 16, 0.5, delay), rtol=0, atol=1e-12)
    assert not np.allclose(w[:-1], delayed_sgd(data, 3, 6, 16, 0.5, 1 - delay), rtol=0, atol=1e-6)
    assert w[-1] == 3 * 6                                               # the counter key: every push once
    for r in res[2:]:
        out = r["result"]
        assert out["staleness"] == [0.0] + [float(delay)] * 5
        sent = {(e.what, e.iteration): e.time for e in out["events"]}
        for t in range(5):                                              # pull(t+1) against push(t)
            assert (sent["pull sent", t + 1] > sent["push sent", t]) == depend
