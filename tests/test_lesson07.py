"""Lesson 07: every sentence about the measured run holds on the notebook's own numbers.

The notebook is executed headless (as students run it), then its ``table`` (allreduce times
per engine, process count and size, from ``course_lib.beyond_one_machine.compare``) is read back
and each claim of its text is checked. The machine is shared and noisy, so comparisons
carry margins; timing is only ever compared as ratios measured in the same run.
"""
from __future__ import annotations

import numpy as np
import pytest

from course_lib.beyond_one_machine import SIZES

from common import LOADED_BUDGET_S, NOTEBOOKS, needs_mpi

NOTEBOOK = NOTEBOOKS / "07_beyond_one_machine.ipynb"
KB, MB = 2 ** 10, 2 ** 20

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.xdist_group(NOTEBOOK.stem)]


@pytest.fixture(scope="module")
def run(ran):
    """The notebook executed once (shared with tests/test_notebooks.py): (table, seconds,
    text of its markdown, what it printed)."""
    return ran.values["table"], ran.seconds, ran.markdown, ran.printed


def best(table, engine, p, size):
    return table[(engine, p)][SIZES.index(size)]["best"]


def test_runs_headless_within_the_budget(run):
    table, seconds, _, _ = run
    assert seconds < LOADED_BUDGET_S, f"lesson 07 took {seconds:.0f} s (budget under load {LOADED_BUDGET_S:g} s)"
    assert table["sizes"] == SIZES


def test_text_no_longer_claims_shared_memory_simply_wins(run):
    _, _, text, _ = run
    assert "which is why it wins on one machine" not in text
    assert "On one machine shared memory wins;" not in text


def test_small_messages_cost_synchronisation(run):
    # "At 4 KB ... more than twice as slow when its ranks wait on Pipe barriers ... at 64 KB
    # it is still slower" (measured: 4-50x at 4 KB, 1.6-25x at 64 KB, depending on load)
    table, _, _, _ = run
    assert best(table, "shm_pipes", 2, 4 * KB) > 2 * best(table, "shm", 2, 4 * KB)
    assert best(table, "shm_pipes", 2, 64 * KB) > best(table, "shm", 2, 64 * KB)
    # "At 4 KB every engine stays far below memcpy's bandwidth" (far: 2x, with margin)
    memcpy_4k = table["memcpy"][0]["best"]
    for key in table:
        if isinstance(key, tuple):
            assert table[key][0]["best"] > 2 * memcpy_4k, key


@needs_mpi
def test_printed_verdicts_are_those_of_the_table(run):
    """The text promises that the notebook prints, from its own table, whether course_lib came
    within 3x of MPICH at 4 and 64 KB (p = 2 and 4) and whether it was faster from 1 MB up:
    every such line must be there and say what the table says."""
    table, _, _, printed = run
    assert table["bind"] is True              # "with each rank bound to its own core"
    lines = [line for line in printed.splitlines() if line.startswith("on this run, ") and "MPICH" in line]
    assert len(lines) == 7, lines
    for p in (2, 4):
        for size in (4 * KB, 64 * KB):
            ratio = best(table, "shm", p, size) / best(table, "mpi", p, size)
            verdict = "within 3x of" if ratio < 3 else "more than 3x slower than"
            want = f"on this run, p={p}, {size // KB} KB: "
            line = next(x for x in lines if x.startswith(want))
            assert line.endswith(f"course_lib is {verdict} MPICH"), (line, ratio)
    for size in (MB, 4 * MB, 16 * MB):
        ratio = best(table, "mpi", 2, size) / best(table, "shm", 2, size)
        line = next(x for x in lines if x.startswith(f"on this run, p=2, {size // MB} MB: "))
        assert f"course_lib is {'faster' if ratio > 1 else 'slower'} than MPICH ({ratio:.2f}x)" in line, line


@needs_mpi
def test_the_text_claims_nothing_about_mpich_that_this_run_must_show(run):
    """Claims that depend on the machine's load are printed verdicts, not fixed prose."""
    _, _, text, _ = run
    assert "it comes within 3x of MPICH" not in text
    assert "course_lib stays within 3x of MPICH" not in text
    assert "the cell below prints the verdict" in text


def test_memcpy_beats_every_allreduce_from_1_mb_up(run):
    """The plot calls memcpy the ceiling and the text claims it "from 1 MB up ... by a wide
    margin". Once a 64 KB memcpy was beaten (20.6 against 23.6 us): its two buffers sat 16 bytes
    apart modulo 4096 and the copy ran at 3 GB/s instead of 33 (4K aliasing). Measured between
    unaliased buffers, memcpy stays above every engine at every size."""
    table, _, text, _ = run
    assert "from 1 MB up memcpy beats every allreduce" in text
    for i, size in enumerate(SIZES):
        for key in table:
            if isinstance(key, tuple):
                margin = 2 if size >= MB else 1
                assert table[key][i]["best"] > margin * table["memcpy"][i]["best"], (key, size)


def test_the_memcpy_ceiling_is_measured_between_unaliased_buffers():
    """Source and destination 2048 bytes apart modulo a 4 KB page, whatever the size."""
    from course_lib.beyond_one_machine.allreduce_benchmark import unaliased_pair

    for nbytes in (4 * 2 ** 10, 64 * 2 ** 10, MB, 3 * MB + 4):
        src, dst = unaliased_pair(nbytes)
        assert src.nbytes == dst.nbytes == nbytes // 4 * 4
        assert (dst.ctypes.data - src.ctypes.data) % 4096 == 2048
        np.copyto(dst, src)
        assert np.array_equal(dst, src)


def test_the_printed_sizes_where_the_ring_is_slowest_are_the_tables(run):
    """"the cell below prints the sizes at which the ring was the slowest on this run"."""
    table, _, text, printed = run
    assert "is usually the slowest engine" in text and "slowest engine at every size" not in text
    others = [e for e in ("shm", "shm_pipes", "mpi") if (e, 2) in table]
    want = [s for s in SIZES if all(best(table, "ring", 2, s) > best(table, e, 2, s) for e in others)]
    line = next(x for x in printed.splitlines() if x.startswith("on this run, p=2, the ring over Pipes"))
    assert line.endswith(", ".join(f"{s // KB:,} KB" for s in want) or "no size"), (line, want)
    # at 4 KB every engine but the ring waits on shared counters or in MPICH: a margin of 2x
    assert best(table, "ring", 2, 4 * KB) > 2 * best(table, "shm", 2, 4 * KB)




def test_the_setup_cell_finds_the_course_from_any_working_directory(tmp_path):
    """Jupyter may start anywhere: the first code cell locates examples/ and the figures folder
    from course_lib's own location, not from the working directory."""
    import subprocess
    import sys

    import nbformat

    from common import REPO

    cell = next(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code")
    probe = cell + "\nprint(ROOT, FIGURES)\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    root, figures = out.stdout.strip().splitlines()[-1].split()
    assert root == str(REPO.resolve()) and figures == str(REPO.resolve() / "notebooks" / "figures")
    assert not any(tmp_path.iterdir()), "the cell wrote into the working directory"


# ---------------------------------------------------------------- 3. real links, from the hardware table
def test_the_hardware_table_and_the_predicted_allreduce_are_the_libraries(run, ran):
    from course_lib import costs, hardware

    _, _, text, printed = run
    assert hardware.table_text() in printed
    v = ran.values
    for link in hardware.links():
        want = costs.predict("allreduce", "ring", v["RANKS"], v["GRADIENT_BYTES"], costs.preset(link.key))
        assert v["ring_s"][link.key] == want
        assert f"  {link.name:<40} {want * 1e3:9.2f} ms" in printed
    slowest, fastest = max(v["ring_s"], key=v["ring_s"].get), min(v["ring_s"], key=v["ring_s"].get)
    assert (slowest, fastest) == ("1gbe", "nvlink4")
    assert "same table lesson 00 draws" in text


# ---------------------------------------------------------------- 4. gang scheduling
def _printed_line(printed, start):
    found = [x for x in printed.splitlines() if x.startswith(start)]
    assert len(found) == 1, (start, found)
    return found[0]


def _both_done(jobs, wait, policy):
    runs = jobs[wait, policy].values()
    if policy == "alone":
        return sum(r.last_end - r.first_begin for r in runs)
    return max(r.last_end for r in runs) - min(r.first_begin for r in runs)


def test_two_jobs_ran_on_real_workers_with_every_step_reduced(ran):
    jobs = ran.values["jobs"]
    steps = ran.values["STEPS"]
    assert set(jobs) == {(w, p) for w in ("spin", "block") for p in ("alone", "uncoordinated", "gang")}
    for runs in jobs.values():
        for job in runs.values():
            assert job.done.shape == (2, steps)
            assert job.messages[0, 1] == job.messages[1, 0] == steps     # one message each way per step
            assert all(np.allclose(row["grad"], 0.5) for row in job.results)


def test_under_gang_scheduling_each_job_advances_only_in_its_own_slices(ran):
    """"each job advances in bursts, only in its own slices; the other job is frozen meanwhile"."""
    v = ran.values
    for wait in ("spin", "block"):
        gang_slices = v["slices"][wait, "gang"]
        assert {g for g, _, _ in gang_slices} == {0, 1}
        for group, name in enumerate(("A", "B")):
            assert v["jobs"][wait, "gang"][name].in_slices(gang_slices, group) > 0.9, (wait, name)
        assert v["slices"][wait, "uncoordinated"] == []


def test_the_text_makes_no_claim_on_which_policy_finishes_first(ran):
    """On a shared machine either can (measured: gang 0.91 s vs 1.37 s uncoordinated under load,
    0.89 s vs 0.39 s on a quieter moment): the notebook prints it, the text explains why."""
    assert "depends on the machine, and the cell prints it for this run" in ran.markdown
    assert "spend more time inside the allreduce" not in ran.markdown


def test_spinning_burns_more_cpu_than_blocking(ran):
    """"the spinning workers burn several times more CPU inside the allreduce than the blocking
    ones" (measured: 0.24-0.40 s against 0.03-0.06 s)."""
    v = ran.values
    assert v["spin_cpu"] > 3 * v["block_cpu"], (v["spin_cpu"], v["block_cpu"])
    line = _printed_line(ran.printed, "on this run, uncoordinated: waiting workers burned")
    assert line == (f"on this run, uncoordinated: waiting workers burned {v['spin_cpu']:.2f} s of CPU spinning, "
                    f"{v['block_cpu']:.2f} s blocking")


def test_the_printed_verdicts_on_gang_scheduling_are_the_runs(ran):
    jobs = ran.values["jobs"]
    for wait in ("spin", "block"):
        gang, free = _both_done(jobs, wait, "gang"), _both_done(jobs, wait, "uncoordinated")
        line = _printed_line(ran.printed, f"on this run, {wait}: gang scheduling finished")
        assert line.endswith(f"(gang {'faster' if gang < free else 'slower'}, {free / gang:.2f}x)"), line
        assert f"in {gang:.2f} s, uncoordinated in {free:.2f} s" in line


def test_a_late_worker_holds_the_first_one_and_spinning_burns_its_core(ran):
    """"Rank 0 held its core for the whole delay either way; spinning, it also burned CPU"."""
    v = ran.values
    delay, late = v["DELAY"], v["late"]
    for wait, job in late.items():
        assert job.wait[0, 0] >= 0.9 * delay, (wait, job.wait[0, 0])
        assert job.begin[1] - job.begin[0] >= 0.9 * delay
        line = _printed_line(ran.printed, f"on this run, {wait}: rank 0 waited")
        assert f"waited {job.wait[0, 0]:.2f} s" in line and f"burned {job.cpu_wait[0, 0]:.2f} s of CPU" in line
    assert late["spin"].cpu_wait[0, 0] > late["block"].cpu_wait[0, 0]
    assert late["block"].cpu_wait[0, 0] < 0.1 * delay


def test_a_spinning_step_waits_longer_uncoordinated(ran):
    """"with spinning workers a step waits far longer in the allreduce uncoordinated than
    gang-scheduled on a quiet machine" (measured: 3.1-7.1 ms against 0.18-2.0 ms, 3.5x to 32x;
    at load 5 on 2 cores 6.3 against 4.9 ms); with blocking workers the text claims nothing
    (2.3-8.5 ms against 0.16-3.8 ms). The printed lines must be the run's."""
    v = ran.values
    quiet = v["load"] < v["cores"]                              # usable cores, read by the notebook
    assert _printed_line(ran.printed, "load average during these runs:") == (
        f"load average during these runs: {v['load']:.1f} on {v['cores']} cores "
        f"({'a quiet' if quiet else 'a busy'} machine)")
    for wait in ("spin", "block"):
        for policy in ("uncoordinated", "gang"):
            runs = v["jobs"][wait, policy].values()
            groups = range(2) if policy == "gang" else [None, None]
            want = np.median(np.concatenate([run.step_waits(v["slices"][wait, policy], g)
                                             for g, run in zip(groups, runs)]))
            assert v["step_wait"][wait, policy] == want
        free, gang = v["step_wait"][wait, "uncoordinated"], v["step_wait"][wait, "gang"]
        line = _printed_line(ran.printed, f"on this run, {wait}: median wait per step")
        assert line.endswith(f"{free * 1e3:.2f} ms uncoordinated, {gang * 1e3:.2f} ms gang-scheduled "
                             f"({free / gang:.1f}x)"), line
    if quiet:
        free, gang = v["step_wait"]["spin", "uncoordinated"], v["step_wait"]["spin", "gang"]
        assert free > 2 * gang, (free, gang)
