"""Every argument check of the conformance wing, in one place and one style: each runs before any
work and raises a TypeError for a value of the wrong type, a ValueError for one of the right type
that breaks a rule, naming the input (``Cache.capacity``, ``compiled: rerecord_limit``), the rule
and the value. Callbacks of the user's whose every result is checked (``CheckedCallback``), the
rules of a graph key (``key_problem``) and of a call's inputs (``inputs_problem``) live here too.
No pytest; torch is imported when a key is judged.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_cudagraph.engines.compare import Tolerance
from pytest_cudagraph.engines.faults import LockLike

# The stages a target names its own fault points for, at least (``Cache.fault_points``).
FAULT_STAGES = ("warm_up", "capture", "replay")


def field_name(owner: object, name: str) -> str:
    """How a message names a field: ``Class.field``."""
    return f"{type(owner).__name__}.{name}"


def shown(value: object) -> str:
    """A value as a message shows it: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def require_callable(subject: str, value: object, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not callable(value):
        kind = "callable or None" if optional else "callable"
        raise TypeError(f"{subject} must be {kind}, got {type(value).__name__}")


def require_flag(subject: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{subject} must be True or False, got {value!r}")


def require_count(subject: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{subject} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{subject} must be >= {low}, got {value!r}")


def require_choice(subject: str, value: object, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"{subject} must be one of {listed}, got {value!r}")


def require_string_keys(subject: str, value: object) -> Mapping[str, object]:
    """``value`` as a mapping whose every key is a string (``options``, say)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{subject} must be a mapping, got {type(value).__name__}")
    others = [key for key in value if not isinstance(key, str)]
    if others:
        raise TypeError(f"{subject} must have string keys, got {others[0]!r}")
    return value


def checked_keys(keys: object) -> Sequence[Any]:
    """``keys`` as a sequence of distinct hashable keys (a range as it is), or TypeError /
    ValueError naming what is wrong."""
    if isinstance(keys, range):
        if not keys:
            raise ValueError("CudaGraphTarget.keys must hold at least one graph key, got range()")
        return keys
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(
            f"CudaGraphTarget.keys must be a sequence of graph keys, got {type(keys).__name__}"
        )
    found = tuple(keys)
    for index, key in enumerate(found):
        try:
            hash(key)
        except TypeError:
            raise TypeError(
                f"CudaGraphTarget.keys[{index}] must be hashable, got {type(key).__name__} {key!r}"
            ) from None
    if not found or len(set(found)) != len(found):
        raise ValueError(
            f"CudaGraphTarget.keys must be at least one graph key, each once, got {list(found)!r}"
        )
    return found


def check_tolerance(tolerance: object) -> None:
    if isinstance(tolerance, Tolerance):
        return
    if not isinstance(tolerance, Mapping):
        raise TypeError(
            "CudaGraphTarget.tolerance must be a Tolerance or a mapping output part -> "
            f"Tolerance, got {type(tolerance).__name__}"
        )
    if not tolerance:
        raise ValueError(
            "CudaGraphTarget.tolerance must name at least one output part when a mapping"
        )
    for part, value in tolerance.items():
        if not isinstance(value, Tolerance):
            raise TypeError(
                f"CudaGraphTarget.tolerance[{part!r}] must be a Tolerance, got {type(value).__name__}"
            )


def check_lock(lock: LockLike) -> None:
    """A lock the checks can try from another thread, or TypeError naming what it is."""
    if not (callable(getattr(lock, "acquire", None)) and callable(getattr(lock, "release", None))):
        raise TypeError(f"Cache.lock must have acquire() and release(), got {type(lock).__name__}")
    kind = f"{type(lock).__module__}.{type(lock).__qualname__}"
    if inspect.iscoroutinefunction(lock.acquire):
        raise TypeError(
            f"Cache.lock is an asyncio lock ({kind}), taken by awaiting it: the checks try the "
            "lock from another thread; give the threading or multiprocessing lock around the "
            "graphs"
        )
    multiprocessing_semaphore = type(lock).__module__ == "multiprocessing.synchronize" and any(
        klass.__name__ == "Semaphore" for klass in type(lock).__mro__
    )
    if isinstance(lock, threading.Semaphore) or multiprocessing_semaphore:
        raise TypeError(
            f"Cache.lock is a semaphore ({kind}): a count, not a lock, and a probe cannot tell "
            "one slot left taken; give the lock the cache takes around its graphs"
        )


def check_fault_points(points: object) -> None:
    if not isinstance(points, Mapping):
        raise TypeError(f"Cache.fault_points must be a mapping, got {type(points).__name__}")
    try:
        entries = list(points.items())
    except Exception as error:  # a mapping whose reading raises
        raise ValueError(
            f"Cache.fault_points: reading its entries raised {type(error).__name__}: {error}"
        ) from None
    missing = [stage for stage in FAULT_STAGES if stage not in dict(entries)]
    if missing:
        raise ValueError(f"Cache.fault_points lacks the stage(s) {', '.join(missing)}")
    for stage, point in entries:
        if not (isinstance(point, tuple) and len(point) == 2 and isinstance(point[1], str)):
            raise TypeError(
                f"Cache.fault_points[{stage!r}] must be (object, method name), got {point!r}"
            )
        owner, attribute = point
        try:
            found = getattr(owner, attribute, None)
        except Exception as error:  # a property that raises
            raise ValueError(
                f"Cache.fault_points[{stage!r}]: reading {type(owner).__name__}.{attribute} "
                f"raised {type(error).__name__}: {error}"
            ) from None
        if not callable(found):
            raise ValueError(
                f"Cache.fault_points[{stage!r}]: {type(owner).__name__} has no method {attribute!r}"
            )


# Messages with nothing in common but a word character: a guard's regex that matches each of them
# (``.``, ``\\w``, ``.+``) matches any real message and says nothing of what is unmet.
ANY_MESSAGE = ("x", "0", "No.", "Unrelated words.")


def check_guard_modes(modes: object) -> None:
    """``Guards.modes``: name -> (zero-arg callable, regex), each regex saying something: one
    that matches the empty message, or every message (``.``, ``\\w``, ``.+``), proves nothing."""
    if not isinstance(modes, Mapping) or not modes:
        raise TypeError("Guards.modes must be a non-empty mapping name -> (callable, regex)")
    for name, mode in modes.items():
        if not (
            isinstance(mode, tuple)
            and len(mode) == 2
            and callable(mode[0])
            and isinstance(mode[1], str)
            and mode[1]
        ):
            raise TypeError(
                f"Guards.modes[{name!r}] must be (zero-arg callable, regex), got {mode!r}"
            )
        try:
            pattern = re.compile(mode[1])
        except (re.error, RecursionError, OverflowError) as error:
            raise ValueError(
                f"Guards.modes[{name!r}]: {mode[1]!r} is not a regex ({error})"
            ) from None
        if pattern.search("") is not None:
            raise ValueError(
                f"Guards.modes[{name!r}]: {mode[1]!r} matches the empty message, so any "
                "refusal would pass; give a regex of what the message says is unmet"
            )
        if all(pattern.search(sample) for sample in ANY_MESSAGE):
            raise ValueError(
                f"Guards.modes[{name!r}]: {mode[1]!r} matches any message (it matched each of "
                f"{', '.join(map(repr, ANY_MESSAGE))}), so any refusal would pass; give a regex "
                "of what the message says is unmet"
            )


def check_refusal_errors(errors: object) -> None:
    if not (
        isinstance(errors, tuple)
        and errors
        and all(isinstance(error, type) and issubclass(error, Exception) for error in errors)
    ):
        raise TypeError(
            f"Guards.refusal_errors must be a non-empty tuple of exception classes, got {errors!r}"
        )


# Callbacks of the user's whose every result is checked


@dataclass(frozen=True)
class CheckedCallback:
    """A callback of the user's whose every result is checked: ``rule(result, again, *args)``
    says what is wrong with it ("" when nothing; ``again()`` calls the callback anew on the same
    arguments), and a wrong result is a TypeError naming ``field``. It returns what the
    callback returns."""

    function: Callable[..., object]
    field: str
    rule: Callable[..., str]

    def __call__(self, *args: object) -> Any:
        result = self.function(*args)
        problem = self.rule(result, lambda: self.function(*args), *args)
        if problem:
            raise TypeError(f"{self.field} {problem}")
        return result


def wrap_checked(owner: object, name: str, rule: Callable[..., str]) -> None:
    """Wrap the callback ``owner.name`` of a frozen dataclass (when given, and not wrapped yet)
    in ``rule``."""
    function = getattr(owner, name)
    if function is not None and not isinstance(function, CheckedCallback):
        object.__setattr__(owner, name, CheckedCallback(function, field_name(owner, name), rule))


def unchecked(callback: Callable[..., object]) -> Callable[..., object]:
    """The user's own function behind a ``CheckedCallback`` (itself otherwise)."""
    return callback.function if isinstance(callback, CheckedCallback) else callback


def inputs_rule(result: object, again: object, *args: object) -> str:
    if isinstance(result, dict) and all(isinstance(name, str) for name in result):
        return ""
    return f"returned {shown(result)}; it must return a dict of input name -> value"


def same_call_rule(result: object, again: object, inputs: Mapping[str, object]) -> str:
    problem = inputs_rule(result, again)
    if problem or not isinstance(result, dict) or set(result) == set(inputs):
        return problem
    return (
        f"returned inputs named {sorted(result)}, not the call's {sorted(inputs)}: it must "
        "return the same call"
    )


def flag_rule(result: object, again: object, *args: object) -> str:
    if isinstance(result, bool):
        return ""
    return f"returned {shown(result)}; it must return True or False"


def key_rule(key: object, again: Callable[[], object], *args: object) -> str:
    return key_problem(key, again, "for the same inputs")


def inputs_problem(inputs: object) -> str | None:
    """What is wrong with a call's inputs as a callback returned them (a dict of input name ->
    value), or None."""
    if isinstance(inputs, dict) and all(isinstance(name, str) for name in inputs):
        return None
    forgot = " (a forgotten return?)" if inputs is None else ""
    return f"{type(inputs).__name__}{forgot}; it must return a dict of input name -> value"


def key_problem(key: object, other: Callable[[], object], of: str) -> str:
    """What is wrong with a graph key ``key_of`` returned ("" when nothing): it must be a plain
    value, equal to itself and to ``other()``, the key of the same call taken again (``of``
    says which): a tensor, NaN or a fresh ``object()`` never finds its graph again."""
    import torch

    if isinstance(key, torch.Tensor):
        return (
            f"returned a tensor ({shown(key)}); a key must be a plain value, e.g. int(x) or "
            "tuple(x.shape)"
        )
    try:
        hash(key)
        second = other()
        itself, alike = bool(key == key), bool(key == second) and hash(key) == hash(second)
    except Exception as error:  # an unhashable key, or one whose == raises
        return f"returned {shown(key)}, which cannot be a key: {type(error).__name__}: {error}"
    if not itself:
        return f"returned {shown(key)}, which is not equal to itself (NaN): no call finds it again"
    if not alike:
        return (
            f"gave two keys {of} ({shown(key)}, then {shown(second)}): a key must be a "
            "plain value that compares equal, not a fresh object"
        )
    return ""
