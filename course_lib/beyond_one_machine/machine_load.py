"""How busy the machine is before a measurement: the cores other processes kept busy.

A timing is only as good as the machine it ran on. The 1-minute load average
(``os.getloadavg``) is a poor witness here: read after a benchmark, it mostly counts the
benchmark's own processes. :func:`busy_cores` instead watches the kernel's CPU counters
(``/proc/stat``) over a short window while this process sleeps, so what it sees is everybody
else: for each CPU this process may run on, the share of the window it was not idle,

    busy = sum over usable CPUs c of (1 - idle_c / total_c),

idle counting the kernel's ``idle`` and ``iowait`` ticks. 0 is a quiet machine; n (the
number of usable CPUs) means every one of them was taken. Where ``/proc/stat`` does not exist
(macOS, Windows) it falls back to the 1-minute load average, capped at the CPU count, and
says so.
"""
from __future__ import annotations

import os
import time

__all__ = ["busy_cores"]

STAT = "/proc/stat"


def _cpu_ticks(path: str = STAT) -> dict[int, tuple[int, int]]:
    """CPU number -> (idle ticks, total ticks) from /proc/stat's ``cpuN`` lines."""
    out = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *fields = line.split()
            ticks = [int(x) for x in fields[:8]]     # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out


def _usable_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def busy_cores(window: float = 0.5, path: str = STAT) -> dict:
    """Cores kept busy by other processes during ``window`` seconds (this process sleeps).

    Returns ``{"busy": float, "cpus": int, "source": str, "window": float}``: ``busy`` in cores
    (0 to ``cpus``), ``cpus`` the CPUs this process may run on, ``source`` "/proc/stat" or
    "load average" (the fallback)."""
    cpus = _usable_cpus()
    try:
        before = _cpu_ticks(path)
    except OSError:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return {"busy": float(min(load, len(cpus))), "cpus": len(cpus), "source": "load average",
                "window": 0.0}
    time.sleep(window)
    after = _cpu_ticks(path)
    busy = 0.0
    for c in cpus:
        if c in before and c in after:
            idle = after[c][0] - before[c][0]
            total = after[c][1] - before[c][1]
            busy += 1.0 - idle / total if total > 0 else 0.0
    return {"busy": float(busy), "cpus": len(cpus), "source": path, "window": float(window)}
