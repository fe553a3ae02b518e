"""The course runs on any core count: a 1-core container, a 2-core CI machine, a 16-core laptop.

Three parts:

* ``usable_cores`` honours ``COURSE_USABLE_CORES`` (and refuses anything but a positive integer),
  and lesson 00's probe, the one ceiling of every speedup, sizes itself from it;
* no lesson and no course_lib module asks the OS for a core count behind ``probe.usable_cores``'s
  back (a grep), and no lesson's text names a fixed core count;
* the lessons whose code reads the core count execute with COURSE_USABLE_CORES=1 and =16 on this
  machine, without an error cell, and their core-dependent verdicts agree with what they printed.
  Lessons 00 (the probe), 01 (the speedup sweep) and 07 (the cores it prints and its load
  verdict) run whole. Lesson 08 reads the count in one early cell (it prints it) and then runs
  fixed worker counts, so only its cells up to that one run here (seconds, not its minute).
  Lessons 02 to 06 are left out: they run fixed worker counts and no code cell of theirs reads
  the count (checked below), so the variable cannot change them, and running them again would
  only cost minutes (each passes its own claim tests at COURSE_USABLE_CORES=1 and =16 and with
  the process bound to one core, `taskset -c 0`).
  The variable sizes what a lesson *plans*; what it *measures* is still this machine.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from course_lib import probe

from common import EXERCISES, NOTEBOOKS, REPO, SOLUTIONS, cells_reached, execute_notebook, line

CORE_COUNTS = (1, 16)


# ---------------------------------------------------------------- usable_cores and the probe
@pytest.mark.parametrize("given, want", [("1", 1), ("2", 2), ("16", 16), (" 8 ", 8)])
def test_usable_cores_honours_the_variable(monkeypatch, given, want):
    monkeypatch.setenv(probe.CORES_VARIABLE, given)
    assert probe.usable_cores() == want


@pytest.mark.parametrize("given", ["0", "-2", "2.5", "two", "", "1e3"])
def test_usable_cores_refuses_anything_but_a_positive_integer(monkeypatch, given):
    monkeypatch.setenv(probe.CORES_VARIABLE, given)
    with pytest.raises(ValueError, match=probe.CORES_VARIABLE):
        probe.usable_cores()


def test_without_the_variable_usable_cores_is_the_affinity_mask(monkeypatch):
    import os

    monkeypatch.delenv(probe.CORES_VARIABLE, raising=False)
    if hasattr(os, "sched_getaffinity"):
        assert probe.usable_cores() == len(os.sched_getaffinity(0))
    else:
        assert probe.usable_cores() == probe.logical_cores()


@pytest.mark.parametrize("cores, workers", [(1, 2), (2, 3), (4, 5), (16, probe.PROBE_CAP)])
def test_the_probe_tries_one_worker_more_than_the_cores_at_least_2_at_most_the_cap(monkeypatch, cores, workers):
    """Lessons 00 and 01 both call measured_parallelism: one function, one ceiling."""
    seen = {}
    monkeypatch.setenv(probe.CORES_VARIABLE, str(cores))
    monkeypatch.setattr(probe, "effective_parallelism", lambda **kw: seen.update(kw) or {"effective_cores": 1.0})
    probe.measured_parallelism()
    assert seen["max_workers"] == workers


# ---------------------------------------------------------------- greps
# Where course_lib may still ask the OS itself, and why: pinning needs the real CPU ids, the
# runtime's spin-or-yield choice needs the real CPUs (told 16 cores on 2, its ranks would spin
# on each other), and the grader's job count is not a lesson's.
ALLOWED_OS_READS = {
    "course_lib/probe.py": "the one home of the core count",
    "course_lib/runtime/shm_sync.py": "spin or yield: needs the CPUs this process really has",
    "course_lib/beyond_one_machine/allreduce_benchmark.py": "binds rank r to a real CPU id",
    "course_lib/beyond_one_machine/gang_scheduling.py": "binds rank r to a real CPU id",
    "course_lib/beyond_one_machine/machine_load.py": "how busy the CPUs this process may run on really are",
    "course_lib/grade.py": "how many notebooks the grader runs at once",
}
OS_READ = re.compile(r"cpu_count\s*\(|sched_getaffinity|multiprocessing\.cpu_count|psutil\.cpu_count")


def _notebooks():
    return sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(SOLUTIONS.glob("*.ipynb")) + sorted(EXERCISES.glob("*.ipynb"))


def _code(path):
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def test_no_lesson_asks_the_os_for_its_cores():
    """A notebook that read os.cpu_count() would size its sweep by the logical CPUs, not the ones
    it may use, and would ignore COURSE_USABLE_CORES: the tests at 1 and 16 cores would not see it."""
    found = [str(p.relative_to(REPO)) for p in _notebooks() if OS_READ.search(_code(p))]
    assert not found, f"use course_lib.probe.usable_cores() instead in {found}"


def test_course_lib_asks_the_os_only_where_it_must():
    found = sorted(str(p.relative_to(REPO)) for p in (REPO / "course_lib").rglob("*.py")
                   if OS_READ.search(p.read_text()))
    unexpected = [p for p in found if p not in ALLOWED_OS_READS]
    assert not unexpected, f"{unexpected} read the core count from the OS; call course_lib.probe.usable_cores()"


# The course was written on 2 cores: these are the forms its fixed count took.
FIXED_COUNT = re.compile(r"\b(2|two) cores\b|\b2-core\b|cores\s*==\s*\d|cpu_count\(\)\s*==")


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_lesson_names_a_fixed_core_count(path):
    """"2 cores" in a lesson is false on every other machine: the number must come from the run."""
    nb = nbformat.read(path, as_version=4)
    said = [m.group(0) for c in nb.cells for m in FIXED_COUNT.finditer(c.source)]
    assert not said, f"{path.name} names fixed core counts: {said}"


# ---------------------------------------------------------------- the lessons at 1 and 16 cores
def _check_00(ran, cores):
    par = ran.values["par"]
    assert par["k"] == list(range(1, max(2, min(cores + 1, probe.PROBE_CAP)) + 1))
    assert ran.values["effective_cores"] == max(par["speedup"])
    assert f"this process may use {cores})" in line(ran, "effective parallelism measured:")


def _check_01(ran, cores):
    v = ran.values
    ps, speedup, n, e = v["ps"], v["speedup"], v["n_cores"], v["cores"]
    assert v["usable"] == cores and ps == list(range(1, max(2, min(2 * cores, v["SWEEP_CAP"])) + 1))
    assert e == v["probed"]["effective_cores"] and n == min(max(1, int(e + 0.5)), ps[-1])
    said = [x for x in ran.printed.splitlines() if x.startswith("latency ") and " us, bandwidth " in x]
    assert len(said) == 1 and f"usable cores {cores} " in said[0], said
    assert line(ran, f"workers swept: p = 1 to {ps[-1]} ")
    beyond, tried = [p for p in ps if p > n], min(cores, v["probed"]["k"][-1])
    probe_got = e >= 0.8 * tried                # the probe found the usable cores free
    got = probe_got and speedup[n - 1] > 0.8 * n
    assert v["probe_got"] == probe_got and v["got_the_cores"] == got
    if not beyond:
        assert line(ran, f"The sweep ends at p = {ps[-1]}")
    elif got:
        t_shard = v["t_shard"]
        gain = {p: max(1.0, n * t_shard[n] / (p * t_shard[p])) for p in beyond}
        no_gain = all(speedup[p - 1] <= speedup[n - 1] * gain[p] * 1.1 for p in beyond)
        said = line(ran, f"At p = {n} (the {e:.2f} effective cores, rounded) the workers got their cores")
        assert f"within 10%): {no_gain} (" in said and all(f"{gain[p]:.2f}x at p = {p}" in said for p in beyond)
    else:
        assert f"the probe found {e:.2f} of the {tried} usable cores" in line(ran, "The machine is busy, or has")
    assert v["lat_ps"] == sorted({1, 2, ps[-1]}) and v["incast_ps"][-1] == max(4, ps[-1])
    if v["sweep_got_the_cores"]:
        assert f": {v['falls']} (measured" in line(ran, "At 8 ms the measured speedup is below")
    elif probe_got and n < 2:
        assert line(ran, f"With {e:.2f} effective cores the workers take turns on one core")
    else:
        assert line(ran, "The machine is busy (the probe found")


def _check_07(ran, cores):
    v = ran.values
    assert v["cores"] == cores
    assert line(ran, "measured on this machine (").startswith(f"measured on this machine ({cores} usable cores)")
    # how busy the machine was is measured (the CPUs this process may use, whatever the variable says)
    seen = v["background"]
    quiet = seen["busy"] < 0.25 * seen["cpus"]
    assert line(ran, "before these runs, other processes kept") == (
        f"before these runs, other processes kept {seen['busy']:.2f} of the {seen['cpus']} CPUs this notebook may "
        f"use busy (from {seen['source']} over {seen['window']} s): {'a quiet' if quiet else 'a busy'} machine")


def _check_08(ran, cores):
    assert ran.values["usable"] == cores
    assert line(ran, "usable cores:") == f"usable cores: {cores}"


CHECKS = {"00_cluster_in_your_laptop": _check_00, "01_mapreduce_gd": _check_01, "07_beyond_one_machine": _check_07,
          "08_data_parallelism_in_practice": _check_08}
# What reads the core count in a lesson's code (the OS itself is grepped for above).
READS_CORES = re.compile(r"usable_cores|measured_parallelism|effective_parallelism|probe\.describe|logical_cores|"
                         r"CORES_VARIABLE|COURSE_USABLE_CORES")


def cells_the_core_count_reaches(nb) -> list[int]:
    """The code cells whose results can depend on the core count, in order: those that read it
    (READS_CORES), then every later cell that reads a name one of them bound or changed."""
    return cells_reached(nb, lambda _, cell: READS_CORES.search(cell.source))


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_the_lessons_left_out_do_not_read_the_core_count(path):
    """Why lessons 02-06 are not run below: no code cell of theirs reads the core count."""
    nb = nbformat.read(path, as_version=4)
    reads = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and READS_CORES.search(c.source)]
    if path.stem not in CHECKS:
        assert not reads, f"{path.stem} reads the core count in cells {reads}: add it to CHECKS"


def test_the_cells_the_core_count_reaches_follow_the_names_it_binds():
    cell = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        cell("import numpy as np"),
        cell("cores = probe.usable_cores()\nsizes = [2 * cores]"),
        cell("fig, ax = plt.subplots()\nax.plot([1, 2])"),          # binds its own ax: not reached
        cell("def sweep():\n    return [s + 1 for s in sizes]"),  # a function reading `sizes`
        cell("table = sweep()"),                                    # reached through the function
        cell("print(len(table))"),
        cell("x = 3\nprint(x)"),
    ])
    assert cells_the_core_count_reaches(nb) == [1, 3, 4, 5]


@pytest.mark.slow
@pytest.mark.parametrize("cores", CORE_COUNTS)
@pytest.mark.parametrize("stem", list(CHECKS))
def test_the_lesson_runs_and_says_what_it_measured_at_any_core_count(stem, cores, monkeypatch):
    """Each lesson runs up to the last cell the core count can reach (cells_the_core_count_reaches):
    what comes after cannot change with it, and runs in every other test of the lesson."""
    monkeypatch.setenv(probe.CORES_VARIABLE, str(cores))     # the kernel inherits os.environ
    path = NOTEBOOKS / f"{stem}.ipynb"
    reached = cells_the_core_count_reaches(nbformat.read(path, as_version=4))
    ran = execute_notebook(path, cells=reached[-1] + 1)
    assert not ran.errors, f"{stem} at {probe.CORES_VARIABLE}={cores}: {ran.errors}"
    CHECKS[stem](ran, cores)
