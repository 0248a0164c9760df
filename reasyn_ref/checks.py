"""Argument checks shared by reasyn_ref's entry points, in one style: each runs before any work
and raises a TypeError for a value of the wrong type, a ValueError for one of the right type but
out of range, naming the input and the rule it breaks ("{name} must be {rule}, got {value}")."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import SupportsIndex

import torch
from torch import Tensor


def check_int(
    name: str, value: object, *, minimum: int, maximum: int | None = None, label: str = ""
) -> int:
    """``value`` must be an int (not a bool) in [minimum, maximum] (no upper bound when
    ``maximum`` is None). ``label`` names the maximum in the rule: "B" gives [1, B=4]."""
    if maximum is None:
        rule = f"an int >= {minimum}"
    else:
        rule = f"an int in [{minimum}, {label}{'=' if label else ''}{maximum}]"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value


def check_number(
    name: str,
    value: object,
    *,
    minimum: float,
    inclusive: bool = True,
    what: str = "a finite number",
) -> float:
    """``value`` must be a finite real number (not a bool) >= ``minimum`` (> when not
    ``inclusive``); ``what`` says what it is ("a number of seconds"). Returns it as a float."""
    rule = f"{what} {'>=' if inclusive else '>'} {minimum:.3g}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    number = float(value)
    above = number >= minimum if inclusive else number > minimum
    if not (math.isfinite(number) and above):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` must be a bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` must be one of the strings ``choices``."""
    rule = " or ".join(repr(choice) for choice in choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value


def check_device(name: str, value: object) -> torch.device:
    """``value`` as a torch.device: a torch.device, a device string ("cuda:1") or an index."""
    rule = "a torch.device, a device string or an index"
    if isinstance(value, bool) or not isinstance(value, (torch.device, str, int)):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    try:
        return torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name} must be {rule}, got {value!r} ({exc})") from exc


# How a dtype is named in a rule: torch prints torch.long as torch.int64.
DTYPE_NAMES = {torch.long: "torch.long", torch.bool: "torch.bool"}


def check_tensor(name: str, value: object, dtype: torch.dtype | None) -> Tensor:
    """``value`` must be a tensor of ``dtype`` (None: of any floating-point dtype)."""
    kind = "floating-point" if dtype is None else DTYPE_NAMES.get(dtype, str(dtype))
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a {kind} tensor, got {describe(value)}")
    if not (value.is_floating_point() if dtype is None else value.dtype == dtype):
        raise ValueError(f"{name} must be a {kind} tensor, got {describe(value)}")
    return value


def token_id(value: object) -> int:
    """An int token id (a Python or numpy int, not a bool); TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a token id")
    if not isinstance(value, SupportsIndex):
        raise TypeError(f"a token id must be an int, got {type(value).__name__}")
    return operator.index(value)


def token_rows(name: str, rows: object) -> tuple[tuple[int, ...], ...]:
    """``rows`` (the prefixes of a sampling call) as a tuple of non-empty tuples of int token
    ids: a sequence of sequences (or 1-D tensors) of ints, not a string, holding a row or more.
    Which ids and lengths a model takes is its sampler's check."""
    if isinstance(rows, (str, bytes, Tensor)) or not isinstance(rows, Sequence):
        raise TypeError(f"{name} must be a sequence of token-id sequences, got {describe(rows)}")
    if not rows:
        raise ValueError(f"{name} must hold at least one row")
    parsed = []
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, (Sequence, Tensor)):
            raise TypeError(f"{name}[{i}] must be a sequence of int token ids, got {describe(row)}")
        try:
            ids = tuple(token_id(token) for token in row)
        except TypeError as exc:
            raise TypeError(f"{name}[{i}] must hold int token ids: {exc}") from exc
        if not ids:
            raise ValueError(f"{name}[{i}] is empty; a prefix needs a token")
        parsed.append(ids)
    return tuple(parsed)


def describe(value: object) -> str:
    """A short description of ``value`` for error messages: dtype, shape and device of a
    tensor, the type's name of anything else."""
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return type(value).__name__
