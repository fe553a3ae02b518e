"""Collective algorithms as data: one row per (collective, algorithm).

``comm.allreduce(x, algorithm="ring")`` looks the row up here, on the local backend and on
the MPI backend alike, and the cost model (:mod:`course_lib.costs`) reads the same rows, so a
formula and the code it describes sit side by side.

Who fills the table:

* the runtime itself: :mod:`.base_collectives` registers the algorithm every collective uses
  by default (and the Bruck allgather of the signature check) when it is imported, which
  importing the communicator does. So every collective works with no lesson imported;
* lessons, on top: lesson 02 (:mod:`course_lib.collectives`) registers its teaching variants
  (token-ring barrier, flat trees, Bruck all-to-all, reduce + bcast allreduce, ...) when it is
  imported. It imports the runtime's algorithms rather than defining them again: one home per
  algorithm.

A worker runs the collectives the *launching* process can name: a forked worker inherits the
table, and a worker started by spawn or forkserver imports, before each run, the modules that
registered rows in the launching process (:func:`providers`, sent with the run by
:class:`~course_lib.runtime.cluster.Cluster`). That is a module name passed at run time, like
multiprocessing's re-import of ``__main__``, not an import of a lesson by the runtime.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, replace
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


def attach_seconds(collective: str, name: str, seconds: Callable[..., float]) -> Algorithm:
    """Give the registered row ``(collective, name)`` its ``seconds``; returns the new row.

    For a time that is a lesson's question: the answer is written once, in
    :mod:`course_lib.reference`, which the runtime does not import, so the lesson that asks
    the question attaches it to the runtime's row (lesson 02: the ring allreduce, ex02_4)."""
    row = replace(lookup(collective, name), seconds=seconds)
    _ROWS[collective][name] = row
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
        raise ValueError(f"{collective}: unknown algorithm {name!r}; choose one of {sorted(table)} (lesson 02's "
                         "teaching variants are there once course_lib.collectives is imported)")
    return table[name]


def index(collective: str, name: str) -> int:
    """1-based position of ``name`` among the collective's algorithms in sorted order (0: none);
    every rank computes the same number, since every worker holds the launcher's table (see
    :func:`providers`), so it can travel in a tag."""
    names = sorted(_ROWS.get(collective, {}))
    return names.index(name) + 1 if name in names else 0


_RUNTIME = __name__.rpartition(".")[0]     # course_lib.runtime: its rows need no import in a worker


def providers() -> tuple[str, ...]:
    """The modules outside the runtime whose functions are registered rows, sorted: what a
    worker started by spawn or forkserver imports to hold the same table as this process
    (``__main__`` is left out: a worker cannot import the launcher's script or notebook)."""
    modules = {row.run.__module__ for table in _ROWS.values() for row in table.values()}
    return tuple(sorted(m for m in modules if m != "__main__" and m != _RUNTIME and not m.startswith(_RUNTIME + ".")))


def import_providers(modules) -> None:
    """Import the modules :func:`providers` named in the launching process (in a worker, before
    a run): importing a lesson's module registers its rows, as it did there."""
    for module in modules:
        if module not in sys.modules:
            importlib.import_module(module)
