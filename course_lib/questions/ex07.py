"""Lesson 07, beyond one machine: visible checks.

ex07_1  bus_bandwidth(nbytes, seconds, p)                        algorithm and bus bandwidth of an allreduce
ex07_2  place_ranks(hosts, n)                                    (host, local rank) of each rank under mpiexec
ex07_3  ring_allreduce_seconds(nbytes, p, latency_s, line_rate_gbit)  ring allreduce time on a real link
ex07_4  next_group(current, finished, n_groups)                  the group of the gang scheduler's next slice
"""
import numpy as np

from course_lib.grading import question
from course_lib.grading.student import harness
from course_lib.questions import (
    as_int,
    as_number,
    as_sequence,
    call_keeping_inputs,
    formula_mismatch,
    num,
    off_by,
    refuse_helpers,
    shown,
)


# ------------------------------------------------------------------------------ ex07_1
def assert_bus_bandwidth(fn, nbytes, seconds, p, algbw, busbw):
    """``fn(nbytes, seconds, p)`` must return (algbw, busbw) in bytes per second."""
    out = fn(nbytes, seconds, p)
    got_alg, got_bus = as_sequence(out, 2, "bus_bandwidth's result (algbw, busbw)", kinds=(tuple, list))
    got_alg = as_number(got_alg, "the algorithm bandwidth (bytes per second)")
    got_bus = as_number(got_bus, "the bus bandwidth (bytes per second)")
    case = f"an allreduce of {num(nbytes)} bytes per rank in {num(seconds)} s on {p} rank{'s' if p != 1 else ''}"
    if not np.isclose(got_alg, algbw, rtol=1e-9, atol=0):
        why = ("the algorithm bandwidth is the rate at which the allreduce delivered the user's data: the bytes "
               "of the vector over the seconds it took, whatever the algorithm and the number of ranks.")
        if got_alg and np.isclose(1 / got_alg, algbw, rtol=1e-9):
            why = "it is seconds per byte, the reciprocal; " + why
        raise formula_mismatch(f"for {case}, your algorithm bandwidth {num(got_alg)} B/s is "
                               f"{off_by(got_alg, algbw)}: {why}", algbw)
    if np.isclose(got_bus, busbw, rtol=1e-9, atol=0):
        return
    concept = ("the bus bandwidth is the rate at which each rank's link ran: a ring allreduce makes every rank "
               "send (and receive) 2(p-1)/p times the vector's bytes, so busbw = algbw * 2(p-1)/p, which can be "
               "compared with the link's bandwidth whatever p is.")
    if p == 1:
        why = "a single rank sends nothing, so its link carries nothing: " + concept
    elif np.isclose(got_bus, got_alg, rtol=1e-9):
        why = ("that is the algorithm bandwidth itself, the rate of the user's data; on more than 2 ranks the "
               "links carry more than that: " + concept)
    elif np.isclose(got_bus, got_alg * 2 * (p - 1), rtol=1e-9):
        why = ("it counts 2(p-1) whole vectors per rank, but each step of the ring sends a chunk of n/p bytes: "
               + concept)
    else:
        why = concept
    raise formula_mismatch(f"for {case}, your bus bandwidth {num(got_bus)} B/s is {off_by(got_bus, busbw)}: {why}",
                           busbw)


@question("ex07_1", points=2, title="Bus bandwidth of an allreduce", names=("bus_bandwidth",))
def ex07_1(ns):
    """Write ``bus_bandwidth(nbytes, seconds, p)``: the algorithm bandwidth ``nbytes / seconds``
    and the bus bandwidth ``algbw * 2(p-1)/p`` (NCCL-tests' convention for allreduce), both in
    bytes per second, as a tuple."""
    fn = ns["bus_bandwidth"]
    # 1 GB in 0.1 s on 8 ranks: 10 GB/s of algorithm bandwidth, 17.5 GB/s on the bus
    assert_bus_bandwidth(fn, 1e9, 0.1, 8, 1e10, 1.75e10)
    # on 2 ranks the factor 2(p-1)/p is 1
    assert_bus_bandwidth(fn, 4 * 2 ** 20, 2e-3, 2, 2097152000.0, 2097152000.0)


# ------------------------------------------------------------------------------ ex07_2
def _placement_concept(hosts, n, out, rank, got_host, got_local, host) -> str:
    """What the first misplaced rank shows of mpiexec's placement: the order of the hosts, the fill of
    each host's slots before the next, the wrap-around, or how a local rank counts."""
    total = sum(int(count) for _, count in hosts)
    if got_host != host:
        if hosts and got_host == hosts[rank % len(hosts)][0]:
            return ("it deals the ranks one per host in turn (round robin, mpiexec's -rr); by default mpiexec fills "
                    "every slot of a host before it moves to the next host.")
        by_name = [name for name, count in sorted(map(tuple, hosts)) for _ in range(int(count))]
        if by_name and got_host == by_name[rank % len(by_name)]:
            return ("it takes the hosts in the order of their names; mpiexec takes them in the order the host file "
                    "lists them.")
        return ("ranks fill each host's slots in the host file's order, and wrap around to the first host when "
                "every slot is taken.")
    names = [name for name, _ in hosts]
    if rank >= total:
        return ("after the wrap-around the local rank keeps counting: it counts every rank already placed on that "
                "host, not the slot's position on its line.")
    if names.count(host) > 1:
        return ("a host listed on two lines is one machine: its local ranks count the ranks placed on it by both "
                "lines.")
    return "a rank's local rank counts the ranks placed on the same host before it."


def assert_placement(fn, hosts, n, want):
    """``fn(hosts, n)`` must give ``want``: one (host, local_rank) per rank."""
    out = call_keeping_inputs(fn, (hosts, n), ("hosts", "n"))
    total = sum(int(count) for _, count in hosts)
    if isinstance(out, (list, tuple)) and len(out) == total < n:
        raise AssertionError(f"with hosts {shown(hosts)} and n={n}, place_ranks placed {len(out)} ranks, one per "
                             "slot, and stopped: mpiexec places every rank, wrapping around to the first host when "
                             "every slot is taken (the hosts are then oversubscribed).")
    if not isinstance(out, (list, tuple)) or len(out) != n:
        raise AssertionError(f"place_ranks should return a list of {n} (host, local_rank) pairs, got {shown(out)}.")
    for rank, (got, (host, local)) in enumerate(zip(out, want)):
        got_host, got_local = as_sequence(got, 2, f"the entry of rank {rank} (host, local_rank)", kinds=(tuple, list))
        got_local = as_int(got_local, f"rank {rank}'s local rank")
        if got_host == host and got_local == local:
            continue
        what = "host" if got_host != host else "local rank"
        raise formula_mismatch(
            f"with hosts {shown(hosts)} and n={n}, your placement puts rank {rank} at ({shown(got_host)}, "
            f"{got_local}), the wrong {what}: " + _placement_concept(hosts, n, out, rank, got_host, got_local, host),
            (host, local))


@question("ex07_2", points=2, title="Where mpiexec puts each rank", names=("place_ranks",))
def ex07_2(ns):
    """Write ``place_ranks(hosts, n)``: ``hosts`` lists (name, slots) as a host file does; return,
    for ranks 0..n-1, the pair (host, local_rank) that MPICH's mpiexec gives them by default (a host
    listed twice counts its local ranks over both lines)."""
    fn = ns["place_ranks"]
    # the host file of the lesson: node01:4, node02:4, 8 ranks
    assert_placement(fn, [("node01", 4), ("node02", 4)], 8,
                     [("node01", 0), ("node01", 1), ("node01", 2), ("node01", 3),
                      ("node02", 0), ("node02", 1), ("node02", 2), ("node02", 3)])
    # more ranks than slots: wrap around, local ranks keep counting
    assert_placement(fn, [("a", 2), ("b", 1)], 5, [("a", 0), ("a", 1), ("b", 0), ("a", 2), ("a", 3)])


#: The hardware table's gbit_per_s converts a line rate to bytes per second, part of ex07_3's work.
GBIT = [("course_lib.hardware", "gbit_per_s")]


# ------------------------------------------------------------------------------ ex07_3
def assert_ring_seconds(fn, nbytes, p, latency_s, rate_gbit, want):
    refuse_helpers(fn, (nbytes, p, latency_s, rate_gbit), GBIT, "ring_allreduce_seconds")
    got = as_number(call_keeping_inputs(fn, (nbytes, p, latency_s, rate_gbit),
                                        ("nbytes", "p", "latency_s", "line_rate_gbit")),
                    "ring_allreduce_seconds' result (seconds)")
    beta = 8 / (rate_gbit * 1e9)
    if np.isclose(got, want, rtol=1e-9, atol=0):
        return
    hint = (" Count the 2(p-1) messages on the ring's critical path, each paying the latency, and the bytes each "
            "rank sends, 2(p-1)/p n, at the link's rate in bytes per second.")
    if np.isclose(got, 2 * (p - 1) * latency_s + 2 * (p - 1) / p * nbytes * beta / 8, rtol=1e-6):
        hint = " A line rate in Gb/s is bits: divide by 8 for bytes."
    elif np.isclose(got, 2 * (p - 1) / p * nbytes * beta, rtol=1e-6):
        hint = " The 2(p-1) messages on the critical path each pay the latency."
    elif np.isclose(got, 2 * (p - 1) * latency_s + 2 * (p - 1) / p * nbytes * 8 / (rate_gbit * 2 ** 30), rtol=1e-6):
        hint = " A data sheet's giga is 10^9, not 2^30: network rates are decimal."
    elif np.isclose(got, (p - 1) * latency_s + (p - 1) / p * nbytes * beta, rtol=1e-6):
        hint = (" That is half the ring: the reduce-scatter alone. An allreduce then allgathers the reduced chunks, "
                "as many steps and bytes again.")
    raise formula_mismatch(
        f"a ring allreduce of {num(nbytes)} bytes on {p} ranks over a {num(rate_gbit)} Gb/s link with "
        f"{num(latency_s)} s latency: your {num(got)} s is {off_by(got, want)}.{hint}", want)


@question("ex07_3", points=2, title="Predict an allreduce on a real link", names=("ring_allreduce_seconds",))
def ex07_3(ns):
    """Write ``ring_allreduce_seconds(nbytes, p, latency_s, line_rate_gbit)``: the ring allreduce time
    2(p-1) alpha + 2 (p-1)/p n beta, with alpha the latency and beta one over the link's bandwidth
    in bytes per second (its line rate is given in Gb/s, per direction, as on a data sheet)."""
    fn = ns["ring_allreduce_seconds"]
    # 100 MB on 8 ranks over 100 Gb/s Ethernet with 25 us latency: 0.35 ms of latency + 14 ms of bytes
    assert_ring_seconds(fn, 100e6, 8, 25e-6, 100, 0.01435)
    # 2 ranks: two messages, each rank sends n bytes in all
    assert_ring_seconds(fn, 1e6, 2, 1e-6, 8, 0.001002)


# ------------------------------------------------------------------------------ ex07_4
CHECK_TIMEOUT = 6.0  # seconds a job of the gang-scheduled run may take (they take well under one)


def assert_next_groups(fn, n_groups, cases):
    """``fn(current, finished, n_groups)`` must give ``want`` on every ``(current, finished, want)``
    of ``cases`` (round robin over the unfinished groups; the expected groups are written out,
    so that this module, shipped to students, holds no answer)."""
    for current, finished, want in cases:
        got = call_keeping_inputs(fn, (current, set(finished), n_groups), ("current", "finished", "n_groups"))
        if got is not None:
            got = as_int(got, "next_group's result (a group number or None)")
        state = (f"with {n_groups} groups, group {current} running" if current is not None
                 else f"at the start, with {n_groups} groups")
        done = f", groups {sorted(finished)} finished" if finished else ", no job finished"
        if want is None:
            assert got is None, f"{state}{done}: every job is over, so there is no next group (None); got {shown(got)}."
            continue
        hint = ""
        if got is not None and got in finished:
            hint = " That group's job is finished: its slices go to the others."
        elif got is None:
            hint = " Some job is not finished yet, so the scheduler must keep going."
        elif current is not None and got == current and want != current:
            hint = " Another job is waiting: the running group must give way at the end of its slice."
        assert got == want, (f"{state}{done}: the next slice goes to group {want} (round robin from the running "
                             f"group over the jobs not finished), got {shown(got)}.{hint}")


def every_state(n_groups):
    """Every (current, finished) pair on ``n_groups`` groups: each running group (or None) with
    each set of finished groups."""
    subsets = [{g for g in range(n_groups) if mask >> g & 1} for mask in range(2 ** n_groups)]
    return [(current, finished) for current in [None, *range(n_groups)] for finished in subsets]


@harness
def run_gang(fn, steps, slice_s):
    """Run one job of two workers per entry of ``steps`` (its number of steps, about 1 ms of compute
    each, blocking waits) side by side under a GangScheduler whose rule is ``fn``.

    Returns the slices [(group, start, end)], when each job's results reached the scheduler,
    each job's step ends (seconds, on the same clock), or {"error": ...} if a job did not finish."""
    from course_lib.beyond_one_machine import JobSpec, calibrate_work, run_jobs
    from course_lib.runtime import WorkerTimeout

    work = calibrate_work(1e-3)
    specs = {f"job {g}": JobSpec(steps=s, work=work, wait="block") for g, s in enumerate(steps)}
    try:
        runs, slices = run_jobs(specs, "gang", slice_s=slice_s, rule=fn, timeout=CHECK_TIMEOUT)
    except WorkerTimeout as exc:
        return {"error": f"a job did not finish within {CHECK_TIMEOUT} s ({exc})"}
    jobs = list(runs.values())
    return {"slices": [[int(g), float(a), float(b)] for g, a, b in slices],
            "reported": [job.reported for job in jobs],
            "step_ends": [job.step_ends.tolist() for job in jobs],
            "in_own_slices": [job.in_slices(slices, g) for g, job in enumerate(jobs)]}


def assert_gang_run(fn, steps, slice_s):
    """Under the student's rule, real jobs run one at a time and a finished job gets no more slices.

    Load-independent: a stopped process cannot run however busy the machine is, and which group
    each slice went to is the scheduler's own record."""
    out = run_gang(fn, steps, slice_s)
    assert "error" not in out, (f"{len(steps)} jobs of {list(steps)} steps, gang-scheduled with your rule: "
                                f"{out.get('error')}. Some job was never resumed.")
    slices, reported = out["slices"], out["reported"]
    for g in range(len(steps)):
        late = [round((a - reported[g]) * 1e3, 1) for group, a, _ in slices
                if group == g and a > reported[g] + slice_s]
        assert not late, (f"job {g} ({steps[g]} steps) was over, yet your rule gave it slices starting "
                          f"{late} ms after: those slices paused the jobs still running for nothing.")
    for g, share in enumerate(out["in_own_slices"]):
        # SIGSTOP stops a process whatever the load: a step ends in another job's slice only in the
        # 2 ms after a switch, so most steps end in their own job's slices
        assert share >= 0.75, (f"only {share:.0%} of job {g}'s steps ended inside its own slices: two jobs "
                               "ran at the same time.")
    last = max(max(ends) for ends in out["step_ends"])
    assert max(b for _, _, b in slices) >= last - 2e-3, "the scheduler stopped before the last job was over."


@question("ex07_4", points=2, title="The gang scheduler's next slice", names=("next_group",))
def ex07_4(ns):
    """Write ``next_group(current, finished, n_groups)``: the group that runs in the next time
    slice, round robin from ``current`` (None at the start) over the groups whose job is not in
    ``finished``; None when every job is finished. Then a real GangScheduler uses it to pause
    and resume two jobs' worker processes with SIGSTOP and SIGCONT."""
    fn = ns["next_group"]
    assert_next_groups(fn, 2, [(None, set(), 0), (0, set(), 1), (1, set(), 0), (0, {0}, 1), (1, {0}, 1),
                               (0, {1}, 0), (1, {0, 1}, None)])
    assert_next_groups(fn, 4, [(None, set(), 0), (3, set(), 0), (1, {2}, 3), (2, {3, 0}, 1), (3, {0, 1, 2}, 3),
                               (None, {0, 1}, 2)])
    # two real jobs, the first much shorter: after it is over the second gets every slice
    assert_gang_run(fn, (5, 30), 0.01)
