"""Collective algorithms as data: one row per (collective, algorithm).

The runtime knows *how to call* a collective (mpi4py's arguments, the call's signature
in every tag, sub-communicators) but not *how it is done*: the algorithms are lesson
02's (:mod:`course_lib.collectives`), which registers one :class:`Algorithm` row each
when it is imported. ``comm.allreduce(x, algorithm="ring")`` looks the row up here, on
the local backend and on the MPI backend alike, and the cost model
(:mod:`course_lib.costs`) reads the same rows, so a formula and the code it describes
sit side by side.

The runtime imports no lesson: importing :mod:`course_lib` imports the lesson package,
which fills this table, before any worker runs a collective.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

COLLECTIVES = ("barrier", "bcast", "scatter", "gather", "allgather", "alltoall", "reduce", "reduce_scatter",
               "allreduce", "scan", "exscan")


@dataclass(frozen=True)
class Algorithm:
    """One way to run one collective, and what it costs.

    ``run(t, ...)`` is the algorithm on a transport ``t`` (``rank``, ``size``, ``send``,
    ``recv``, ``sendrecv``). The cost fields are None where no closed form is kept:

    * ``formula``: its alpha-beta-gamma time as text, e.g. ``"lg p (alpha + n beta)"``
      (Hockney 1994; Thakur, Rabenseifner & Gropp 2005);
    * ``seconds(p, n, alpha, beta, gamma)``: that time for p ranks and n bytes;
    * ``rounds(p)``: the longest chain of messages each waiting for the one before it
      (what the alpha term counts), for p >= 2;
    * ``traffic(p, n, itemsize, root, ndim)``: the exact bytes and messages each rank
      sends, as two int arrays of length p, for p >= 2.
    """

    collective: str
    name: str
    run: Callable
    formula: str | None = None
    seconds: Callable[..., float] | None = None
    rounds: Callable[[int], int] | None = None
    traffic: Callable | None = None


_ROWS: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}


def register(row: Algorithm) -> Algorithm:
    """Add (or replace) one row; returns it."""
    if row.collective not in _ROWS:
        raise ValueError(f"unknown collective {row.collective!r}; expected one of {COLLECTIVES}")
    _ROWS[row.collective][row.name] = row
    return row


def algorithms(collective: str) -> dict[str, Algorithm]:
    """The rows of one collective, by algorithm name."""
    if collective not in _ROWS:
        raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    return _ROWS[collective]


def lookup(collective: str, name: str) -> Algorithm:
    """The row of ``collective`` with algorithm ``name``, or a ValueError listing the choices."""
    table = algorithms(collective)
    if name not in table:
        if not table:
            raise RuntimeError(f"no {collective} algorithm is registered: import course_lib (it registers "
                               "lesson 02's algorithms) before running collectives")
        raise ValueError(f"{collective}: unknown algorithm {name!r}; choose one of {sorted(table)}")
    return table[name]


def index(collective: str, name: str) -> int:
    """1-based position of ``name`` among the collective's algorithms in sorted order (0: none);
    every process computes the same number, so it can travel in a tag."""
    names = sorted(_ROWS.get(collective, {}))
    return names.index(name) + 1 if name in names else 0
