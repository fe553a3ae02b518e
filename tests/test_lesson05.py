"""Lesson 05: what the notebook says about its own run holds on the run's numbers.

The notebook is executed headless once (shared with tests/test_notebooks.py); its variables
are read back and each sentence of its text that describes them is checked here. Counts and
bytes are checked exactly; timing only as ratios within the same run, with wide margins.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from course_lib.ps import INF, PSConfig, RangeClock, logloss, slice_request
from course_lib.ps.crossover import (
    crossover_density,
    measured_crossover,
    ps_step_bytes,
    ps_step_seconds,
    ps_traffic,
    ring_step_bytes,
    ring_step_seconds,
)
from course_lib.ps.join import moving_keys
from course_lib.ps.tasks import delayed_sgd

from common import LOADED_BUDGET_S, NOTEBOOKS, line

NOTEBOOK = NOTEBOOKS / "05_parameter_server_internals.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]



def test_runs_headless_without_errors_within_the_budget(ran):
    assert ran.errors == []
    assert ran.seconds < LOADED_BUDGET_S, f"lesson 05 took {ran.seconds:.0f} s (budget {LOADED_BUDGET_S:g} s)"


# ---------------------------------------------------------------- 1. keys and ranges
def test_slices_concatenate_back_and_a_pull_returns_every_push(ran):
    v = ran.values
    assert "the slices concatenate back to the request: True" in ran.printed
    assert np.array_equal(np.concatenate(v["pieces"]), v["request"])
    assert np.array_equal(v["got"], 8 * v["v"])                                   # 2 workers x 4 pushes
    assert "pull == 2 * 4 * v: True" in ran.printed
    assert "sorted" in v["err"]


# ---------------------------------------------------------------- 2. sparse logistic regression
def test_workers_pull_only_the_keys_they_touch(ran):
    v = ran.values
    run, K = v["run"], v["K"]
    assert v["dense"] == 3 * 30 * K * 8
    assert run.pulled_keys * 8 <= run.bytes_server_to_worker < v["dense"] / 10
    assert f"pulled keys per minibatch: {run.pulled_keys / 90:.0f} of {K}" in ran.printed
    assert run.loss < np.log(2) - 0.05                     # the loss of w = 0 is log 2 = 0.6931
    assert f"log loss: {np.log(2):.4f} -> {run.loss:.4f}" in ran.printed


def test_key_caching_saves_about_the_pushes_key_lists(ran):
    v = ran.values
    run, cached = v["run"], v["cached"]
    assert run.pushed_keys == run.pulled_keys == cached.pulled_keys         # every push repeats its pull's keys
    assert v["saved"] == run.bytes_worker_to_server - cached.bytes_worker_to_server
    key_bytes = run.pushed_keys * 8
    assert abs(v["saved"] - key_bytes) < 0.05 * key_bytes                  # "about the size of the key lists"
    assert f"{v['saved']:,} saved; the pushes' key lists: {key_bytes:,} bytes" in ran.printed


def test_compression_line_counts_the_first_pulls(ran):
    v = ran.values
    packed, run = v["packed"], v["run"]
    logs = [k for x in packed.raw[2:5] for k, _ in x["log"]]
    assert all(k.dtype == np.int64 for k in logs)
    assert v["first_pulls"] == len(np.unique(np.concatenate(logs)))
    assert packed.bytes_server_to_worker < run.bytes_server_to_worker
    assert (f"at least {v['first_pulls']:,} of the {packed.pulled_keys:,} pulled weights were 0"
            in ran.printed)


# ---------------------------------------------------------------- 3. consistency
def test_the_ssp_invariant_holds_on_every_read(ran):
    v = ran.values
    for tau, r in v["runs"].items():
        assert len(r.reads) == 3 * 30 * 2                    # every read recorded: each pull reaches both servers
        lags = [t - m for _, t, m, _ in r.reads]
        assert r.ssp_violations(tau) == []
        assert max(lags) <= tau                              # "no read lags more than tau"
        label = "sequential" if tau == 0 else "eventual" if tau == INF else f"bounded delay {tau}"
        row = line(ran, label)
        assert "SSP violations 0" in row and f"largest lag {max(lags):2.0f}" in row
    assert max(t - m for _, t, m, _ in v["runs"][0].reads) == 0   # sequential: nobody reads ahead


def test_the_printed_waiting_and_loss_verdicts_are_the_runs(ran):
    v = ran.values
    waits = [v["runs"][t].gate_wait for t in v["taus"]]
    losses = [v["runs"][t].loss for t in v["taus"]]
    assert waits == v["waits"] and losses == v["losses"]
    fell = all(a > b for a, b in zip(waits, waits[1:]))
    assert line(ran, "on this run: the mean gate wait").endswith(f"it fell at every step of tau: {fell}")
    assert f"a spread of {max(losses) - min(losses):.1e}" in ran.printed
    # "sequential reads wait far longer at the gate than eventual ones": same run, wide margin
    assert waits[0] > 3 * waits[-1]
    # "compare the spread of the final losses with the difference in waiting" (small: under 1 %)
    assert max(losses) - min(losses) < 0.01 * min(losses)


# ---------------------------------------------------------------- vector clocks
def test_the_vector_clock_is_what_the_pushes_imply(ran):
    """Rebuild server 0's clock from the workers' push logs: each push of iteration t (from 1) marks
    the span [first key, last key + 1) of each slice server 0 heads with t for its worker."""
    v = ran.values
    r, K = v["runs"][2], v["K"]
    ring = PSConfig(n_servers=2, n_workers=3, n_keys=K, tau=2).ring()
    clock = RangeClock(K, 3)
    for w in range(3):
        log = r.raw[2 + w]["log"]
        assert len(log) == 30                             # one push per iteration (no filter)
        for t, (keys, _) in enumerate(log, start=1):
            for arc, ks, _ in slice_request(ring.points, keys):
                if ring.owners[arc] == 0 and len(ks):
                    clock.update(int(ks[0]), int(ks[-1]) + 1, w, t)
    got = r.raw[0]["vclock"]                              # server 0's clock
    assert [(lo, hi, vec.tolist()) for lo, hi, vec in got] == [(lo, hi, vec.tolist()) for lo, hi, vec in clock.segments]
    assert got[0][0] == 0 and got[-1][1] == K and all(a[1] == b[0] for a, b in zip(got, got[1:]))
    n = len(got)
    assert f"server 0's clock: {n} segments = {5 * n} numbers" in ran.printed
    assert 5 * n < K * 3 / 100                            # "stays small"


def test_the_clock_segments_shown_are_read_correctly(ran):
    v = ran.values
    for lo, hi, vec in (v["widest"], v["uneven"]):
        said = ", ".join(f"worker {i} in its iteration {t}" for i, t in enumerate(vec.tolist()))
        want = f"keys [{lo:,}, {hi:,}) ({hi - lo:,} keys): {vec.tolist()}: last covered by a push of {said}"
        assert want in ran.printed
        assert 1 <= vec.min() and vec.max() <= 30
    assert len(set(v["uneven"][2].tolist())) == 3


# ---------------------------------------------------------------- 4. filters
def test_filters_cut_entries_more_than_bytes_and_theta_costs_loss(ran):
    v = ran.values
    filt, thetas = v["filt"], v["thetas"]
    full = filt[0.0]
    assert full.pushed_keys == full.unfiltered_keys
    for th in thetas[1:]:
        r = filt[th]
        assert r.unfiltered_keys == full.unfiltered_keys
        assert r.pushed_keys / r.unfiltered_keys < r.bytes_worker_to_server / full.bytes_worker_to_server < 1
    pushed = [filt[t].pushed_keys for t in thetas]
    loss = [filt[t].loss for t in thetas]
    assert pushed == sorted(pushed, reverse=True)
    assert loss == sorted(loss)                              # "the final loss rises with theta"


def test_kkt_line_states_the_measured_saving_and_change(ran):
    v = ran.values
    no_kkt, no_kkt2, kkt = v["no_kkt"], v["no_kkt2"], v["kkt"]
    assert no_kkt.pushed_keys == no_kkt2.pushed_keys == kkt.unfiltered_keys
    assert kkt.pushed_keys < 0.2 * no_kkt.pushed_keys              # "saved most push entries"
    saved = no_kkt.bytes_worker_to_server - kkt.bytes_worker_to_server
    assert saved == v["kkt_saved"] > 0
    assert (kkt.pushed_keys / no_kkt.pushed_keys) < kkt.bytes_worker_to_server / no_kkt.bytes_worker_to_server
    assert f"saved {saved:,} bytes" in ran.printed
    assert f"{kkt.pulled_keys * 8:,} of those it still sent are the keys of its pull requests" in ran.printed
    assert kkt.pulled_keys * 8 < kkt.bytes_worker_to_server
    d_filter, d_again = kkt.loss - no_kkt.loss, no_kkt2.loss - no_kkt.loss
    assert (d_filter, d_again) == (v["d_filter"], v["d_again"])
    assert line(ran, "final loss with the filter minus without") == (
        f"final loss with the filter minus without: {d_filter:+.1e}; two runs without it differ by {d_again:+.1e}")
    assert f"weights that differ from the unfiltered run: {np.sum(kkt.w != no_kkt.w)} with the filter" in ran.printed
    # "the l1 runs end higher than the others: ... the few hundred nonzero weights"
    for r in (no_kkt, no_kkt2, kkt):
        assert r.loss > v["filt"][0.0].loss and 100 <= np.count_nonzero(r.w) < 1000
    assert "cost nothing" not in ran.markdown


# ---------------------------------------------------------------- 7. tasks and dependencies
def test_the_dependency_buys_fresh_reads_and_the_synchronous_model(ran):
    v = ran.values
    tasks, data, iters = v["tasks"], v["task_data"], v["iters"]
    assert sorted(tasks[True]["stale"]) == [0.0] * 3 * iters              # every read of every worker fresh
    assert sorted(tasks[False]["stale"]) == [0.0] * 3 + [1.0] * 3 * (iters - 1)   # all but the first: one old
    sync, delayed = delayed_sgd(data, 3, iters, 32, 0.5, 0), delayed_sgd(data, 3, iters, 32, 0.5, 1)
    assert np.allclose(tasks[True]["w"], sync, rtol=0, atol=1e-12)
    assert np.allclose(tasks[False]["w"], delayed, rtol=0, atol=1e-12)
    apart = np.abs(tasks[False]["w"] - sync).max()
    assert apart == v["apart"] > 1e-6                                      # "a different run"
    assert line(ran, "with the dependency the final model") == (
        "with the dependency the final model is synchronous SGD's: True; without it, SGD delayed by one "
        f"iteration: True (it differs from synchronous SGD by up to {apart:.1e})")
    for depend, name in ((True, "with the dependency"), (False, "without it (overlap)")):
        t = tasks[depend]
        assert line(ran, f"{name:21s}:") == (
            f"{name:21s}: staleness of the reads {min(t['stale']):.0f}..{max(t['stale']):.0f}, "
            f"{1000 * t['step']:.1f} ms per iteration (model {1000 * v['model_step'][depend]:.1f} ms), "
            f"log loss {logloss(data, t['w']):.4f}")


def test_the_timeline_shows_the_pull_waiting_for_the_push(ran):
    """With the dependency every pull(t+1) leaves after push(t); without it, before."""
    for depend, t in ran.values["tasks"].items():
        for r in t["res"][2:]:
            sent = {(e.what, e.iteration): e.time for e in r["result"]["events"]}
            n = ran.values["iters"]
            assert all((sent["pull sent", i + 1] > sent["push sent", i]) == depend for i in range(n - 1))


def test_the_overlap_buys_time_and_the_models_are_lower_bounds(ran):
    v = ran.values
    tasks, model = v["tasks"], v["model_step"]
    speedup = tasks[True]["step"] / tasks[False]["step"]
    assert speedup == v["speedup"] > 1.1                                   # model 3.0x; wide margin
    assert line(ran, "the overlap made an iteration") == (
        f"the overlap made an iteration {speedup:.1f}x faster (model {model[True] / model[False]:.1f}x)")
    assert all(tasks[d]["step"] > 0.9 * model[d] for d in (True, False))  # "the measured times sit above them"


# ---------------------------------------------------------------- 8. parameter server or allreduce
def test_the_byte_crossover_is_measured_where_the_formula_puts_it(ran):
    v = ran.values
    cfg, points, n, p, share = v["cross_cfg"], v["points"], v["n"], v["p"], v["share"]
    assert share == max(cfg.ring().load().values()) / n
    for c in points:                                                       # the counters, message by message
        assert np.array_equal(c.ps_matrix, ps_traffic(cfg, c.work).total)
        assert np.allclose(c.ps_w, c.ring_w, rtol=0, atol=1e-12)
    predicted = crossover_density(p, share, 8, 8)
    measured = measured_crossover(v["densities"], v["ps_bytes"], v["ring_bytes"])
    assert (predicted, measured) == (v["predicted"], v["measured"])
    assert abs(measured / predicted - 1) < 0.05                           # "where the formula puts it"
    assert line(ran, "bytes at the busiest rank") == (
        f"bytes at the busiest rank: predicted crossover d* = {predicted:.3f}, measured {measured:.3f}")
    d = np.array(v["densities"])
    below, above = v["ps_bytes"][d < measured] < v["ring_bytes"][d < measured], \
        v["ring_bytes"][d > measured] < v["ps_bytes"][d > measured]
    assert below.all() and above.all() and below.size and above.size
    assert line(ran, "below it the parameter server") == (
        "below it the parameter server moved fewer bytes at every density measured: True; above it the ring did: True")
    assert np.all(v["ring_bytes"] == v["ring_bytes"][0])                   # "whatever the density"
    assert abs(v["ring_bytes"][0] / ring_step_bytes(n, p) - 1) < 1e-3
    # "at the sparsest densities the measured PS bytes sit above the model" (the envelopes)
    assert v["ps_bytes"][0] > 2 * ps_step_bytes(v["touched"][0], p, share)
    agree = max(np.abs(c.ps_w - c.ring_w).max() for c in points)
    assert line(ran, "the parameter server and the ring trained").startswith(
        f"the parameter server and the ring trained the same model at every density: True (largest difference "
        f"{agree:.1e})")


def test_the_time_lines_are_the_runs(ran):
    v = ran.values
    n, p, share, wan, d = v["n"], v["p"], v["share"], v["wan"], v["densities"]
    ps_ms, ring_ms = v["ps_ms"], v["ring_ms"]
    fine = np.geomspace(1e-3, 1, 400)
    model = measured_crossover(fine, ps_step_seconds(fine * n, p, share, wan),
                               np.full(400, ring_step_seconds(n, p, wan)))
    assert line(ran, "time per step (emulated network)") == (
        f"time per step (emulated network): crossover at d = {measured_crossover(d, ps_ms, ring_ms):.2f} measured, "
        f"{model:.2f} in the model")
    ratio = ps_ms[-1] / ring_ms[-1]
    assert ratio > 1.3                                                     # dense: the ring is faster (model 2.7x)
    gap = ps_ms[0] - 1000 * ps_step_seconds(v["touched"][0], p, share, wan)
    assert line(ran, "at density 1 (the dense model)") == (
        f"at density 1 (the dense model) a step took {ratio:.1f}x as long on the parameter server as with the "
        f"ring (model {ps_step_seconds(n, p, share, wan) / ring_step_seconds(n, p, wan):.1f}x); at the sparsest "
        f"density the parameter server's step took {gap:.1f} ms more than its model")
    # "the measured times sit above their models"
    assert np.all(ps_ms > 0.9 * 1000 * ps_step_seconds(v["touched"], p, share, wan))
    assert np.all(ring_ms > 0.9 * 1000 * ring_step_seconds(n, p, wan))


# ---------------------------------------------------------------- 5. consistent hashing
def test_virtual_nodes_improve_the_balance(ran):
    v = ran.values
    bal = v["balance"]
    for S in (3, 8):
        for i in (0, 1):                                         # keys and load
            assert bal[S, 1][i] > 2                             # "well over twice its share"
            assert bal[S, 32][i] < 1.25 < bal[S, 1][i]          # "within 25 % of the mean"
        k, u = bal[S, 4]
        want = f"S={S},  4 point(s) per server: the busiest server has {k:.2f} x the mean keys, {u:.2f} x"
        assert want in ran.printed
        counts = v["vnode_counts"]
        rises = [f"{a}->{b}" for a, b in zip(counts, counts[1:]) if bal[S, b][0] > bal[S, a][0]]
        assert rises                                             # "the curves do not fall at every step"
        assert line(ran, f"S={S}: steps where").endswith(", ".join(rises))
    # the ring of section 1 uses 4 points on 3 servers: its printed keys per server are balance[3, 4]
    load = v["ring"].load()
    assert max(load.values()) / np.mean(list(load.values())) == pytest.approx(bal[3, 4][0])


def test_a_join_moves_about_K_over_S_plus_1_and_a_leave_the_leavers_keys(ran):
    v = ran.values
    K = v["K"]
    for S, a, lv, lk, b in zip(v["Ss"], v["ring_moved"], v["leave_moved"], v["leaver_keys"], v["mod_moved"]):
        assert 0.85 < a / (K / (S + 1)) < 1.15                   # "every join moved within 15 % of K/(S+1)"
        assert lv == lk                                          # leave: exactly the leaver's keys
        assert 0.75 < lv / (K / S) < 1.25                        # ... about K/S, within 25 %
        assert f"a leave moves {lv:6d} (the leaver held {lk}; K/S = {K / S:.0f})" in ran.printed
        assert abs(b / K - S / (S + 1)) < 0.01                   # key mod S: a fraction S/(S+1)
        want = f"S={S:2d}: a join moves {a:6d} keys (K/(S+1) = {K / (S + 1):7.0f}, ratio {a / (K / (S + 1)):.2f})"
        assert want in ran.printed
    assert "K / (S + 1)" in ran.markdown and "about `K / S` keys, where" not in ran.markdown


def test_the_joiner_takes_one_range_and_copies_what_it_holds(ran):
    v = ran.values
    cfg, res, K = v["join_cfg"], v["join_res"], v["K"]
    before, after, moved = v["before"], v["after"], v["moved"]
    assert len(np.unique(before.arcs(moved))) == 1               # one range changes owner
    assert np.all(after.lookup(moved) == cfg.joiner)
    P = len(before.points)
    assert line(ran, "keys that changed owner").endswith(
        f"to server(s) [2]; K/(P+1) = {K / (P + 1):.0f} for P = {P} points, K/(S+1) = {K / 3:.0f} for S = 2 servers")
    j = res[2]["join"]
    assert j["switched"] and not j["aborted"]
    holds = v["holds"]
    assert np.array_equal(holds, moving_keys(cfg))               # what the joiner asked for
    assert j["precopy_keys"] == int(holds.sum())                # each key it holds, copied once
    assert f"it heads {len(moved)} keys and keeps a replica of {int(holds.sum()) - len(moved)} more" in ran.printed
    for s, c, d, m in zip((0, 1), v["chunks"], v["deltas"], v["to_joiner"]):
        assert d == res[s]["join"]["phase2_msgs"] and c + d <= m
    assert "final parameters equal the replay of every push: True" in ran.printed


# ---------------------------------------------------------------- 6. failures and replication
def test_a_killed_server_loses_no_update(ran):
    v = ran.values
    hurt = v["hurt"]
    assert list(hurt.failures) == [1]
    assert np.allclose(hurt.w, v["w_replay"], rtol=0, atol=1e-12)
    assert sum(x["resent"] for x in hurt.raw[3:]) > 0


def test_replication_costs_server_traffic_and_aggregation_less(ran):
    v = ran.values

    def between(r):
        return int(np.asarray(r.raw.stats.bytes)[:3, :3].sum()), int(np.asarray(r.raw.stats.messages)[:3, :3].sum())

    plain, each, batched = between(v["plain"]), between(v["each"]), between(v["batched"])
    assert plain == (0, 0)
    assert 0 < batched[0] < each[0] and 0 < batched[1] < each[1]


def test_a_dead_workers_block_is_finished_by_a_survivor(ran):
    v = ran.values
    sched, lost = v["sched"], v["lost"]
    dead = sorted(lost.failures)
    assert dead == [2]
    assert sorted(sched["done_by"]) == list(range(6))
    assert sched["reassigned"] and all(sched["done_by"][b] not in dead for b, _ in sched["reassigned"])


def test_every_printed_number_line_is_there(ran):
    """Guards against a cell silently printing nothing."""
    for start in ("keys per server", "bytes workers -> servers", "bytes servers -> workers", "server 0's clock",
                  "the KKT filter pushed", "weights that differ", "messages from servers 0 and 1"):
        assert re.search("^" + re.escape(start), ran.printed, re.M), start
