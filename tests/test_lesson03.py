"""Lesson 03: what the notebook says about its own run holds on the run's numbers."""
from __future__ import annotations

import numpy as np
import pytest

from common import NOTEBOOKS, line

NOTEBOOK = NOTEBOOKS / "03_async_parameter_server.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]



def test_one_process_is_serial_sgd_and_the_verdicts_are_the_runs(ran):
    for name, (l_serial, one, free, locked, apart) in ran.values["hog"].items():
        assert one.loss == l_serial, name                     # same samples, same order: the same SGD
        faster = "faster" if free.wall_time < one.wall_time else "slower"
        held = " and ".join(f"{s:.0%}" for s in free.cpu_share)
        assert (f"on this run, {name}: two lock-free processes were {faster} than one "
                f"({one.wall_time / free.wall_time:.2f}x) and held a core {held} of the time; "
                f"two that share nothing: {one.wall_time / apart.wall_time:.2f}x; "
                f"the lock cost {locked.wall_time / free.wall_time:.2f}x the lock-free time") in ran.printed
        assert all(0 < s < 1.05 for r in (one, free) for s in r.cpu_share), name
        assert "exactly" in ran.printed.split(f"on this run, {name}:")[1].splitlines()[0]
        assert apart.apart and np.all(apart.w == 0) and not free.apart   # "no model comes of it"


def test_lock_free_runs_about_as_fast_as_sharing_nothing_on_the_sparse_problem(ran):
    """The text: against the ceiling of two processes that share nothing, two lock-free processes
    take about as long on the sparse problem (the median of 5 runs in turns; measured
    here 0.92-1.05x of it on a quiet machine, up to 1.6x beside a program taking 30 % of a core
    in bursts). Both runs keep two cores busy, so this holds whatever this machine gives two
    processes, where "two beat one" does not (the CI run at abb90ec measured 0.105 s against
    0.100 s); the margin allows a noisy machine."""
    _, one, free, _, apart = ran.values["hog"]["sparse (5 of 2000)"]
    assert sum(len(s) for s in free.samples) == one.n_updates == apart.n_updates == 20000
    assert len(one.wall_times) == len(free.wall_times) == len(apart.wall_times) == 5
    assert free.wall_time == min(free.wall_times) and one.wall_time == min(one.wall_times)
    # The medians of the five runs: one lucky run of either side (a fresh-clone suite measured a 0.058 s
    # outlier among 0.086-0.19 s for the side that shares nothing) must not decide the sentence.
    assert np.median(free.wall_times) < 1.5 * np.median(apart.wall_times), (free.wall_times, apart.wall_times)


def test_sparse_updates_collide_less_than_dense_ones_and_the_lock_removes_collisions(ran):
    from course_lib.async_ps import collisions

    problems, hog = ran.values["problems"], ran.values["hog"]
    sparse, dense = "sparse (5 of 2000)", "dense (50 of 50)"
    assert collisions(hog[sparse][2], problems[sparse]) < collisions(hog[dense][2], problems[dense])
    for name in hog:
        assert collisions(hog[name][3], problems[name]) == 0
        assert collisions(hog[name][4], problems[name]) == 0        # share nothing: nothing to collide on
        assert hog[name][2].loss < 1.5 * hog[name][0]                # "reach the serial loss"


def test_runs_headless_without_errors_within_the_budget(ran):
    from common import LOADED_BUDGET_S

    assert ran.errors == []
    assert ran.seconds < LOADED_BUDGET_S, f"lesson 03 took {ran.seconds:.0f} s (budget {LOADED_BUDGET_S:g} s)"


# ---------------------------------------------------------------- staleness against wall time
def test_every_gradient_is_timestamped_and_the_slow_workers_points_sit_higher(ran):
    story = ran.values["story"]
    rec = story.records
    for r in (1, 2, 3):
        sent = rec["sent"][rec["worker"] == r]
        assert len(sent) and np.all(np.diff(sent) > 0), r
    assert np.all(rec["sent"] <= rec["time"])
    assert "send times increase for every worker: True" in ran.printed
    fast, slow = rec["staleness"][rec["worker"] != 3], rec["staleness"][rec["worker"] == 3]
    assert slow.min() > fast.max()                       # every slow point above every fast one
    assert line(ran, "on this run the slow worker's points sat ") == (
        f"on this run the slow worker's points sat higher: its staleness {slow.min()} to {slow.max()} "
        f"(mean {slow.mean():.1f}), the fast workers' {fast.min()} to {fast.max()} (mean {fast.mean():.1f})")


# ---------------------------------------------------------------- federated averaging
def fed_excess(ran, res, split):
    from course_lib.async_ps import optimal_loss

    Xf, yf = ran.values["splits"][split]
    return res.losses(Xf, yf) - optimal_loss(Xf, yf)


def test_fedavg_with_one_local_step_is_synchronous_sgd_and_every_round_moves_2pd8_bytes(ran):
    from course_lib.reference.ex01 import full_gradient

    fed, K = ran.values["fed"], ran.values["K"]
    for split, (Xf, yf) in ran.values["splits"].items():
        res, w = fed[split, 1], np.zeros(Xf.shape[1])
        for t in range(1, res.rounds + 1):
            w = w - 0.1 * full_gradient(Xf, yf, w)
            assert np.allclose(res.models[t], w, rtol=0, atol=1e-10), (split, t)
    for res in fed.values():
        assert res.bytes_moved == res.rounds * 2 * K * res.model_bytes == 60 * 2 * 4 * 20 * 8
    assert line(ran, "bytes per round counted by the runtime:") == (
        "bytes per round counted by the runtime: [1280.0] = 2 x 4 clients x 160 model bytes = 1280")


def test_local_steps_cut_rounds_on_iid_data_and_raise_the_floor_on_non_iid_data(ran):
    from course_lib.async_ps import optimal_loss

    fed, (X, y) = ran.values["fed"], ran.values["splits"]["IID"]
    target = optimal_loss(X, y) + 1e-3 * (float(y @ y) / (2 * len(y)) - optimal_loss(X, y))   # fed_target
    r1, r5, r20 = (fed["IID", E].rounds_to(X, y, target) for E in (1, 5, 20))
    assert r5 * 3 <= r1 and r20 <= r5                    # "by about E until a few rounds suffice"
    assert line(ran, "on this run, IID: E = 5") == (
        f"on this run, IID: E = 5 reached the target in {r5} rounds, {r1 / r5:.1f}x fewer rounds and bytes "
        f"than synchronous SGD (E = 1: {r1})")
    floor = {E: fed_excess(ran, fed["non-IID", E], "non-IID")[-1] for E in (1, 5, 20)}
    assert floor[1] < floor[5] < floor[20]               # "the more local steps, the higher the floor"
    assert floor[20] > 10 * floor[1]
    assert f"E = 20 stayed {floor[20] / floor[1]:.0f}x further above the minimum" in ran.printed


def test_proceeding_without_the_slow_client_is_faster_and_costs_its_data_only_when_non_iid(ran):
    from course_lib.async_ps import optimal_loss

    slow_fed, splits, K = ran.values["slow_fed"], ran.values["splits"], ran.values["K"]
    speed = []
    for split, (Xf, yf) in splits.items():
        wait, proceed = slow_fed[split, "wait for all"], slow_fed[split, "proceed with 3 of 4"]
        assert wait.share_of(K) == 1 and proceed.share_of(K) == 0 and proceed.late >= 1 and wait.late == 0
        assert proceed.bytes_moved == (proceed.models_sent + proceed.models_received) * proceed.model_bytes
        speed.append(wait.times[-1] / proceed.times[-1])
        cost = {how: fed_excess(ran, slow_fed[split, how], split)[-1] / optimal_loss(Xf, yf)
                for how in ("wait for all", "proceed with 3 of 4")}
        assert line(ran, f"on this run, {split}: after 20 rounds") == (
            f"on this run, {split}: after 20 rounds the loss was above the minimum by {cost['wait for all']:.2%} "
            f"of the minimum when waiting, {cost['proceed with 3 of 4']:.2%} when leaving client 4 out")
        if split == "IID":
            assert cost["proceed with 3 of 4"] < 0.01       # "a fraction of a percent of the minimum loss"
        else:
            assert cost["proceed with 3 of 4"] > 10 * cost["wait for all"] and cost["proceed with 3 of 4"] > 0.05
    assert min(speed) > 2                                   # "much faster" (x8 slow client; x7.6-8.4 when quiet)
    assert (f"finished the 20 rounds {min(speed):.1f}x to {max(speed):.1f}x sooner than waiting") in ran.printed
