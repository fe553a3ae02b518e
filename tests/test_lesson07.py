"""Lesson 07: the notebook finds the course from any folder, its link table covers the benchmark's sizes, and
its text makes no fixed claim that a run on a shared machine may contradict.

What the notebook says about its own run is stated through course_lib.claims: the facts (the same
program on both engines, the predicted cost of each link, the gang-scheduled jobs' steps, a late
worker's wait) and the verdicts read off its measured timings (the allreduce engines against each
other, memcpy and MPICH; which scheduling policy finished first) are checked on the run by
tests/test_claims.py::test_every_claim_of_the_lesson_holds_on_its_own_run[07_beyond_one_machine].
"""
from __future__ import annotations

import numpy as np
import pytest

from course_lib import claims
from course_lib.beyond_one_machine import SIZES

from common import NOTEBOOKS, needs_mpi

NOTEBOOK = NOTEBOOKS / "07_beyond_one_machine.ipynb"
MB = 2 ** 20

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


def test_the_link_table_covers_the_benchmarks_sizes(ran):
    assert ran.values["table"]["sizes"] == SIZES


def test_the_text_leaves_what_depends_on_the_load_to_the_printed_verdicts(ran):
    text = ran.markdown
    assert "which is why it wins on one machine" not in text and "On one machine shared memory wins;" not in text
    # fixed numbers that a run contradicted: course_lib 3.7-21x faster than MPICH, winning at 64 KB and
    # losing at 16 MB, 14x memcpy's time at 64 KB, MPICH at 9-12.5 us for 4 KB
    for fixed in ("within 3x", "from 1 MB up** it can be faster", "from about 1 MB up", "close to a one-core memcpy",
                  "MPICH takes a few microseconds", "more than twice as slow"):
        assert fixed not in text, fixed
    assert "beyond the spread of the tries" in text and "the cell below prints, size by size" in text
    assert "is usually the slowest engine" in text and "slowest engine at every size" not in text
    # which scheduling policy finishes first: either can on a shared machine (measured: gang 0.91 s
    # against 1.37 s uncoordinated under load, 0.89 s against 0.39 s on a quieter moment)
    assert "depends on the machine, and the cell prints it for this run" in text
    assert "spend more time inside the allreduce" not in text
    # gang scheduling ahead of the jobs run alone (0.56 s against 0.65 s on a busy machine) is explained
    assert "It can even be gang scheduling ahead of the two jobs run **alone**" in text


def test_the_machine_load_is_measured_before_the_runs_not_read_from_a_load_average(ran):
    """A 1-minute load average read after the benchmark mostly counts the benchmark: the notebook
    measures the cores other processes kept busy, from /proc/stat while it sleeps, before each part."""
    import inspect

    from course_lib.beyond_one_machine import machine_load

    for name in ("before_benchmark", "background"):
        seen = ran.values[name]
        assert seen["source"] in ("/proc/stat", "load average") and 0 <= seen["busy"] <= seen["cpus"], seen
    code = "\n".join(c.source for c in ran.notebook.cells if c.cell_type == "code")
    assert "getloadavg" not in code
    assert code.index("before_benchmark = busy_cores()") < code.index("table = compare(")
    assert code.index("background = busy_cores()") < code.index("run_jobs(")
    assert "time.sleep(window)" in inspect.getsource(machine_load.busy_cores)


def test_gang_against_alone_is_a_verdict_with_the_waits_that_explain_it(ran):
    """Gang scheduling once finished two jobs sooner than the same jobs run alone one after the other;
    the notebook says which finished first on its run, beyond the spread of one run, and the median
    wait per step alone and gang-scheduled that explains it."""
    records = [r for r in claims.records(ran.notebook) if r["kind"] == "verdict"]
    first = [r for r in records if r["numbers"].get("other") == "alone"]
    waits = [r for r in records if "ms alone" in r["if_true"]]
    assert len(first) == 2 and len(waits) == 2, [r["text"] for r in records]


def test_one_colour_per_engine_in_both_figures(ran):
    """The line chart and the bar widget take an engine's colour from the module's one mapping."""
    from course_lib.beyond_one_machine import ENGINE_COLORS, ENGINE_MARKERS, ENGINE_NAMES

    assert ENGINE_COLORS.keys() == ENGINE_MARKERS.keys() == ENGINE_NAMES.keys()
    assert len(set(ENGINE_COLORS.values())) == len(ENGINE_COLORS)
    figures = [c.source for c in ran.notebook.cells if c.cell_type == "code"
               and ("ax.loglog" in c.source or "ax.barh" in c.source)]
    assert len(figures) == 2
    for source in figures:
        assert "ENGINE_COLORS[" in source and "tab:" not in source


@needs_mpi
def test_with_mpi_the_notebook_states_its_verdicts_on_mpich(ran):
    """At every size, p = 2 and 4: which engine was faster beyond the spread of the tries (its median
    try below the other's best), or neither; the generic test checks each against its numbers."""
    on_mpich = [r for r in claims.records(ran.notebook) if r["kind"] == "verdict" and "MPICH" in r["text"]]
    assert len(on_mpich) == 2 * len(SIZES), [r["text"] for r in on_mpich]
    for r in on_mpich:
        n = r["numbers"]
        ahead_median, behind_best = ((n["shm_median"], n["mpi"]) if n["ahead"] == "course_lib"
                                     else (n["mpi_median"], n["shm"]))
        assert r["holds"] == (ahead_median < behind_best), r["text"]


def test_the_memcpy_ceiling_is_measured_between_unaliased_buffers():
    """Source and destination 2048 bytes apart modulo a 4 KB page, whatever the size: once a 64 KB
    memcpy was beaten (20.6 against 23.6 us) because its buffers sat 16 bytes apart modulo 4096 and
    the copy ran at 3 GB/s instead of 33 (4K aliasing)."""
    from course_lib.beyond_one_machine.allreduce_benchmark import unaliased_pair

    for nbytes in (4 * 2 ** 10, 64 * 2 ** 10, MB, 3 * MB + 4):
        src, dst = unaliased_pair(nbytes)
        assert src.nbytes == dst.nbytes == nbytes // 4 * 4
        assert (dst.ctypes.data - src.ctypes.data) % 4096 == 2048
        np.copyto(dst, src)
        assert np.array_equal(dst, src)


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


def test_the_printed_link_table_is_the_librarys_the_same_lesson_00_draws(ran):
    from course_lib import hardware

    assert hardware.table_text() in ran.printed
    assert "same table lesson 00 draws" in ran.markdown
