"""Writing grades: ``scores.csv``, per-submission feedback (JSON for the instructor, Markdown for
the student) and Gradescope ``results.json``.

Everything written here comes partly from submissions (their file names, their error messages),
so every writer is defensive: file names are bounded and safe (:func:`safe_name`), text is
written as valid UTF-8 whatever it holds (lone surrogates become ``\\udcxx`` escapes), CSV cells
cannot start a spreadsheet formula, and each file is replaced atomically.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterable, List, Optional

from .registry import qid_key

NAME_BYTES = 80      # the readable part of a safe file name (the whole name stays far below 255 bytes)
HASH_CHARS = 10      # hex digits of the id's hash appended to it
COLUMNS_BEFORE_TOTAL = ("status", "sandbox", "checks")


# ----------------------------------------------------------------------------- names and text

def _id_bytes(submission: str) -> bytes:
    return str(submission).encode("utf-8", "surrogatepass")


def safe_name(submission: str) -> str:
    """A bounded, safe file name for a submission id, one-to-one with the id.

    ``alice/00 x`` -> ``alice__00_x-1a2b3c4d5e``: letters, digits, ``_ . -`` only, no leading dot,
    at most ~90 bytes, and a hash of the exact id, so ``05 bob`` and ``05_bob`` stay apart.
    """
    text = str(submission).replace("/", "__").replace("\\", "__")
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).lstrip(".")[:NAME_BYTES] or "submission"
    return f"{readable}-{hashlib.sha256(_id_bytes(submission)).hexdigest()[:HASH_CHARS]}"


def valid_text(text) -> str:
    """``text`` as a str that encodes to UTF-8 (lone surrogates become backslash escapes)."""
    text = str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _clean(obj):
    """A JSON-able structure with every string made valid UTF-8."""
    if isinstance(obj, str):
        return valid_text(obj)
    if isinstance(obj, dict):
        return {valid_text(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def csv_cell(value):
    """A CSV cell a spreadsheet shows as text: strings starting ``= + - @``, tab or CR get a ``'``
    in front (OWASP, "CSV injection"). Numbers are left alone."""
    if isinstance(value, str):
        value = valid_text(value)
        if value[:1] in ("=", "+", "-", "@", "\t", "\r"):
            return "'" + value
    return value


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as UTF-8, atomically (a reader sees the old or the new file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", errors="backslashreplace", newline="") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _num(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return 0
    return int(x) if x.is_integer() else round(x, 4)


# ----------------------------------------------------------------------------- scores.csv

def write_scores(rows: List[dict], out: Path) -> Path:
    """``scores.csv``: a row per submission: ``submission``, a column per question id, then
    ``status`` (ok, or why it was not graded), ``sandbox``, ``checks``, ``total`` and ``max``."""
    qids = sorted({q["qid"] for r in rows for q in r.get("questions", [])}, key=qid_key)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["submission", *qids, *COLUMNS_BEFORE_TOTAL, "total", "max"])
    for r in rows:
        pts = {q["qid"]: _num(q["points"]) for q in r.get("questions", [])}
        w.writerow([csv_cell(r["submission"])] + [pts.get(q, "") for q in qids]
                   + [csv_cell(str(r.get(c, ""))) for c in COLUMNS_BEFORE_TOTAL]
                   + [_num(r.get("score", 0)), _num(r.get("max_score", 0))])
    return write_text(Path(out) / "scores.csv", buf.getvalue())


# ----------------------------------------------------------------------------- feedback

def feedback_path(out: Path, submission: str, suffix: str = ".json") -> Path:
    return Path(out) / "feedback" / f"{safe_name(submission)}{suffix}"


def write_feedback(row: dict, out: Path) -> Path:
    """``feedback/<safe name>.json``: the instructor's full record (points, messages, tracebacks,
    notes, output, how it was graded) and ``feedback/<safe name>.md``, what a student can be handed."""
    path = feedback_path(out, row["submission"])
    write_text(path, json.dumps(_clean(row), indent=2, ensure_ascii=False) + "\n")
    write_text(feedback_path(out, row["submission"], ".md"), student_markdown(row))
    return path


class Scrubber:
    """Removes what only the grader's machine knows from text shown to students: its absolute
    paths (course checkout, Python installation, home, output folder, the grading library) and
    traceback frames of the grader's own code (``course_lib/grading``, ``course_lib/grade.py``,
    the hidden checks)."""

    GRADER_FRAME = re.compile(r'^\s*File "[^"]*(?:course_lib[/\\]grading[/\\]|course_lib[/\\]grade\.py|'
                              r'_course_hidden_|[/\\]hidden[/\\]ex\d\d\.py)[^"]*"')
    HIDDEN_FILE = re.compile(r"(?:[\w./\\-]*[/\\])?(?:tests[/\\]hidden[/\\]ex\d\d\.py|_course_hidden_ex\d\d)")
    TEMP_LIBRARY = re.compile(r"/[^\s'\"]*course_grading_lib_[^/\s'\"]*")

    def __init__(self, extra: Iterable = ()):
        from .registry import REPO_ROOT

        roots = [(p, "<course>") for p in (REPO_ROOT,)]
        roots += [(p, "<python>") for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
        roots += [(Path.home(), "<home>")]
        roots += [(p, "<grader>") for p in extra if p]
        pairs = []
        for path, label in roots:
            for form in {str(path), os.path.realpath(str(path))}:
                if len(form) > 1:
                    pairs.append((form, label))
        self.pairs = sorted(set(pairs), key=lambda pl: -len(pl[0]))  # longest first

    def frames(self, text: str) -> str:
        out, skipping = [], False
        for line in text.splitlines():
            if self.GRADER_FRAME.match(line):
                skipping = True
                continue
            if skipping and line.startswith("    ") and not line.lstrip().startswith("File "):
                continue  # the source line (and ^^^ markers) of a grader frame
            skipping = False
            out.append(line)
        return "\n".join(out)

    def __call__(self, text) -> str:
        text = self.frames(valid_text(text or ""))
        text = self.HIDDEN_FILE.sub("<hidden checks>", text)
        text = self.TEMP_LIBRARY.sub("<library>", text)
        for path, label in self.pairs:
            text = text.replace(path, label)
        return text


def _cell(text: str) -> str:
    """One Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def _fence(text: str) -> str:
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{ticks}text\n{text}\n{ticks}"


def student_markdown(row: dict, scrub: Optional[Scrubber] = None) -> str:
    """The feedback a student can be handed: points per question and the messages, without the
    grader's paths, hidden-check file names or grader frames."""
    scrub = scrub or Scrubber([Path(row.get("notebook") or "").parent if row.get("notebook") else None])
    lines = [f"# Feedback: {scrub(row['submission'])}", "",
             f"**Score: {_num(row.get('score', 0))} / {_num(row.get('max_score', 0))}**", ""]
    if row.get("status", "ok") != "ok":
        lines += [f"Not graded normally: {scrub(row['status'])}.", ""]
    checks = row.get("checks", "")
    if checks:
        lines += [f"Graded with the {'visible and hidden' if checks == 'visible+hidden' else 'visible'} checks "
                  f"({checks}); sandbox: {scrub(row.get('sandbox', '') or 'unknown')}.", ""]
    if row.get("questions"):
        lines += ["| Question | Points | Status | Message |", "|---|---|---|---|"]
        for q in row["questions"]:
            lines.append(f"| {_cell(scrub(q['qid']))} {_cell(scrub(q.get('title', '')))} "
                         f"| {_num(q['points'])} / {_num(q['max_points'])} | {_cell(q['status'])} "
                         f"| {_cell(scrub(q.get('message', '')))} |")
        lines.append("")
    for q in row.get("questions", []):
        tb = scrub(q.get("traceback") or "").strip()
        if tb and q["status"] in ("error", "crashed"):
            tail = "\n".join(tb.splitlines()[-12:])
            lines += [f"## {scrub(q['qid'])}: last lines of the traceback", "", _fence(tail), ""]
    notes = [scrub(n) for n in row.get("notes", []) if n]
    if notes:
        lines += ["## Notes", ""] + [f"- {_cell(n)}" for n in notes] + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- Gradescope

def hidden_outcome(q: dict) -> Optional[dict]:
    """{"status", "message"} of a question's hidden checks, or None when unknown.

    Uses the result's own ``hidden`` field when the checker reports it; otherwise reads it from the
    status and message (a failure on the grader's own inputs, or a pass with hidden checks run)."""
    h = q.get("hidden")
    if isinstance(h, dict) and h.get("status"):
        return {"status": str(h["status"]), "message": str(h.get("message", ""))}
    msg = q.get("message", "")
    if msg.startswith("On the grader's own inputs") or "on one of the grader's own inputs" in msg:
        return {"status": q["status"], "message": msg}
    if q["status"] == "passed" and q.get("hidden_checks"):
        return {"status": "passed", "message": "The grader's own checks passed."}
    return None


def gradescope_tests(row: dict, scrub: Optional[Scrubber] = None) -> list:
    """Gradescope tests: per question a visible test with its points and status, and (where the
    hidden checks' outcome is known) a companion test shown after publication, worth 0 points."""
    scrub = scrub or Scrubber()
    tests = []
    for q in row.get("questions", []):
        hidden = hidden_outcome(q)
        hidden_failed = hidden is not None and hidden["status"] != "passed"
        if hidden_failed:
            text = ("The visible checks pass, the grader's own checks do not: what they found is shown "
                    "once grades are published.")
        else:
            text = scrub(q.get("message", ""))
            tb = scrub(q.get("traceback") or "").strip()
            if tb and q["status"] in ("error", "crashed"):
                text += "\n\n" + "\n".join(tb.splitlines()[-15:])
        name = f"{q['qid']}: {q.get('title', '')}"
        tests.append({"name": name, "number": q["qid"], "score": _num(q["points"]),
                      "max_score": _num(q["max_points"]), "status": "passed" if q["status"] == "passed" else "failed",
                      "output": text, "visibility": "visible"})
        if hidden is not None:
            tests.append({"name": f"{name} (hidden checks)", "number": f"{q['qid']}.hidden", "score": 0,
                          "max_score": 0, "status": "passed" if hidden["status"] == "passed" else "failed",
                          "output": scrub(hidden["message"]), "visibility": "after_published"})
    return tests


def gradescope_results(row: dict, scrub: Optional[Scrubber] = None) -> dict:
    """One submission's ``results.json`` in Gradescope's autograder format."""
    scrub = scrub or Scrubber([Path(row["notebook"]).parent if row.get("notebook") else None])
    head = []
    if row.get("status", "ok") != "ok":
        head.append(f"Not graded normally: {row['status']}.")
    head.append(f"Graded with the {'visible and hidden' if row.get('checks') == 'visible+hidden' else 'visible'} "
                f"checks; sandbox: {row.get('sandbox', 'unknown')}.")
    output = "\n".join(head + [scrub(n) for n in row.get("notes", []) if n])
    return _clean({"score": _num(row.get("score", 0)), "execution_time": _num(row.get("elapsed", 0.0)),
                   "output": output, "tests": gradescope_tests(row, scrub)})


def write_gradescope(row: dict, out: Path) -> Path:
    """``results/<safe name>/results.json`` in the Gradescope autograder format."""
    path = Path(out) / "results" / safe_name(row["submission"]) / "results.json"
    return write_text(path, json.dumps(gradescope_results(row), indent=2, ensure_ascii=False) + "\n")
