"""Lesson 07: every sentence about the measured run holds on the notebook's own numbers.

The notebook is executed headless (as students run it), then its ``table`` (allreduce times
per engine, process count and size, from ``course_lib.allreduce_bench.compare``) is read back
and each claim of its text is checked. The machine is shared and noisy, so comparisons
carry margins; timing is only ever compared as ratios measured in the same run.
"""
from __future__ import annotations

import pytest

from course_lib.allreduce_bench import SIZES

from common import LOADED_BUDGET_S, NOTEBOOKS, needs_mpi

NOTEBOOK = NOTEBOOKS / "07_beyond_one_machine.ipynb"
KB, MB = 2 ** 10, 2 ** 20

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(NOTEBOOK.stem)]


@pytest.fixture(scope="module")
def run(executed_notebook):
    """The notebook executed once (shared with tests/test_notebooks.py): (table, seconds,
    text of its markdown, what it printed)."""
    ran = executed_notebook(NOTEBOOK)
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
    """Below 1 MB the data sit in the caches and two ranks, each reducing half, can come close
    to (and on one CI run beat, 20.6 against 23.6 us at 64 KB) a one-core memcpy: the text
    claims the ceiling only from 1 MB up, where every engine was 4x or more above it."""
    table, _, text, _ = run
    assert "from 1 MB up memcpy beats every allreduce" in text
    for i, size in enumerate(SIZES):
        if size < MB:
            continue
        for key in table:
            if isinstance(key, tuple):
                assert table[key][i]["best"] > table["memcpy"][i]["best"], (key, size)


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
