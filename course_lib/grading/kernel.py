"""The student's side of grading: a kernel inside the sandbox.

``python -m course_lib.grading.kernel IN_FD OUT_FD`` runs inside the sandbox
(:mod:`course_lib.grading.sandbox`). It knows nothing of the checks, the points or the hidden
inputs; it only does what the grader asks over the control channel
(:mod:`course_lib.grading.channel`) and answers with plain data:

========== ==============================================================================
``cell``     run one code cell (an IPython shell, so magics work) under a time limit
``quiet``    from now on, stdout and stderr go to /dev/null (the questions' phase)
``has``      whether a name is defined, and whether it is callable
``get``      the plain value of a name
``call``     call a student function on plain arguments; return its plain result
``harness``  call a ``@harness`` of ``course_lib.questions`` on a student function
========== ==============================================================================

Nothing here is trusted: student code runs in this process and may rewrite any of it. That
is harmless by construction, since all it can do is answer the grader's requests with
plain data, and the grader decides on that data alone.
"""
from __future__ import annotations

import os
import random
import sys

from . import channel
from .checking import QuestionTimeout, time_limit
from .plain import PlainDataError
from .student import describe_exception, resolve_harness, student_label, swap_student_functions


def _seed(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return (text.splitlines() or ["error"])[0].rstrip(": ")


class Kernel:
    def __init__(self):
        from IPython.core.interactiveshell import InteractiveShell

        self.shell = InteractiveShell.instance(colors="NoColor")
        self.ns = self.shell.user_ns

    def cell(self, msg: dict) -> dict:
        _seed(msg.get("seed", 0))
        limit = float(msg.get("timeout", 120))
        error, hung_in = None, []
        try:
            with time_limit(limit):
                res = self.shell.run_cell(msg["source"], store_history=False, silent=False)
            err = res.error_before_exec or res.error_in_exec
            if err is not None:
                error = _first_line(err)
                if isinstance(err, QuestionTimeout):
                    hung_in = self.running(err, msg.get("watch", []))
        except QuestionTimeout as e:
            error = f"the cell ran past the time limit of {limit:g} s and was interrupted"
            hung_in = self.running(e, msg.get("watch", []))
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt from student code
            error = _first_line(e)
        if error and error.startswith("QuestionTimeout"):
            error = f"the cell ran past the time limit of {limit:g} s and was interrupted"
        elif error == "MemoryError":
            error = "MemoryError: the cell ran out of memory (the grader limits memory per process)"
        sys.stdout.flush()
        sys.stderr.flush()
        return {"op": "cell_done", "index": msg["index"], "error": error, "hung_in": hung_in}

    def running(self, stopped: BaseException, watch) -> list:
        """The ``watch``ed notebook functions that were running when the time limit stopped the cell:
        those whose code object is on the stack of ``stopped``'s traceback. A cell that hangs in its
        own loop after calling an answer, or in a worker it started, names none."""
        codes = {}
        for name in watch if isinstance(watch, list) else []:
            code = getattr(self.ns.get(name) if isinstance(name, str) else None, "__code__", None)
            if code is not None:
                codes[code] = name
        tb, found = stopped.__traceback__, []
        while tb is not None:
            name = codes.get(tb.tb_frame.f_code)
            if name is not None and name not in found:
                found.append(name)
            tb = tb.tb_next
        return found

    def quiet(self, msg: dict) -> dict:
        sys.stdout.flush()
        sys.stderr.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        return {"op": "ok"}

    def has(self, msg: dict) -> dict:
        name = msg["name"]
        return {"op": "has", "has": name in self.ns, "callable": callable(self.ns.get(name))}

    def get(self, msg: dict) -> dict:
        return {"op": "value", "value": self.ns[msg["name"]]}

    def _run(self, label: str, msg: dict, fn, args, kwargs) -> dict:
        _seed(msg.get("seed", 0))
        try:
            with time_limit(float(msg["timeout"])):
                result = fn(*args, **kwargs)
                if msg.get("observe"):
                    result = (result, args)
        except QuestionTimeout:
            return {"op": "raised", "name": label, "type_name": "QuestionTimeout", "message": "",
                    "traceback": "", "kinds": ["QuestionTimeout"]}
        except BaseException as exc:  # noqa: BLE001 - student code can raise anything
            err = describe_exception(label, exc)
            return {"op": "raised", "name": label, "type_name": err.type_name, "message": err.message,
                    "traceback": err.traceback, "kinds": list(err.kinds)}
        return {"op": "result", "value": result, "observed": bool(msg.get("observe"))}

    def call(self, msg: dict) -> dict:
        name = msg["name"]
        fn = self.ns[name]
        return self._run(name, msg, fn, tuple(msg["args"]), dict(msg["kwargs"]))

    def harness(self, msg: dict) -> dict:
        fn = resolve_harness(msg["ref"])
        label = student_label(tuple(msg["args"]), dict(msg["kwargs"]), msg["ref"].rsplit(":", 1)[-1])
        args, kwargs = swap_student_functions(tuple(msg["args"]), dict(msg["kwargs"]), self.ns.__getitem__)
        return self._run(label, msg, fn, args, kwargs)


def serve(in_fd: int, out_fd: int) -> None:
    kernel = Kernel()
    channel.send(out_fd, {"op": "ready", "pid": os.getpid()})
    handlers = {"cell": kernel.cell, "quiet": kernel.quiet, "has": kernel.has, "get": kernel.get,
                "call": kernel.call, "harness": kernel.harness}
    while True:
        try:
            msg = channel.recv(in_fd)
        except channel.ChannelClosed:
            break
        if msg["op"] == "exit":
            break
        try:
            reply = handlers[msg["op"]](msg)
        except KeyError as e:
            reply = {"op": "missing", "name": str(e)}
        except BaseException as e:  # noqa: BLE001
            reply = {"op": "failed", "message": _first_line(e)}
        try:
            channel.send(out_fd, reply)
        except PlainDataError as e:
            channel.send(out_fd, {"op": "not_plain", "why": str(e)})
    sys.stdout.flush()
    # Skip interpreter shutdown: threads or children left by student code could block it.
    os._exit(0)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
