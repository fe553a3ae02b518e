"""Reduction operations, named as in MPI / mpi4py: SUM, PROD, MAX, MIN, MAXLOC, MINLOC.

An :class:`Op` combines two partial results, ``op(a, b)``, where ``a`` holds the
contributions of lower ranks and ``b`` those of higher ranks. Every op must be
associative; algorithms that reorder contributions (ring, pairwise exchange, recursive
halving) also need ``commute=True`` and refuse a non-commutative op with a clear error.

It works on numpy arrays (element-wise) and on ordinary Python objects, as mpi4py's
lowercase methods do: ``SUM(2, 3) == 5``, ``MAX([1, 2], [0, 5])`` is the larger list
(Python's ``max``), and ``MAXLOC`` reduces ``(value, index)`` pairs, keeping the
smallest index on ties.

``MEAN`` is not an MPI op: it reduces like ``SUM`` and divides by the number of
contributions at the end (``finalize``). A user op is ``Op.Create(fn, commute=True)``
(mpi4py's spelling) or just any function of two arguments.
"""
from __future__ import annotations

import inspect
import operator

import numpy as np

__all__ = ["Op", "SUM", "PROD", "MAX", "MIN", "MAXLOC", "MINLOC", "MEAN", "REPLACE", "NO_OP", "OP_NULL", "as_op"]


class Op:
    """A reduction operation: ``op(a, b)`` returns the combination of a (lower ranks) and b."""

    def __init__(self, fn, commute: bool = True, name: str | None = None, finalize=None):
        if not callable(fn):
            raise TypeError(f"an Op needs a function of two arguments, got {fn!r}")
        self.fn = fn
        self.commute = bool(commute)
        self.name = name or getattr(fn, "__name__", "user_op")
        self.finalize = finalize  # finalize(result, count) -> result, or None

    @classmethod
    def Create(cls, function, commute: bool = False) -> "Op":
        """mpi4py spelling. ``function(a, b)`` returns the combination; a three-argument
        ``function(invec, inoutvec, datatype)`` in mpi4py's buffer style is also accepted
        (it must update and return, or update in place, ``inoutvec``)."""
        try:
            nargs = len(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            nargs = 2
        if nargs == 3:
            def fn(a, b, _f=function):
                # MPI's user function computes inoutvec = invec op inoutvec, invec first.
                out = np.array(b, copy=True) if isinstance(b, np.ndarray) else b
                res = _f(a, out, None)
                return out if res is None else res
            fn.__name__ = getattr(function, "__name__", "user_op")
            return cls(fn, commute=commute)
        return cls(function, commute=commute)

    def Is_commutative(self) -> bool:
        return self.commute

    def __call__(self, a, b):
        return self.fn(a, b)

    def apply_final(self, value, count: int):
        return value if self.finalize is None else self.finalize(value, count)

    def __repr__(self):
        return self.name.upper() if self in _BUILTIN else f"Op({self.name})"

    def __reduce__(self):
        # Built-in ops travel by name, so identity (``op is SUM``) survives pickling.
        if self in _BUILTIN:
            return (_builtin, (self.name,))
        return (Op, (self.fn, self.commute, self.name, self.finalize))


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray)


def _sum(a, b):
    return np.add(a, b) if _is_array(a) or _is_array(b) else operator.add(a, b)


def _prod(a, b):
    return np.multiply(a, b) if _is_array(a) or _is_array(b) else operator.mul(a, b)


def _has_elements(x) -> bool:
    """An array with at least one axis: MAX and MIN compare it element by element."""
    return _is_array(x) and x.ndim > 0


# mpi4py's MAX is ``y if y > x else x`` on whole objects: for a 0-d array it returns the
# larger operand itself (a 0-d array, not a numpy scalar), and on arrays with axes it
# raises; course_lib compares those element-wise instead, as numpy users expect.
def _max(a, b):
    return np.maximum(a, b) if _has_elements(a) or _has_elements(b) else max(a, b)


def _min(a, b):
    return np.minimum(a, b) if _has_elements(a) or _has_elements(b) else min(a, b)


def _loc(a, b, better):
    try:
        (va, ia), (vb, ib) = a, b
    except (TypeError, ValueError):
        raise TypeError(f"MAXLOC/MINLOC reduce (value, index) pairs, got {a!r} and {b!r}") from None
    if better(va, vb):
        return (va, ia)
    if better(vb, va):
        return (vb, ib)
    return (va, min(ia, ib))  # tie: the smallest index, as MPI specifies


def _maxloc(a, b):
    return _loc(a, b, operator.gt)


def _minloc(a, b):
    return _loc(a, b, operator.lt)


def _mean_final(value, count):
    return value / count


SUM = Op(_sum, True, "sum")
PROD = Op(_prod, True, "prod")
MAX = Op(_max, True, "max")
MIN = Op(_min, True, "min")
MAXLOC = Op(_maxloc, True, "maxloc")
MINLOC = Op(_minloc, True, "minloc")
MEAN = Op(_sum, True, "mean", finalize=_mean_final)


def _replace(a, b):
    return b


def _no_op(a, b):
    return a


def _op_null(a, b):
    raise ValueError("MPI.OP_NULL is the absence of an operation: pass a reduction op (MPI.SUM, ...)")


# MPI's REPLACE and NO_OP (one-sided in MPI, a reduction for mpi4py's objects): the value of the last
# rank, or of the first, so they keep the rank order.
REPLACE = Op(_replace, False, "replace")
NO_OP = Op(_no_op, False, "no_op")
OP_NULL = Op(_op_null, False, "op_null")

_BUILTIN = (SUM, PROD, MAX, MIN, MAXLOC, MINLOC, MEAN, REPLACE, NO_OP, OP_NULL)
_BY_NAME = {op.name: op for op in _BUILTIN}


def _builtin(name: str) -> Op:
    return _BY_NAME[name]


def as_op(op) -> Op:
    """Accept an :class:`Op`, a name ("sum", "mean", ...) or a function of two arguments."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return _BY_NAME[op.lower()]
        except KeyError:
            raise ValueError(f"unknown op {op!r}; choose one of {sorted(_BY_NAME)}") from None
    if callable(op):
        return Op(op, commute=False)
    # mpi4py's own MPI.SUM etc., so a program that imported them still runs.
    name = getattr(op, "name", None) or str(op)
    for key in _BY_NAME:
        if key in str(name).lower():
            return _BY_NAME[key]
    raise TypeError(f"op must be an Op, a name or a function, got {op!r}")
