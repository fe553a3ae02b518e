"""Recorded cells, replayed (course_lib/replay.py), in an IPython shell of this process.

The whole path (a release built from recorded lessons, run by a real kernel) is checked by
tests/test_release_lessons.py; here each rule on its own: which names a cell changes, which errors
are a missing answer, and what a replayed cell does to the shell (its outcome, its output, its
values), and what it must not do (hide a real error)."""
from __future__ import annotations

import pickle
import zlib

import numpy as np
import pytest

from course_lib import replay
from course_lib.standin import message


def test_changed_names_are_what_a_cell_binds_or_changes_in_place():
    src = """
%matplotlib inline
import numpy as np
a, (b, c) = 1, (2, 3)
for i in range(3):
    d = i
with open(__file__) as fh:
    pass
table["x"] = 1
obj.attr = 2
total += 1
runs.append(4)
def helper(z):
    inner = z          # local: not the cell's
    return inner
squares = [k * k for k in range(3)]
print(untouched)
"""
    got = replay.changed_names(src)
    assert {"a", "b", "c", "i", "d", "fh", "table", "obj", "total", "runs", "squares"} <= got
    assert not {"inner", "z", "untouched", "print", "np"} & got
    assert replay.changed_names("def broken(:\n") == set()


def test_a_missing_answer_is_found_in_the_error_its_cause_or_a_workers_message():
    plain = NotImplementedError(message("ex04_1", "metropolis_weights"))
    assert replay.unsolved_question(plain) == "ex04_1"
    try:
        try:
            raise plain
        except NotImplementedError as e:
            raise RuntimeError("the server (rank 0) failed") from e
    except RuntimeError as wrapped:
        assert replay.unsolved_question(wrapped) == "ex04_1"
    worker = RuntimeError(f"rank 2 raised NotImplementedError: {message('ex05_1', 'ring_lookup')}")
    assert replay.unsolved_question(worker) == "ex05_1"
    assert replay.unsolved_question(ValueError("ex04_1 is wrong")) is None
    assert replay.unsolved_question(None) is None


@pytest.fixture
def shell(monkeypatch):
    """An IPython shell with replaying on, for lesson "04", with a recording of two cells."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"     # no history file in the user's home
    sh = InteractiveShell.instance(config=config)
    monkeypatch.setattr(replay, "_session", None)
    unsolved = f"raise NotImplementedError({message('ex04_1', 'metropolis_weights')!r})"
    first = f"def helper():\n    return 7\nW = np.eye(2)\n{unsolved}\n"
    second = "spectra = {'ring': W.sum()}\nprint(spectra)\n"
    recording = {
        replay.cell_key(first): {"outputs": [{"output_type": "stream", "name": "stdout", "text": "W recorded\n"}],
                                 "values": {"W": zlib.compress(pickle.dumps(np.full((2, 2), 0.5)))}},
        replay.cell_key(second): {"outputs": [{"output_type": "stream", "name": "stdout", "text": "{'ring': 2.0}\n"}],
                                  "values": {"spectra": zlib.compress(pickle.dumps({"ring": 2.0}))}},
    }
    sh.user_ns["np"] = np
    replay.install_replay("04", recording)
    yield sh, first, second
    sh.set_custom_exc((), None)
    sh.events.unregister("pre_run_cell", replay._pre_run_cell)
    sh.events.unregister("post_run_cell", replay._post_run_cell)
    del sh.showtraceback   # the instance attribute that wrapped the class's method
    InteractiveShell.clear_instance()


def test_a_cell_stopped_by_a_missing_answer_shows_its_recording_and_succeeds(shell, capsys):
    sh, first, _ = shell
    result = sh.run_cell(first)
    out = capsys.readouterr().out.replace("\x1b[2K\r", "")   # a terminal's clear_output
    assert result.success, "a replayed cell must not stop Run All"
    assert out.splitlines()[0].startswith(replay.BANNER) and "ex04_1" in out and "metropolis_weights" in out
    assert "W recorded" in out
    assert np.array_equal(sh.user_ns["W"], np.full((2, 2), 0.5)), "the recorded value replaces the live one"
    assert sh.user_ns["helper"]() == 7, "the cell's defs run again"
    assert replay.replayed_cells() == [(replay.cell_key(first), "ex04_1")]


def test_a_real_error_is_shown_and_fails_the_cell(shell, capsys):
    sh, _, _ = shell
    result = sh.run_cell("x = 1 / 0\n")
    assert not result.success
    out = capsys.readouterr()
    assert "ZeroDivisionError" in out.out + out.err and replay.BANNER not in out.out
    assert replay.replayed_cells() == []


def test_a_knock_on_error_is_replayed_only_after_a_replayed_cell(shell, capsys):
    sh, first, second = shell
    sh.user_ns.pop("W", None)
    knock_on = second.replace("W.sum()", "missing_name")
    recording = replay._session.cells
    recording[replay.cell_key(knock_on)] = recording[replay.cell_key(second)]
    assert not sh.run_cell(knock_on).success, "no cell was replayed yet: a NameError is the student's"
    capsys.readouterr()
    assert sh.run_cell(first).success
    result = sh.run_cell(knock_on)
    out = capsys.readouterr().out
    assert result.success and "builds on it" in out and sh.user_ns["spectra"] == {"ring": 2.0}


def test_an_edited_cell_has_no_recording_and_names_the_exercise(shell, capsys):
    sh, first, _ = shell
    result = sh.run_cell(first + "# edited\n")
    assert not result.success
    out = capsys.readouterr()
    assert "metropolis_weights is what exercise ex04_1 asks you to write" in out.out + out.err


def test_a_widget_callback_that_needs_a_missing_answer_says_so_in_one_line(shell, capsys):
    sh, _, _ = shell
    try:
        raise NotImplementedError(message("ex04_2", "mixing_rate"))
    except NotImplementedError:
        sh.showtraceback()
    out = capsys.readouterr().out
    assert out.strip() == ("This widget runs on your answer to ex04_2: solve it (and save the exercise notebook) "
                           "to use it.")


def test_while_recording_every_reference_answer_notes_its_call_from_any_process(tmp_path):
    """The recording keeps only the cells that ran an answer: each answer, imported anywhere in the
    library (here through lesson 04's wrapper, in the parent and in forked and spawned workers),
    appends its question id to the recording folder's log."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import networkx as nx
        import course_lib.gossip as gs
        from course_lib import Cluster

        def ask(comm):
            return float(gs.metropolis_hastings(nx.cycle_graph(4))[0, 1])

        if __name__ == "__main__":
            gs.metropolis_hastings(nx.cycle_graph(4))                 # ex04_1, in this process
            for method in ("fork", "spawn"):
                with Cluster(2, start_method=method) as c:
                    assert c.run(ask) == [1 / 3, 1 / 3]
    """)
    env = dict(os.environ, **{replay.RECORD_ENV: str(tmp_path)})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls = (tmp_path / replay.CALLS_LOG).read_text().split()
    assert calls == ["ex04_1"] * 5, calls
    proc = subprocess.run([sys.executable, "-c", "import course_lib.reference.ex04 as m; print(m.metropolis_weights)"],
                          env={k: v for k, v in env.items() if k != replay.RECORD_ENV}, capture_output=True, text=True)
    assert "traced" not in proc.stdout, "outside a recording the answers are not wrapped"


def test_merge_keeps_only_the_cells_the_kernel_listed(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a = 1"), nbformat.v4.new_code_cell("b = answer()")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    for cell in nb.cells:
        replay.record_cell(tmp_path, cell.source, {"a": 1, "b": np.arange(3)})
    (tmp_path / "cells.txt").write_text(replay.cell_key("b = answer()") + "\n")
    merged = replay.merge_recording(nb, tmp_path)
    assert list(merged) == [replay.cell_key("b = answer()")]
    entry = merged[replay.cell_key("b = answer()")]
    assert entry["outputs"][0]["text"] == "hi\n" and np.array_equal(replay.unpack(entry["values"]["b"]), np.arange(3))
    missing = replay.record_cell(tmp_path, "big = make()", {"big": np.random.default_rng(0).random(400_000)})
    assert missing == {"big"}, "a value over the cap is reported, so the cells that read it are recorded"
