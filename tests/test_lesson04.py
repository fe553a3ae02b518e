"""Lesson 04: what the notebook says about its own run holds on the run's numbers.

The notebook is executed headless once (shared with tests/test_notebooks.py); its variables
are read back and each sentence of its text that describes them is checked here. Gossip,
D-PSGD and the synchronous server are deterministic (fixed seeds, fixed summation order), so
their claims are checked tightly; timings are only compared within the run, with margins, and
the asynchronous server (whose order of arrivals is the scheduler's) is claimed nothing about.
"""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from common import LOADED_BUDGET_S, NOTEBOOKS

NOTEBOOK = NOTEBOOKS / "04_gossip.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]



def printed_line(ran, start):
    lines = [x for x in ran.printed.splitlines() if x.startswith(start)]
    assert len(lines) == 1, (start, lines)
    return lines[0]


def test_runs_headless_within_the_budget(ran):
    assert not ran.errors, ran.errors
    assert ran.seconds < LOADED_BUDGET_S, \
        f"lesson 04 took {ran.seconds:.0f} s (budget under load {LOADED_BUDGET_S:g} s)"


def test_the_graphs_and_the_closed_forms(ran):
    """"The graphs (16 nodes each)"; the closed forms of section 2 and the torus and hypercube's
    weights 1/5 with a symmetric spectrum."""
    import course_lib.gossip as gs

    v = ran.values
    n = v["N_NODES"]
    assert n == 16 and all(G.number_of_nodes() == n for G in v["graphs"].values())
    spectra = v["spectra"]
    assert spectra["ring"].lambda_2 == pytest.approx(1 / 3 + 2 / 3 * math.cos(2 * math.pi / n), abs=1e-12)
    assert spectra["star"].lambda_2 == pytest.approx(1 - 1 / n, abs=1e-12)
    assert abs(spectra["complete"].lambda_2) < 1e-12
    for name in ("torus", "hypercube"):
        W = gs.metropolis_hastings(v["graphs"][name])
        off = W[~np.eye(n, dtype=bool)]
        assert np.allclose(off[off != 0], 1 / 5)
        assert spectra[name].lambda_n == pytest.approx(-spectra[name].lambda_2, abs=1e-12)
    k33 = gs.spectrum(gs.metropolis_hastings(nx.complete_bipartite_graph(3, 3)))   # "of the exercises"
    assert k33.lambda_2 == pytest.approx(1 / 4) and k33.lambda_n == pytest.approx(-1 / 2)


def test_real_runs_equal_their_single_process_references(ran):
    """"the real run must equal it to the last bit"; D-PSGD "equals the single-process reference
    to 0.0"; "real run equals the reference: True" for pairwise gossip."""
    v = ran.values
    assert v["bit_equal"] == {name: True for name in v["graphs"]}
    assert v["ring_vs_reference"] == 0.0
    assert np.array_equal(v["pair"].traj, v["reference"])
    assert "real run equals the reference: True" in ran.printed


def test_the_measured_error_stays_under_its_bound_r_t(ran):
    """"In every panel the measured curve stays on or under its dashed bound r^t ... at most 1"."""
    v = ran.values
    T = v["T"]
    t = np.arange(T + 1)
    for name, run in v["runs"].items():
        r = v["spectra"][name].r
        e = run.errors / run.errors[0]
        if r > 1e-12:
            assert np.all(e <= r ** t * (1 + 1e-9)), name
            assert v["worst_ratio"][name] <= 1 + 1e-9, name
            assert f"largest error / r^t over t >= 1: {v['worst_ratio'][name]:.3f}" in ran.printed
        else:   # the complete graph: "done in one step; what is left is rounding"
            assert name == "complete"
            assert np.all(e[1:] < 1e-14)


def test_the_star_decays_at_exactly_r_from_the_first_step(ran):
    """"On the star the two nearly coincide ... 14 of its 16 eigenvalues equal r; the last one, 0"."""
    v = ran.values
    s = v["spectra"]["star"]
    ev = s.eigenvalues
    assert ev[0] == pytest.approx(1) and abs(ev[-1]) < 1e-12
    assert np.sum(np.isclose(ev, s.r, atol=1e-12)) == 14
    e = v["runs"]["star"].errors
    ratio = e[1:] / e[0] / s.r ** np.arange(1, v["T"] + 1)
    assert np.ptp(ratio) < 1e-9 * ratio.max()       # r^t times a constant
    assert 0.95 < v["worst_ratio"]["star"] <= 1 + 1e-9


def test_the_tail_has_slope_log_r(ran):
    v = ran.values
    assert set(v["fitted_rate"]) == set(v["runs"]) - {"complete"}
    for name, fitted in v["fitted_rate"].items():
        r = v["spectra"][name].r
        assert abs(math.log(fitted) / math.log(r) - 1) < 0.02, (name, fitted, r)


def test_torus_and_hypercube_are_one_graph_with_different_numbering(ran):
    """"same spectrum, same bound, and curves that differ only in how x0 falls on the eigenvectors"."""
    v = ran.values
    torus, cube = v["graphs"]["torus"], v["graphs"]["hypercube"]
    assert nx.is_isomorphic(torus, cube) and set(torus.edges) != set(cube.edges)
    assert np.allclose(v["spectra"]["torus"].eigenvalues, v["spectra"]["hypercube"].eigenvalues, atol=1e-12)
    a, b = v["runs"]["torus"].errors, v["runs"]["hypercube"].errors
    assert not np.allclose(a, b, rtol=1e-3)                    # the curves do not coincide
    assert np.all(np.abs(a / b - 1) < 0.2)                     # but stay close


def test_the_order_of_decay_is_the_order_of_the_gaps_by_step_60_not_at_step_10(ran):
    """"At step 10 the star is still behind the ring ... By step 60 the errors come in the order of
    the spectral gaps, and the path and the ring ... are the slowest."""
    v = ran.values
    T, spectra, error_at = v["T"], v["spectra"], v["error_at"]
    assert T == 60
    names = list(spectra)
    for a in names:
        for b in names:
            if spectra[a].gap < spectra[b].gap - 1e-9:
                assert error_at[T][a] > error_at[T][b], (a, b)
    slowest = sorted(error_at[T], key=error_at[T].get, reverse=True)
    assert slowest[:2] == ["path", "ring"]
    assert error_at[10]["star"] > error_at[10]["ring"]
    assert spectra["star"].gap > spectra["ring"].gap
    assert "error after 60 steps, slowest first: path" in ran.printed


def test_the_torus_mixes_in_a_few_steps_and_the_ring_keeps_a_wave(ran):
    """"after 10 its spread ... is below 1 % ... the ring ... still about a quarter"."""
    spread = ran.values["spread_after_10"]
    assert spread["torus"] < 0.01
    assert 0.2 < spread["ring"] < 0.3


def test_the_gap_against_n(ran):
    """"log-log slopes close to -2 (ring) and -1 (torus) between the two largest sizes, gap x log2 n
    between 1.5 and 2 for the hypercube, and the expander's gap levelling off near 0.1 from n = 64 on"."""
    v = ran.values
    assert v["gap_slope"]["ring"] == pytest.approx(-2, abs=0.1)
    assert v["gap_slope"]["torus"] == pytest.approx(-1, abs=0.1)
    assert all(1.5 - 1e-9 <= x < 2 for x in v["hypercube_gap_log_n"])
    late = v["expander_late"]
    assert len(late) == 3 and all(0.08 < g < 0.15 for g in late) and max(late) / min(late) < 1.3
    assert v["expander_limit"] == pytest.approx(0.107, abs=5e-4)
    gaps = v["gaps"]
    assert gaps["ring"][0] / gaps["ring"][-1] > 500            # while the ring's falls ~1000x


def test_a_disconnected_graph_never_agrees(ran):
    """"each component agreeing on its own average, while the global disagreement stops falling: it
    levels off at the part that lies between the two components' averages"; lambda_2 = 1."""
    v = ran.values
    assert "graph is disconnected: 2 components" in printed_line(ran, "warning:")
    assert v["split_lambda_2"] == pytest.approx(1, abs=1e-12)
    assert v["bytes_between"] == 0
    assert v["split_final"] == pytest.approx(v["between_part"], abs=1e-4)
    assert v["between_part"] > 0.5
    assert np.all(np.diff(v["split"].errors[10:]) <= 1e-12)   # falling to its level, never below
    assert v["split"].errors[-1] / v["split"].errors[0] >= v["between_part"] - 1e-9
    per = v["per"]
    assert np.all(per[-1] / per[0] < 1e-5)
    x0, final = v["x0"][:, 0], v["split"].traj[-1, :, 0]
    for c in v["comps"]:
        assert np.allclose(final[c], x0[c].mean(), atol=1e-5)


def test_pairwise_gossip_against_its_bound(ran):
    """"the mean over 40 schedules stays under it and ends orders of magnitude below it"; "2 per tick"."""
    v = ran.values
    ticks = v["ticks"]
    assert v["pair"].stats.total_messages == 2 * ticks
    assert f"messages: {2 * ticks} (2 per tick)" in ran.printed
    msq, bound = v["msq"], v["pair_bound"]
    assert np.all(msq / msq[0] <= bound * (1 + 1e-9))
    assert v["msq_worst"] <= 1
    assert msq[-1] / msq[0] < bound[-1] / 100
    assert f"the one real run / bound: at most {v['one_run_worst']:.3f}" in ran.printed


def test_messages_per_synchronous_step_are_2E(ran):
    v = ran.values
    E, T = v["E"], v["T"]
    assert v["runs"]["expander"].stats.total_messages == T * 2 * E
    assert f"after {v['s_steps']} steps = {v['s_steps'] * 2 * E} messages" in ran.printed


def test_the_average_model_follows_the_synchronous_server(ran):
    """"from iteration 10 on, each stays within the percentage printed above, about 10 % or less"."""
    v = ran.values
    for name, d in v["average_vs_sync"].items():
        assert d < 0.12, (name, d)


def test_the_nodes_own_models_by_topology(ran):
    """"the torus and the expander ... keep their nodes closest, and the ring and the star stall above
    the others. But r alone does not order them: the star's gap is larger than the ring's, yet its
    nodes end up further from their average. On the star, 14 eigenvalues equal r ..., on the ring
    only two come close"."""
    v = ran.values
    spread, final, spectra = v["final_spread"], v["final"], v["spectra"]
    for close in ("torus", "expander"):
        for far in ("ring", "star"):
            assert spread[close] < spread[far] and final[close] < final[far], (close, far)
    assert spectra["star"].gap > spectra["ring"].gap and spread["star"] > spread["ring"]
    assert v["slow_eigenvalues"] == {"ring": 2, "torus": 0, "expander": 0, "star": 14}


def test_who_talks_in_the_timelines(ran):
    """"rank 0 sends and receives 16 messages per iteration ... at the end it also sends each worker a
    stop message ... each worker sends and receives one; in D-PSGD on the ring every node sends and
    receives two"; and in the timeline rank 0's row is the one full of sends and receives."""
    v = ran.values
    steps, n = v["STEPS"], v["N_NODES"]
    sync, ring = v["sync"].stats, v["dpsgd"]["ring"].stats
    assert sync.messages_sent(0) == n * steps + n and sync.messages_received(0) == n * steps
    for k in range(1, n + 1):
        assert sync.messages_sent(k) == steps and sync.messages_received(k) == steps + 1
    for i in range(n):
        assert ring.messages_sent(i) == 2 * steps and ring.messages_received(i) == 2 * steps
    shares = v["shares"]["server, synchronous"]
    talk = {r: s["send"] + s["recv"] for r, s in shares.items()}
    assert talk[0] > 1.5 * max(talk[r] for r in talk if r != 0)   # timing: a ratio with a margin
    for by_rank in v["shares"].values():
        for s in by_rank.values():
            assert sum(s.values()) == pytest.approx(1)
    assert printed_line(ran, "on this run, server, synchronous, rank 0:")


def test_bytes_at_the_busiest_node(ran):
    """2 deg(i) d per iteration for D-PSGD, 2 n d for the server plus 16 stop messages of 4 bytes."""
    v = ran.values
    steps, n, d_bytes = v["STEPS"], v["N_NODES"], v["model_bytes"]
    assert d_bytes == 20 * 8
    for name, busiest in v["busiest_dpsgd"].items():
        dmax = max(d for _, d in v["graphs"][name].degree)
        assert busiest == steps * 2 * dmax * d_bytes, name
    assert v["busiest_dpsgd"]["ring"] == steps * 640 and v["busiest_dpsgd"]["star"] == steps * 4800
    assert v["stop_bytes"] == n * 4
    assert v["busiest_server"] == steps * 2 * n * d_bytes + n * 4
    assert f"(+ {n * 4} bytes in the whole run: {n} stop messages of 4 bytes)" in ran.printed


def test_the_closing_table_in_words(ran):
    """"the expander's nodes reach the target a few iterations after the synchronous server, while the
    ring's do not reach it in 120 iterations"; the printed verdicts are the run's."""
    v = ran.values
    reached = v["iters_to_target"]
    assert reached["sync server"] is not None and reached["D-PSGD expander"] is not None
    assert reached["sync server"] <= reached["D-PSGD expander"] <= reached["sync server"] + 15
    assert reached["D-PSGD ring"] is None and v["STEPS"] == 120
    line = printed_line(ran, "on this run, iterations to the target: ")
    for who, it in reached.items():
        assert f"{who} {it if it is not None else 'not in 120'}" in line
    epoch = v["epoch_seconds"]
    line = printed_line(ran, "on this run, time per epoch: ")
    assert line.startswith(f"on this run, time per epoch: {min(epoch, key=epoch.get)} was the fastest")
    assert f"{epoch['D-PSGD expander'] / epoch['sync server']:.2f}x" in line


def test_the_text_claims_nothing_the_run_does_not_show(ran):
    text = ran.markdown
    assert "their curves coincide" not in text                 # they differ by up to 7 %
    assert "stays put" not in text                              # it falls to 0.70 first
    assert "stays constant on expanders" not in text and "stays roughly constant" not in text
    assert "with $1/(1 - r)$" not in text                       # the star and the ring say otherwise
    assert "keeps\nup with the synchronous server" not in text and "keeps up with the synchronous" not in text
    assert "What this run does **not** show is D-PSGD beating the server in time" not in text
    assert "D-PSGD beating the\nserver in time, the question in the title of Lian et al., needs a network" in text


# -- section 7: the emulated network ---------------------------------------------------------------
def test_the_emulated_runs_compute_the_same_models_and_bytes(ran):
    """"the same twelve iterations, with the same losses"; "The bytes at the busiest node are the same
    on every network ... and so are the models" (counted, against 2 deg m and 2 p m + stop messages)."""
    import course_lib.gossip as gs

    v = ran.values
    assert v["same_models"] is True
    assert "(only the time changed): True" in ran.printed
    m, n = v["model_bytes"], v["N_NODES"]
    for (who, s), run in v["emulated"].items():
        steps = v["net_steps"][s]
        reference = v["sync"] if who == "server" else v["dpsgd"][who]
        assert np.array_equal(run.traj, reference.traj[:steps + 1]), (who, s)
        want = gs.server_busiest_bytes(n, m, steps) if who == "server" else \
            gs.dpsgd_busiest_bytes(v["graphs"][who], m, steps)
        assert gs.busiest_node_bytes(run.stats) == want, (who, s)
    assert v["net_steps"][v["slow"]] == 12


def test_the_model_charges_what_the_network_charges_and_no_incast(ran):
    """The printed directions are those of the network the run used; "computes the downlink's queue
    rather than assume it": 0 in every row."""
    import course_lib.gossip as gs

    v = ran.values
    slow_net = v["networks"][v["slow"]]
    want = "sender's uplink and receiver's downlink" if gs.charges_receiver(slow_net) else "sender's uplink only"
    assert printed_line(ran, "the model charges the ") == f"the model charges the {want}"
    for key, prediction in v["predicted"].items():
        assert prediction.incast == 0.0, key
        assert prediction.charges_receiver == gs.charges_receiver(v["networks"][key[1]])


def test_every_measured_dot_sits_near_its_model_line(ran):
    """"Every dot sits near its line (the cell printed by how much at most)"; on the instant network the
    model's c is the measurement itself."""
    v = ran.values
    measured, predicted = v["measured"], v["predicted"]
    for (who, s), p in predicted.items():
        if s == 0:
            assert p.seconds == pytest.approx(measured[who, s], rel=1e-12)
        else:   # timing: a generous band, the spin of the emulated sleeps shares 2 cores with 48 processes
            assert 0.6 < measured[who, s] / p.seconds < 1.4, (who, s, measured[who, s], p.seconds)
    worst = max(map(abs, v["model_error"].values()))
    assert f"within {worst:.0%} of the model's" in printed_line(ran, "on the slow networks the measured iterations")


def test_dpsgd_beats_the_server_where_its_link_is_the_bottleneck(ran):
    """"On the slowest network the ring's iteration is several times shorter than the server's, as the
    model says (both ratios printed)"; the verdict line is the run's."""
    v = ran.values
    slow, measured = v["slow"], v["measured"]
    for who in ("ring", "torus"):
        assert v["speedup"][who] == measured["server", slow] / measured[who, slow]
        assert v["speedup"][who] > 2.5, who
        assert 0.6 < v["speedup"][who] / v["model_speedup"][who] < 1.6, who
    assert v["speedup"]["ring"] > v["speedup"]["torus"]      # degree 2 against degree 4
    line = printed_line(ran, "on the emulated network where a model takes 12 ms")
    assert (f"D-PSGD's iteration on the ring took {measured['ring', slow] * 1e3:.1f} ms against the server's "
            f"{measured['server', slow] * 1e3:.1f} ms: {v['speedup']['ring']:.1f}x faster") in line
    # "done in a fraction of the server's time": the twelfth iteration began sooner on both D-PSGD runs
    began = v["last_iteration"]
    assert began["ring"][0] < began["torus"][0] < began["server"][0] / 2


def test_on_the_instant_network_neither_wins_by_the_network(ran):
    """"On the instant network the two iterations take a few milliseconds each": a small fraction of
    what they take once a model costs 4 ms on a link."""
    v = ran.values
    measured = v["measured"]
    for who in ("ring", "torus", "server"):
        assert measured[who, 0.0] < measured[who, 4e-3] / 2, who
    assert measured["server", 0.0] < measured["server", 4e-3] / 5
    assert printed_line(ran, "on the instant network, D-PSGD's iteration on the ring took")


def test_the_emulated_figure_says_emulated(ran):
    """The figure's title says the network is emulated (the figure is saved as lesson04_emulated_network.png)."""
    source = "\n".join(c.source for c in ran.notebook.cells if c.cell_type == "code")
    assert 'fig.suptitle(f"Emulated network' in source and 'show(fig, "emulated_network")' in source
