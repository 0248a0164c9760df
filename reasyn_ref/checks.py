"""Argument checks shared by the public entry points. Each raises before any work: a TypeError
for a value of the wrong type, a ValueError for one out of range, naming the input and the
rule it breaks."""

from __future__ import annotations

import math
import operator

from torch import Tensor


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` must be an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_count(name: str, value: object) -> int:
    """``value`` must be an int >= 1 (not a bool)."""
    return check_int(name, value, minimum=1)


def check_bool(name: str, value: object) -> bool:
    """``value`` must be a bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_seconds(name: str, value: object) -> float:
    """``value`` must be a finite number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def token_id(value: object) -> int:
    """An int token id (a Python or numpy int, not a bool); TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a token id")
    return operator.index(value)


def describe(value: object) -> str:
    """A short description of ``value`` for error messages: dtype and shape of a tensor."""
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return type(value).__name__
