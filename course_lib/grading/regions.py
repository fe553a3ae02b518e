"""Solution regions inside notebook code cells.

A region sits in the body of the function its question names, in ``solutions/NN_name.ipynb``::

    def sum_shard(comm, sa):
        '''Sum of this rank's contiguous block of the shared array ``sa``, as a float.'''
        # BEGIN SOLUTION ex00_1
        ...
        # END SOLUTION

Its text is not written by hand: ``make_exercises`` writes the function, region included, from
the reference answer in ``course_lib/reference/ex00.py`` (:func:`function_with_region`,
:func:`write_region_functions`). In the exercise it becomes ``raise NotImplementedError("ex00_1:
<title>")`` at the indentation of the ``BEGIN`` line; the wrong-answer fixtures replace it with
another body.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Tuple

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


# -- writing a region from a reference function ---------------------------------------------
def function_with_region(source: str, qid: str) -> str:
    """The function ``source`` (one top-level ``def``) with its body marked as the region of ``qid``.

    What stays outside the region is what an exercise shows: the ``def`` line and the docstring.
    Everything after the docstring (comments included) is the answer, between the markers at
    the body's indentation::

        def f(x):
            \"\"\"The statement.\"\"\"
            # BEGIN SOLUTION ex00_1
            return 2 * x
            # END SOLUTION
    """
    lines = textwrap.dedent(source).rstrip("\n").splitlines()
    node = ast.parse("\n".join(lines)).body[0]
    doc = node.body[0]
    if not (isinstance(node, ast.FunctionDef) and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str) and len(node.body) > 1):
        raise RegionError(f"{qid}: the reference must be a function with a docstring and a body")
    indent = " " * node.body[1].col_offset
    head, body = lines[:doc.end_lineno], lines[doc.end_lineno:]
    return "\n".join(head + [f"{indent}# BEGIN SOLUTION {qid}"] + body + [f"{indent}# END SOLUTION"])


def enclosing_def(lines: List[str], begin: int, name: str, where: str = "") -> int:
    """Index of the line ``def name(`` at the top level that holds the region opened at ``lines[begin]``.

    The nearest line above the region that starts at column 0 (a signature's closing ``)``
    aside) must be that ``def``: a region lives in the body of the function its question names."""
    for i in range(begin - 1, -1, -1):
        line = lines[i]
        if not line.strip() or line[0] in " \t)":
            continue
        if re.match(rf"(async )?def {re.escape(name)}\s*\(", line):
            return i
        break
    raise RegionError(f"{where} line {begin + 1}: the region is not inside a top-level `def {name}(`")


def write_region_functions(source: str, functions: Dict[str, Tuple[str, str]],
                           where: str = "") -> Tuple[str, List[str]]:
    """Replace each region of ``source`` and the function around it by ``functions[qid] = (name, text)``.

    The span replaced runs from the enclosing ``def name(`` to the region's END line: what the
    cell holds before the function (imports, constants) and after the region is kept."""
    lines = source.splitlines()
    out: List[str] = []
    qids: List[str] = []
    i = 0
    while i < len(lines):
        b = BEGIN_RE.match(lines[i])
        if not b:
            out.append(lines[i])
            i += 1
            continue
        qid = b.group("qid")
        if qid not in functions:
            raise RegionError(f"{where} line {i + 1}: no reference function for {qid}")
        name, text = functions[qid]
        start = enclosing_def(lines, i, name, where)
        end = next((j for j in range(i + 1, len(lines)) if END_RE.match(lines[j])), None)
        if end is None:
            raise RegionError(f"{where} line {i + 1}: region {qid} has no END SOLUTION")
        del out[len(out) - (i - start):]
        out.extend(text.splitlines())
        qids.append(qid)
        i = end + 1
    return "\n".join(out) + ("\n" if source.endswith("\n") else ""), qids
