"""The timeline's categories: a send blocked on a receiver that does not read is waiting, and each
instant of a rank's run is in exactly one category (what lesson 00's straggler figure and every
``course_lib.plot.timeline`` draw)."""
from __future__ import annotations

import time

import matplotlib
import numpy as np
import pytest

from course_lib import Cluster, Network, plot
from course_lib.runtime.trace import KINDS, Event, Timeline

from runtime_checks import assert_clean

matplotlib.use("Agg")

SLOW_READ_S = 0.3
BIG = 4_000_000 // 8  # 4 MB of float64: far more than a socket's buffer (about 200 KiB)


@pytest.fixture(scope="module")
def cluster():
    with Cluster(4, timeout=60) as c:
        yield c
    assert_clean()


def slow_reader(comm, n):
    """Rank 0 sends a large array to rank 1, which computes for SLOW_READ_S before it reads."""
    if comm.rank == 0:
        comm.send(np.ones(n), dest=1)
    elif comm.rank == 1:
        with comm.compute("busy"):
            time.sleep(SLOW_READ_S)
        comm.recv(source=0)


def shift_with_straggler(comm, rounds, n):
    """Lesson 00's program: compute, then pass an array round the ring with sendrecv."""
    a = np.ones(n)
    for r in range(rounds):
        with comm.compute(f"step {r}"):
            time.sleep(0.01)
        a = comm.sendrecv(a, dest=(comm.rank + 1) % comm.size, source=(comm.rank - 1) % comm.size)
    return float(a.sum())


def test_a_send_blocked_on_a_slow_receiver_is_mostly_waiting(cluster):
    res = cluster.run(slow_reader, BIG)
    mine = res.timeline.of(0)
    sends, waits = mine.of(kind="send"), mine.of(kind="wait")
    blocked = sum(e.duration for e in waits if e.label == "receiver" and e.peer == 1)
    # rank 1 read only after SLOW_READ_S: most of that, rank 0's write could not go on
    assert blocked >= 0.7 * SLOW_READ_S, (blocked, mine)
    assert blocked >= 0.8 * (blocked + mine.total("send")), mine
    assert sum(e.nbytes for e in sends) == BIG * 8          # the bytes are counted once, on the first piece
    assert sends[0].nbytes == BIG * 8 and sends[0].peer == 1
    ordered = sorted(mine, key=lambda e: e.start)
    assert all(a.end <= b.start + 1e-9 for a, b in zip(ordered, ordered[1:])), "one thread's events overlap"


def test_each_rank_categories_add_up_to_at_most_its_run():
    with Cluster(4, network=Network(latency=3e-3, bandwidth=100e6), slow={2: 5}, timeout=60) as c:
        res = c.run(shift_with_straggler, 3, 100_000)
    raw, flat = res.timeline, res.timeline.exclusive()
    for rank in range(4):
        total = sum(flat.total(kind, rank) for kind in KINDS)
        assert total <= res.wall_time + 1e-6, (rank, total, res.wall_time)
        assert total == pytest.approx(raw.busy(rank), rel=1e-9, abs=1e-9)
        ordered = sorted(flat.of(rank), key=lambda e: e.start)
        assert all(a.end <= b.start + 1e-9 for a, b in zip(ordered, ordered[1:])), rank
    # rank 1 sends to the straggler, which computes instead of reading: that time is waiting
    blocked = sum(e.duration for e in flat.of(1, "wait") if e.label == "receiver" and e.peer == 2)
    assert blocked > 2 * flat.total("send", 1), flat.of(1)
    # the straggler itself waits least
    waits = {r: flat.total("wait", r) for r in range(4)}
    assert waits[2] == min(waits.values()), waits


def test_exclusive_gives_each_instant_to_one_kind_work_first():
    events = Timeline([
        Event(0, "wait", 0.0, 4.0, "", 1),            # main thread waits for a message ...
        Event(0, "send", 1.0, 2.0, "", 2, 100),       # ... while a background thread sends
        Event(0, "recv", 3.0, 3.5, "", 1, 50),
        Event(0, "compute", 5.0, 6.0, "F0"),
        Event(0, "compute", 5.5, 6.5, "B0"),          # overlapping compute: the earlier keeps it
        Event(1, "send", 0.0, 1.0, "", 0, 8),
    ])
    flat = events.exclusive()
    assert flat.total("wait", 0) == pytest.approx(4.0 - 1.0 - 0.5)
    assert flat.total("send", 0) == pytest.approx(1.0) and flat.total("recv", 0) == pytest.approx(0.5)
    assert [(e.label, e.start, e.end) for e in flat.of(0, "compute")] == [("F0", 5.0, 6.0), ("B0", 6.0, 6.5)]
    assert sum(flat.total(k, 0) for k in KINDS) == pytest.approx(events.busy(0)) == pytest.approx(5.5)
    waits = flat.of(0, "wait")
    assert len(waits) == 3 and sum(e.nbytes for e in flat.of(0)) == 150   # a split wait; bytes kept once
    assert flat.of(1) == events.of(1)


def test_timeline_draws_labels_as_groups_and_short_phases_visibly():
    import matplotlib.pyplot as plt

    events = [Event(0, "compute", 0.0, 0.001, "F0"), Event(0, "wait", 0.001, 1.0),
              Event(1, "compute", 0.0, 0.4, "F1"), Event(1, "compute", 0.4, 0.9, "B1"),
              Event(0, "send", 0.0005, 0.003, "", 1, 8)]   # overlaps rank 0's compute: drawn after it
    fig, ax = plt.subplots()
    plot.timeline(events, ax=ax)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # shares of the ranks' busy time (1.0 s + 0.9 s): B 0.5 s, F 0.401 s
    assert legend[:2] == ["compute: B (backward) (26%)", "compute: F (forward) (21%)"], legend
    assert "phases under" in ax.get_legend().get_title().get_text()      # the 1 ms compute was widened
    drawn = [bar for coll in ax.collections for bar in coll.get_paths()]
    assert len(drawn) == 5   # F0, F1, B1, the wait and the send's part after the compute
    plt.close(fig)


def test_timeline_shows_a_label_only_where_its_bar_is_whole_in_view():
    import matplotlib.pyplot as plt

    events = [Event(0, "compute", 0.0, 1.0, "F0"), Event(0, "compute", 1.0, 2.0, "B0")]
    fig, ax = plt.subplots(figsize=(8, 2))
    plot.timeline(events, ax=ax)
    shown = lambda: sorted(t.get_text() for t in ax.texts if t.get_visible())  # noqa: E731
    assert shown() == ["B0", "F0"]
    ax.set_xlim(0.5, 2.0)          # F0 is cut by the edge: its label would be cut too
    assert shown() == ["B0"]
    plt.close(fig)
