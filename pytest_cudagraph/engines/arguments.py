"""The argument checks the engines share, so that a bad argument reads alike wherever it is
given: refused before any work, a TypeError for a wrong type and a ValueError for a wrong
value, each naming the argument and the rule."""

from __future__ import annotations

import math


def non_negative_number(name: str, value: object, *, kind: str = "a number") -> float:
    """``value`` as a float when it is a finite number >= 0 (a bool is not a number here);
    ``kind`` is what the TypeError says it must be (``"a number of MiB"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past what a float holds
        finite = False
    if not (finite and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)
