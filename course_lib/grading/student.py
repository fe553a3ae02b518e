"""How a check reaches the student's code: through plain data, wherever that code runs.

A check is a function ``check(ns)``. ``ns`` is a :class:`StudentCode`: ``ns["sum_shard"]``
is a :class:`StudentFunction`, a handle on the function the student defined. Calling it sends
the arguments as plain data (:mod:`course_lib.grading.plain`) to where the student's code
runs, calls the function there, and brings the result back as plain data. The check then
decides on that data alone.

- :class:`LocalCode` is the student's own notebook namespace (``check("ex00_1")`` in a
  notebook): the call happens in this process, but arguments and results still make the
  plain-data round trip, so a check sees exactly what it would see when grading.
- The grader's sandbox (:mod:`course_lib.grading.sandbox`) provides a remote one: the call
  happens in the sandboxed kernel, and only plain data comes back.

A student function that needs more than plain arguments (a communicator, a shared array, a
running cluster) is driven by a **harness**: a function decorated with :func:`harness`, in a
``course_lib.questions`` module, that takes the student's function and plain arguments, does
the running *on the student's side*, and returns plain data::

    @harness
    def run_sum_shard(fn, values, n_workers):
        with Cluster(n_workers) as cluster:
            return list(cluster.run(fn, cluster.share(values)))

A check calls ``run_sum_shard(ns["sum_shard"], values, 3)``; given a :class:`StudentFunction`,
the call is forwarded to the side where that function lives.
"""
from __future__ import annotations

import functools
import importlib
import traceback as _tb
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Tuple

from .plain import PlainDataError, roundtrip


class StudentError(Exception):
    """The student's code (or a harness running it) raised.

    ``kinds`` names every exception type in the chain (causes, and a worker's remote error), so
    a check can tell a ``NotImplementedError`` stub or a ``WorkerTimeout`` deadlock apart.
    """

    def __init__(self, name: str, type_name: str, message: str, traceback: str = "", kinds: Iterable[str] = ()):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.name, self.type_name, self.message, self.traceback = name, type_name, message, traceback
        self.kinds = tuple(kinds) or (type_name,)


class KernelLost(BaseException):
    """The sandboxed kernel died or stopped answering (a BaseException: checks cannot catch it)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class NotPlainData(Exception):
    """The student's function returned something that cannot cross to the grader."""

    def __init__(self, name: str, why: str):
        super().__init__(f"`{name}` returned a value the grader cannot read: {why}")
        self.name, self.why = name, why


@dataclass
class Observed:
    """A call's result and its arguments as they were after the call (to catch an overwritten input)."""

    result: Any
    args: Tuple


class StudentCode:
    """The student's namespace as a check sees it (see the module doc)."""

    def __contains__(self, name: str) -> bool:
        raise NotImplementedError

    def __getitem__(self, name: str):
        """A :class:`StudentFunction` for a callable, else the plain value of the name."""
        raise NotImplementedError

    def call(self, name: str, args: tuple, kwargs: dict, observe: bool = False):
        raise NotImplementedError

    def run_harness(self, ref: str, args: tuple, kwargs: dict):
        raise NotImplementedError


class StudentFunction:
    """A handle on a function the student defined; calling it calls the student's code."""

    def __init__(self, code: StudentCode, name: str):
        self.code, self.name = code, name

    def __call__(self, *args, **kwargs):
        return self.code.call(self.name, args, kwargs)

    def call_observed(self, *args, **kwargs) -> Observed:
        """Call, and also return the arguments as the function left them."""
        return self.code.call(self.name, args, kwargs, observe=True)

    def __repr__(self):
        return f"<your function {self.name}>"


def harness(fn):
    """Mark ``fn(student_fn, *plain_args)`` as a harness (see the module doc).

    Called with a :class:`StudentFunction` among its arguments, it runs where that function
    lives and returns plain data; called with ordinary functions, it is ``fn`` itself.
    """
    ref = f"{fn.__module__}:{fn.__qualname__}"

    @functools.wraps(fn)
    def forward(*args, **kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, StudentFunction):
                return a.code.run_harness(ref, args, kwargs)
        return fn(*args, **kwargs)

    forward.__harness_ref__ = ref
    return forward


def resolve_harness(ref: str):
    """The undecorated harness function named ``module:qualname`` (a ``course_lib`` module)."""
    mod_name, _, qual = ref.partition(":")
    if not mod_name.startswith("course_lib."):
        raise PermissionError(f"harness {ref!r} is not part of course_lib")
    obj = importlib.import_module(mod_name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not hasattr(obj, "__harness_ref__"):
        raise PermissionError(f"{ref!r} is not a harness")
    return obj.__wrapped__


def exception_kinds(exc: BaseException) -> list:
    """Names of the exception types in ``exc``'s chain, including workers' remote errors."""
    kinds, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kinds.append(type(exc).__name__)
        remote = getattr(exc, "remote_traceback", None)
        if remote:
            last = [line for line in str(remote).strip().splitlines() if line.strip()]
            if last:
                kinds.append(last[-1].split(":", 1)[0].strip().rsplit(".", 1)[-1])
        exc = exc.__cause__ or exc.__context__
    return kinds


def _without_library_frames(text: str) -> str:
    """A traceback's text without the frames of ``course_lib`` itself (the runtime's internals):
    what is left is the student's own code and the error."""
    out, skip = [], False
    for line in text.splitlines():
        if line.startswith("  File "):
            skip = "/course_lib/" in line.replace("\\", "/")
            if skip:
                continue
        elif skip and line.startswith("    "):
            continue
        else:
            skip = False
        out.append(line)
    return "\n".join(out)


def _worker_error(exc: BaseException):
    """(type, message, traceback) of the exception a worker raised, for a runtime ``WorkerError``
    that carries one (``rank 1 raised ZeroDivisionError: ...``); else None."""
    exc_type, rank = getattr(exc, "exc_type", ""), getattr(exc, "rank", None)
    head = f"rank {rank} raised {exc_type}"
    first = str(exc).split("\n", 1)[0]
    if not exc_type or rank is None or not first.startswith(head):
        return None
    message = first[len(head):].lstrip(": ").strip()
    where = f"in worker rank {rank}"
    message = f"{message} ({where})" if message else where
    remote = _without_library_frames(str(getattr(exc, "remote_traceback", "") or ""))
    return exc_type, message, remote


def describe_exception(name: str, exc: BaseException) -> StudentError:
    """A :class:`StudentError` carrying text only (what may cross the boundary).

    A worker's error (a runtime ``WorkerError`` from a rank that raised) is described by the
    worker's own exception: its type, its message and its traceback without the runtime's frames."""
    kinds = exception_kinds(exc)
    worker = _worker_error(exc)
    if worker is not None:
        type_name, message, remote = worker
        return StudentError(name, type_name, message[:2000], remote[-6000:], kinds)
    message = str(exc) if not isinstance(exc, RecursionError) else "maximum recursion depth exceeded"
    where = ""
    remote = getattr(exc, "remote_traceback", None)
    if remote:
        last = [line for line in str(remote).strip().splitlines() if line.strip()]
        where = last[-1].strip() if last else ""
    text = _tb.format_exc()
    if where and where not in message:
        message = f"{message} (in a worker: {where})"
    return StudentError(name, type(exc).__name__, message[:2000], text[-6000:], kinds)


def student_label(args: tuple, kwargs: dict, default: str) -> str:
    """The name of the first student function among a harness's arguments (for messages)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, StudentFunction):
            return a.name
        if isinstance(a, dict) and set(a) == {"__student__"}:
            return str(a["__student__"])
    return default


def swap_student_functions(args: tuple, kwargs: dict, lookup) -> Tuple[tuple, dict]:
    """Replace every :class:`StudentFunction` (or its marker) by ``lookup(name)``."""
    def one(a):
        if isinstance(a, StudentFunction):
            return lookup(a.name)
        if isinstance(a, dict) and set(a) == {"__student__"}:
            return lookup(a["__student__"])
        return a
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


class LocalCode(StudentCode):
    """The student's namespace in this process (``check()`` in a notebook, and tests)."""

    def __init__(self, ns: Dict[str, Any]):
        self.ns = ns

    def __contains__(self, name):
        return name in self.ns

    def __getitem__(self, name):
        value = self.ns[name]
        return StudentFunction(self, name) if callable(value) else roundtrip(value)

    def _function(self, name):
        if name not in self.ns:
            raise KeyError(name)
        return self.ns[name]

    def call(self, name, args, kwargs, observe=False):
        args, kwargs = roundtrip(args), roundtrip(kwargs)
        try:
            result = self._function(name)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the student's code can raise anything
            raise describe_exception(name, exc) from None
        return _back(name, Observed(result, args) if observe else result)

    def run_harness(self, ref, args, kwargs):
        fn = resolve_harness(ref)
        args, kwargs = roundtrip(_markers(args)), roundtrip(_markers(kwargs))
        label = student_label(args, kwargs, ref.rsplit(":", 1)[-1])
        args, kwargs = swap_student_functions(args, kwargs, self._function)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise describe_exception(label, exc) from None
        return _back(label, result)


def _markers(x):
    """StudentFunction -> {"__student__": name}, so arguments are plain data."""
    if isinstance(x, StudentFunction):
        return {"__student__": x.name}
    if isinstance(x, tuple):
        return tuple(_markers(v) for v in x)
    if isinstance(x, dict):
        return {k: _markers(v) for k, v in x.items()}
    return x


def to_plain_args(args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """Arguments with student functions replaced by markers (ready to :func:`encode`)."""
    return _markers(args), _markers(kwargs)


def _back(name: str, value):
    """``value`` as the grader would see it, or :class:`NotPlainData`."""
    if isinstance(value, Observed):
        try:
            return Observed(roundtrip(value.result), roundtrip(value.args))
        except PlainDataError as e:
            raise NotPlainData(name, str(e)) from None
    try:
        return roundtrip(value)
    except PlainDataError as e:
        raise NotPlainData(name, str(e)) from None
