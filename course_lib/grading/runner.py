"""The grading subprocess: execute one notebook, then grade its questions.

Started by :mod:`course_lib.grading.sandbox` as ``python -m course_lib.grading.runner SPEC.json``
in its own process group, with a memory limit. It reports progress as JSON lines in the
events file named by the spec (student code owns stdout and stderr)::

    {"event": "start"}
    {"event": "cell_start", "index": k}     {"event": "cell_end", "index": k, "error": "..."}
    {"event": "q_start", "qid": q}          {"event": "q_end", "qid": q, "result": {...}}
    {"event": "done"}                       {"event": "fatal", "message": "..."}

When the process dies, the last event tells the parent which cell or question killed it.
Code cells run in an IPython shell (magics work), with the notebook's folder as the
working directory and ``COURSE_GRADING=1`` so the notebook's own ``check()`` calls are skipped.
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback


class _Events:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def emit(self, **ev):
        ev["t"] = round(time.time(), 3)
        self.f.write(json.dumps(ev) + "\n")
        self.f.flush()


def _seed(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except Exception:  # noqa: BLE001 - numpy is optional here
        pass


def _die_with_parent() -> None:
    """If the grader (or its zygote) dies, take this process group down instead of looping forever."""
    if not hasattr(os, "killpg"):
        return
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), 9)

    threading.Thread(target=watch, daemon=True, name="grading-orphan-watch").start()


def main(spec_path: str) -> None:
    _die_with_parent()
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    ev = _Events(spec["events"])
    ev.emit(event="start", pid=os.getpid())
    try:
        import nbformat

        from .checking import QuestionTimeout, run_question, time_limit
        from .registry import load_lesson

        nb = nbformat.read(spec["notebook"], as_version=4)
        questions = {q.qid: q for q in load_lesson(spec["lesson"], hidden_dir=spec.get("hidden_dir"),
                                                    with_hidden=spec.get("hidden", True))}
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance(colors="NoColor")
        nbdir = os.path.dirname(os.path.abspath(spec["notebook"]))
        os.chdir(nbdir)
        if nbdir not in sys.path:
            sys.path.insert(0, nbdir)
    except BaseException as e:  # noqa: BLE001
        ev.emit(event="fatal", message=f"could not start grading: {type(e).__name__}: {e}",
                traceback=traceback.format_exc())
        sys.stdout.flush()
        os._exit(3)

    _seed(spec.get("seed", 0))
    skip = set(spec.get("skip_cells", []))
    cell_timeout = spec.get("cell_timeout", 120)
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or k in skip or not cell.source.strip():
            continue
        ev.emit(event="cell_start", index=k)
        error = None
        try:
            with time_limit(cell_timeout):
                res = shell.run_cell(cell.source, store_history=False, silent=False)
            err = res.error_before_exec or res.error_in_exec
            if err is not None:
                error = f"{type(err).__name__}: {err}"
        except QuestionTimeout:
            error = f"QuestionTimeout: cell ran past {cell_timeout:g} s"
        except BaseException as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
        if error and "QuestionTimeout" in error:
            error = f"the cell ran past the time limit of {cell_timeout:g} s and was interrupted"
        elif error:
            error = (error.strip().splitlines() or ["error"])[0].rstrip(": ")
            if error == "MemoryError":
                error = "MemoryError: the cell ran out of memory (the grader limits memory per process)"
        ev.emit(event="cell_end", index=k, error=error)
        sys.stdout.flush()
        sys.stderr.flush()

    ns = shell.user_ns
    for qid in spec["qids"]:
        q = questions.get(qid)
        ev.emit(event="q_start", qid=qid)
        if q is None:
            ev.emit(event="q_end", qid=qid, result=None)
            continue
        _seed(spec.get("seed", 0))
        timeout = spec.get("timeouts", {}).get(qid, q.timeout)
        try:
            r = run_question(q, ns, hidden=spec.get("hidden", True), timeout=timeout)
            result = r.to_dict()
        except BaseException as e:  # noqa: BLE001 - e.g. a KeyboardInterrupt raised by student code
            result = {"qid": qid, "title": q.title, "points": 0, "max_points": q.points, "status": "error",
                      "message": f"grading was interrupted: {type(e).__name__}: {e}",
                      "traceback": traceback.format_exc(), "elapsed": 0.0}
        sys.stdout.flush()
        sys.stderr.flush()
        ev.emit(event="q_end", qid=qid, result=result)
    ev.emit(event="done")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter shutdown: non-daemon children or threads left by student code would block it.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
