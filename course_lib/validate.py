"""Checks shared by the lessons' settings dataclasses, and the one way a runner builds its settings.

Each check raises at once with the setting's full name (``AsyncSettings.lr must be a number > 0,
got -1``): a bad value found in ``__post_init__`` fails the call that made it, before any process
starts, instead of hanging a run or being silently ignored by it.

A runner takes its settings whole, with keywords as overrides (:func:`settings_from`), so a
notebook may write either ``train_async(X, y, settings)`` or ``train_async(X, y, n_workers=3)``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import operator


def integer(owner: str, name: str, value, minimum: int | None = None) -> int:
    """``value`` as a plain int (np.int64 accepted, bool refused), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}.{name} must be an int, got {value!r}")
    value = operator.index(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}.{name} must be an int >= {minimum}, got {value!r}")
    return value


def number(owner: str, name: str, value, *, positive: bool = False) -> float:
    """``value`` as a finite float, > 0 if ``positive`` and >= 0 otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}.{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{owner}.{name} must be a finite number {'>' if positive else '>='} 0, got {value!r}")
    return value


def choice(owner: str, name: str, value, options: tuple) -> None:
    if value not in options:
        raise ValueError(f"{owner}.{name} must be one of {options}, got {value!r}")


def function(owner: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{owner}.{name} must be a function, got {value!r}")


def settings_from(cls, settings, overrides: dict):
    """``settings`` (an instance of the dataclass ``cls``, or None for its defaults) with ``overrides`` applied.

    An unknown keyword is a TypeError listing the settings there are, so a misspelt
    ``n_worker=3`` cannot run with the default number of workers."""
    if settings is None:
        settings = cls()
    elif not isinstance(settings, cls):
        raise TypeError(f"settings must be of type {cls.__name__}, got {type(settings).__name__}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise TypeError(f"{cls.__name__} has no setting {', '.join(unknown)}; its settings are "
                        f"{', '.join(f.name for f in dataclasses.fields(cls))}")
    return dataclasses.replace(settings, **overrides) if overrides else settings


def flag(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be True or False, got {value!r}")
