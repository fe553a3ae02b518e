"""Writing grades: ``scores.csv``, per-student feedback JSON and Gradescope ``results.json``."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import List

from .registry import qid_key


def safe_name(submission: str) -> str:
    """A file name for a submission id (``alice/00_x`` -> ``alice__00_x``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", submission.replace("/", "__").replace("\\", "__")) or "submission"


def _num(x):
    return int(x) if float(x).is_integer() else round(float(x), 4)


def write_scores(rows: List[dict], out: Path) -> Path:
    """``scores.csv``: a row per submission, a column per question id, then total and max."""
    qids = sorted({q["qid"] for r in rows for q in r["questions"]}, key=qid_key)
    path = Path(out) / "scores.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["submission"] + qids + ["total", "max"])
        for r in rows:
            pts = {q["qid"]: _num(q["points"]) for q in r["questions"]}
            w.writerow([r["submission"]] + [pts.get(q, "") for q in qids]
                       + [_num(r["score"]), _num(r["max_score"])])
    return path


def write_feedback(row: dict, out: Path) -> Path:
    """``feedback/<submission>.json``: points, messages and tracebacks per question."""
    path = Path(out) / "feedback" / f"{safe_name(row['submission'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_gradescope(row: dict, out: Path) -> Path:
    """``results/<submission>/results.json`` in the Gradescope autograder format."""
    tests = []
    for q in row["questions"]:
        text = q["message"]
        if q.get("traceback") and q["status"] in ("error", "crashed"):
            text += "\n\n" + "\n".join(q["traceback"].rstrip().splitlines()[-15:])
        tests.append({"name": f"{q['qid']}: {q['title']}", "number": q["qid"], "score": _num(q["points"]),
                      "max_score": _num(q["max_points"]), "status": "passed" if q["status"] == "passed" else "failed",
                      "output": text, "visibility": "visible"})
    res = {"score": _num(row["score"]), "execution_time": row.get("elapsed", 0.0),
           "output": "\n".join(row.get("notes", [])), "tests": tests}
    path = Path(out) / "results" / safe_name(row["submission"]) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
