"""The sandbox around one submission (course_lib/grading/sandbox.py, channel.py, plain.py): what the
kernel sends back is read within bounds, every read and write has a deadline, the submission's
total time is a deadline across cells, checks and attempts, and each sandbox gets a fair share of
the CPU. Each test grades a small notebook in the real sandbox."""
from __future__ import annotations

import os
import select
import threading
import time

import nbformat
import pytest

from course_lib.grading import channel
from course_lib.grading.registry import Question
from course_lib.grading.sandbox import GRACE, Limits, cell_name, code_cells, grade_notebook

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    from course_lib.grade import grading_library

    return grading_library(tmp_path_factory.mktemp("library"))


def notebook(*cells):
    """A notebook of code cells, with a markdown cell before each (JupyterLab does not number those)."""
    nb = nbformat.v4.new_notebook()
    for src in cells:
        nb.cells += [nbformat.v4.new_markdown_cell("Some text."), nbformat.v4.new_code_cell(src)]
    return nb


def calls(name: str, qid: str, timeout: float = 20.0) -> Question:
    """A question whose check calls the student's ``name()`` once."""
    def check(ns):
        ns[name]()
    return Question(qid, 1, f"call {name}", names=(name,), timeout=timeout, visible=[check])


def graded(nb, questions, library, limits, wall: float):
    """grade_notebook in a thread, failing (not hanging) if it has not returned within ``wall`` seconds."""
    box = {}

    def run():
        try:
            box["grade"] = grade_notebook(nb, questions, library, limits)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(wall)
    assert not t.is_alive(), f"grading did not finish within {wall:g} s"
    assert "error" not in box, f"grading raised {box['error']!r}"
    return box["grade"], time.monotonic() - t0


# -- 1. what comes back is read within bounds ------------------------------------------------

# Replaces the kernel's channel.send: the next replies of the listed ops are raw bodies, as a
# student who rewrites the kernel could send (encode would refuse them).
FORGE = r'''
import json, os, struct
import course_lib.grading.channel as _ch
_M = 2**61 - 1
def _result(value):   # a reply as the channel encodes it (a tagged dict), around a raw value
    return '{"__t":"dict","v":[["op","result"],["observed",false],["value",' + value + ']]}'
_forged = [
    ("cell_done", "[" * 50000 + "]" * 50000),
    ("result", _result("[" * 40 + "1" + "]" * 40)),
    ("result", _result(json.dumps({"__t": "complex", "re": 10**400, "im": 0}))),
    ("result", _result(json.dumps({"__t": "set", "v": [k * _M for k in range(60000)]}))),
    ("result", _result("1" + "0" * 4100)),
]
_send = _ch.send
def _forging_send(fd, message, timeout=None):
    if _forged and message.get("op") == _forged[0][0]:
        body = _forged.pop(0)[1].encode()
        os.write(fd, struct.pack(">I", len(body)) + body)
        return
    _send(fd, message, timeout)
_ch.send = _forging_send
'''

DEFS = "def f1(): return 1\ndef f2(): return 2\ndef f3(): return 3\ndef f4(): return 4\ndef f5(): return 5"


def test_undecodable_replies_fail_their_question_with_a_sentence(library):
    """Before: the forged cell reply's RecursionError ended grade_notebook (and the batch), and the
    set of equal hashes hung it."""
    nb = notebook(FORGE, DEFS)
    qs = [calls(f"f{k}", f"ex99_{k}") for k in range(1, 6)]
    g, wall = graded(nb, qs, library, Limits(cell_timeout=10, total_timeout=120), 100)
    msg = {qid: r.message for qid, r in g.results.items()}
    assert g.results["ex99_1"].status == "failed" and "nested deeper than 32 levels" in msg["ex99_1"], msg
    assert "too large for a float" in msg["ex99_2"], msg
    assert "same hash" in msg["ex99_3"], msg
    assert "more than 4000 digits" in msg["ex99_4"], msg
    assert g.results["ex99_5"].passed, msg     # the channel stayed in step
    first = "code cell 1 (`import json, os, struct`)"
    assert any(n.startswith(first) and "nested deeper" in n for n in g.notes), g.notes
    assert all(r.points == 0 for qid, r in g.results.items() if qid != "ex99_5")
    print(f"graded in {wall:.1f} s")


# -- 2. every write has a deadline -------------------------------------------------------------

STALL = r'''
import json, os, signal, struct, sys, time
_fd = int(sys.argv[2])
for _k in range(40):
    _b = ('{"__t":"dict","v":[["op","cell_done"],["index",%d],["error",null]]}' % _k).encode()
    os.write(_fd, struct.pack(">I", len(_b)) + _b)
signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
time.sleep(3600)
'''


def test_a_kernel_that_stops_reading_cannot_block_the_grader(library):
    """Forged cell-done messages, then a sleep with the alarm off: the grader's writes of the next
    (large) cells fill the pipe. Before, the grader blocked for ever in os.write."""
    big = "x = 1\n" + "# padding\n" * 8000     # 80 kB: more than a pipe holds
    nb = notebook(STALL, big, big, big, "def f1(): return 1")
    g, wall = graded(nb, [calls("f1", "ex99_1")], library, Limits(cell_timeout=4, total_timeout=40), 90)
    assert set(g.results) == {"ex99_1"} and g.results["ex99_1"].points == 0
    assert wall < 40 + 2 * GRACE + 10, wall
    assert any("stopped reading the grader's requests" in n for n in g.notes), g.notes


def test_send_gives_up_at_its_deadline():
    r, w = os.pipe()
    try:
        t0 = time.monotonic()
        with pytest.raises(channel.ChannelTimeout):
            channel.send(w, {"op": "cell", "source": "#" * 1_000_000}, timeout=0.5)
        assert 0.4 < time.monotonic() - t0 < 2
    finally:
        os.close(r)
        os.close(w)


def test_recv_reports_a_whole_bad_message_and_stays_in_step():
    r, w = os.pipe()
    try:
        body = b"[" * 1000 + b"]" * 1000
        good = b'{"__t":"dict","v":[["op","ok"]]}'
        os.write(w, len(body).to_bytes(4, "big") + body + len(good).to_bytes(4, "big") + good)
        with pytest.raises(channel.BadMessage, match="nested deeper"):
            channel.recv(r, timeout=2)
        assert channel.recv(r, timeout=2) == {"op": "ok"}
        assert not select.select([r], [], [], 0)[0]
    finally:
        os.close(r)
        os.close(w)


# -- 3. limits are totals -----------------------------------------------------------------------

def test_the_total_time_is_a_deadline_across_cells(library):
    """Six 7-second cells against a 20-second total: before, 45 s (the total was checked between
    attempts only); now each cell gets min(cell limit, time left)."""
    nb = notebook(*["import time\ntime.sleep(7)"] * 6, "def f1(): return 1")
    limits = Limits(cell_timeout=10, total_timeout=20)
    g, wall = graded(nb, [calls("f1", "ex99_1")], library, limits, 120)
    print(f"graded in {wall:.1f} s (total limit 20 s)")
    assert wall < 20 + GRACE + 3, wall
    r = g.results["ex99_1"]
    assert r.status == "timeout" and "total time (20 s" in r.message, r.message
    assert any("code cell 3" in n and "total time" in n for n in g.notes), g.notes


def test_the_total_time_bounds_the_checks_too(library):
    """A question's own limit (20 s) is cut to what is left of the total."""
    nb = notebook("def slow():\n    import time\n    time.sleep(30)", "def f2(): return 2")
    qs = [calls("slow", "ex99_1", timeout=20), calls("f2", "ex99_2")]
    g, wall = graded(nb, qs, library, Limits(cell_timeout=10, total_timeout=12), 60)
    assert wall < 12 + GRACE + 3, wall
    assert g.results["ex99_1"].status == "timeout" and "total time" in g.results["ex99_1"].message
    assert g.results["ex99_2"].status == "timeout" and "total time" in g.results["ex99_2"].message


# -- 5. feedback names code cells as JupyterLab numbers them ---------------------------------------

def test_cells_are_named_by_their_code_cell_number_and_first_line():
    nb = notebook("import numpy as np", "", "\n\ndef f(x):\n    return x")
    assert [(n, s.strip().splitlines()[0]) for _, n, s in code_cells(nb)] == [(1, "import numpy as np"),
                                                                               (2, "def f(x):")]
    assert cell_name(2, "\n\ndef f(x):\n    return x") == "code cell 2 (`def f(x):`)"


# -- 4. a fair share of the CPU per sandbox ---------------------------------------------------------

def _with_hog(tmp_path):
    """A folder with the cpu_hog fixture in exercise 00 and the lesson 02 solution."""
    import re

    from common import EXERCISES, FIXTURES, SOLUTIONS

    body = "\n".join(line for line in (FIXTURES / "hostile" / "cpu_hog.py").read_text().splitlines()
                     if not re.match(r"^#\s*(base|action|expect[-a-z]*):", line))
    nb = nbformat.read(next(EXERCISES.glob("00_*.ipynb")), as_version=4)
    k = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "from course_lib import" in c.source)
    nb.cells.insert(k + 1, nbformat.v4.new_code_cell(body))
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(nb, subs / "00_hog.ipynb")
    victim = next(SOLUTIONS.glob("02_*.ipynb"))
    (subs / "02_victim.ipynb").write_bytes(victim.read_bytes())
    return subs


@pytest.mark.timing
def test_a_cpu_hog_graded_beside_costs_a_correct_answer_nothing(tmp_path):
    """128 busy processes in one sandbox, the lesson 02 solution in the other (--jobs 2): each sandbox
    has the same cpu cgroup weight, so the solution keeps full marks (before: 7/10, its answers timed
    out). Where no cpu cgroup can be made (not root), there is no fair share to test."""
    from course_lib.grade import grade_paths
    from course_lib.grading.sandbox import _SandboxCgroups

    probe = _SandboxCgroups()
    mechanism = probe.mechanism
    probe.remove()
    if mechanism is None:
        pytest.skip("no cpu cgroup can be made here (cgroup v2 cpu.weight or v1 cpu.shares, as root)")
    subs = _with_hog(tmp_path)
    t0 = time.monotonic()
    rows = {r["submission"]: r for r in grade_paths([subs], tmp_path / "out", Limits(), jobs=2, quiet=True)}
    wall = time.monotonic() - t0
    victim, hog = rows["02_victim"], rows["00_hog"]
    print(f"{mechanism}: victim {victim['score']:g}/{victim['max_score']:g} in {victim['elapsed']:.1f} s, "
          f"hog {hog['score']:g}/{hog['max_score']:g} in {hog['elapsed']:.1f} s, wall {wall:.1f} s")
    assert victim["score"] == victim["max_score"] > 0, [
        (q["qid"], q["message"]) for q in victim["questions"] if q["status"] != "passed"]
    assert hog["score"] == 0
