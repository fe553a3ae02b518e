"""Solution regions inside notebook code cells.

A region is written once, in ``solutions/NN_name.ipynb``::

    def sum_shard(comm, sa):
        # BEGIN SOLUTION ex00_1
        ...
        # END SOLUTION

``make_exercises`` turns it into ``raise NotImplementedError("ex00_1: <title>")`` at the
indentation of the ``BEGIN`` line; the wrong-answer fixtures replace it with another body.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Callable, List, Tuple

BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN SOLUTION\b\s*(?P<qid>\S*)\s*$")
END_RE = re.compile(r"^[ \t]*#\s*END SOLUTION\b")
LESSON_RE = re.compile(r"^(\d{2})_")


class RegionError(ValueError):
    """A malformed solution region (unclosed, nested, or without a question id)."""


def lesson_of_path(path) -> str:
    m = LESSON_RE.match(Path(path).name)
    if not m:
        raise ValueError(f"{path}: notebook names start with the lesson number, like 00_name.ipynb")
    return m.group(1)


def replace_regions(source: str, replacer: Callable[[str, str], str], where: str = "") -> Tuple[str, List[str]]:
    """Replace every region of ``source`` by ``replacer(qid, indent)``; return (new source, qids)."""
    out: List[str] = []
    qids: List[str] = []
    current = None  # (qid, indent, line number)
    for i, line in enumerate(source.splitlines(keepends=True), 1):
        b = BEGIN_RE.match(line.rstrip("\n"))
        if b:
            if current:
                raise RegionError(f"{where} line {i}: BEGIN SOLUTION inside the region opened at line {current[2]}")
            if not b.group("qid"):
                raise RegionError(f"{where} line {i}: BEGIN SOLUTION needs a question id, "
                                  "like '# BEGIN SOLUTION ex00_1'")
            current = (b.group("qid"), b.group("indent"), i)
            continue
        if END_RE.match(line):
            if not current:
                raise RegionError(f"{where} line {i}: END SOLUTION without a BEGIN SOLUTION")
            qid, indent, _ = current
            text = replacer(qid, indent)
            if text and not text.endswith("\n") and line.endswith("\n"):
                text += "\n"
            out.append(text)
            qids.append(qid)
            current = None
            continue
        if not current:
            out.append(line)
    if current:
        raise RegionError(f"{where} line {current[2]}: region {current[0]} has no END SOLUTION")
    return "".join(out), qids


def stub(qid: str, title: str, indent: str) -> str:
    """The exercise stub that replaces a region: it names its question."""
    msg = f"{qid}: {title}".replace("\\", "\\\\").replace('"', '\\"')
    return f'{indent}raise NotImplementedError("{msg}")'


def reindent(body: str, indent: str) -> str:
    """``body`` (any indentation) re-indented to ``indent``."""
    body = textwrap.dedent(body.strip("\n"))
    return "\n".join((indent + line) if line.strip() else "" for line in body.splitlines())


def replace_region_in_notebook(nb, qid: str, body: str):
    """A copy of notebook ``nb`` where the region(s) of ``qid`` hold ``body`` instead.

    Other questions' regions keep their markers. Used by the wrong-answer fixtures.
    """
    import copy

    nb = copy.deepcopy(nb)
    found = 0
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.source, qids = _replace_keep_others(cell.source, qid, lambda _q, indent: reindent(body, indent),
                                                     where=f"cell {k}")
            found += len(qids)
    if not found:
        raise RegionError(f"no solution region for {qid} in the notebook")
    return nb


def _replace_keep_others(source, qid, rep, where=""):
    lines = source.splitlines(keepends=True)
    out, i, qids = [], 0, []
    while i < len(lines):
        b = BEGIN_RE.match(lines[i].rstrip("\n"))
        if b and b.group("qid") == qid:
            j = i + 1
            while j < len(lines) and not END_RE.match(lines[j]):
                j += 1
            if j == len(lines):
                raise RegionError(f"{where}: region {qid} has no END SOLUTION")
            text = rep(qid, b.group("indent"))
            out.append(text + ("\n" if lines[j].endswith("\n") else ""))
            qids.append(qid)
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    return "".join(out), qids
