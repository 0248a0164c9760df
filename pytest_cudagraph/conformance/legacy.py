"""The target spellings of earlier releases, accepted until 0.5.0 with a DeprecationWarning.

0.3.0 gave every capability as a flat field of ``CudaGraphTarget`` (``reset=``, ``capacity=``,
``sampler=``, ...) and described cases as ``make_inputs(generator, case_number)`` over
``num_keys``; the release before gave the adapters ``draw(generator, key)``. Each is translated
here into the new form, with one warning that points at the user's line and names the new
spelling; a form that cannot be told apart is an error naming both. This module imports
nothing of the protocol: the capability classes are handed to it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

REMOVED_IN = "0.5.0"


class Case(Protocol):
    """What this module reads of the protocol's ``Case``."""

    @property
    def number(self) -> int: ...

    @property
    def key(self) -> Hashable: ...


# 0.3.0's flat field -> (the capability slot, its field there).
OLD_FIELDS: dict[str, tuple[str, str]] = {
    "reset": ("cache", "reset"),
    "lock": ("cache", "lock"),
    "cached_keys": ("cache", "cached_keys"),
    "capacity": ("cache", "capacity"),
    "fault_points": ("cache", "fault_points"),
    "largest_case": ("cache", "largest_key"),
    "reset_state": ("state", "reset"),
    "side_state": ("state", "sides"),
    "sampler": ("sampling", "sample"),
    "unsupported_modes": ("guards", "modes"),
    "refusal_errors": ("guards", "refusal_errors"),
    "run_workers": ("workers", "run"),
    "graph_skips": ("fallbacks", "graph_skips"),
    "runs_eagerly": ("fallbacks", "runs_eagerly"),
    "capture_clean_forward": ("capture_clean", "forward"),
}
OLD_CASES = ("make_inputs", "num_keys")
PACKAGE = Path(__file__).resolve().parents[1]

T = TypeVar("T")


class DrawSpellingError(TypeError):
    """A ``draw`` that fails under the new spelling and the old one alike."""


def warn_at_user(message: str, where: tuple[str, int] | None = None) -> None:
    """A DeprecationWarning at ``where`` (file, line), or at the first frame outside this
    package: the user's line, whatever the depth of the calls that led here."""
    if where is None:
        frame = sys._getframe(1)
        while frame.f_back is not None and _internal(frame.f_code.co_filename):
            frame = frame.f_back
        where = (frame.f_code.co_filename, frame.f_lineno)
        registry = frame.f_globals.setdefault("__warningregistry__", {})
        module = frame.f_globals.get("__name__", "")
    else:
        registry, module = {}, ""
    warnings.warn_explicit(
        message, DeprecationWarning, where[0], where[1], module=module, registry=registry
    )


def _internal(filename: str) -> bool:
    """A frame a warning should not point at: this package's, the import machinery's (an import
    statement's warning belongs to the line that imports), pytest's assertion rewriter's."""
    if filename.startswith("<frozen "):
        return True
    path = Path(filename)
    return path.is_relative_to(PACKAGE) or path.parts[-3:] == ("_pytest", "assertion", "rewrite.py")


def accepts_old_spellings(capabilities: tuple[type, ...]) -> Callable[[type[T]], type[T]]:
    """A class decorator: the class's ``__init__`` also takes 0.3.0's flat fields and
    ``make_inputs``/``num_keys``, translated into ``capabilities`` (classes with a ``SLOT``)
    and ``keys``/``draw``, with one DeprecationWarning naming the new spelling."""
    classes = {kind.SLOT: kind for kind in capabilities}  # type: ignore[attr-defined]

    def decorate(cls: type[T]) -> type[T]:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: T, **given: object) -> None:
            if any(name in OLD_FIELDS or name in OLD_CASES for name in given):
                given = upgraded(cls.__name__, given, classes)
            init(self, **given)

        setattr(cls, "__init__", __init__)  # noqa: B010  (mypy forbids assigning a method)
        return cls

    return decorate


def upgraded(
    owner: str,
    given: Mapping[str, object],
    classes: Mapping[str, type],
    names: Mapping[str, tuple[str, str]] = OLD_FIELDS,
) -> dict[str, object]:
    """``given`` with the old spellings (``names``: old field -> its capability slot and field
    there) translated, with a DeprecationWarning naming each; an old spelling given beside a
    capability it belongs to is merged into it."""
    fields = dict(given)
    old = sorted(name for name in given if name in names or name in OLD_CASES)
    new_spelling: list[str] = []
    if any(name in fields for name in OLD_CASES):
        fields.update(_cases(owner, fields))
        new_spelling.append(
            "keys=range(num_keys), draw=lambda generator, case: make_inputs(generator, "
            "case.number) (or your graph keys, and draw on case.key)"
        )
    slots: dict[str, dict[str, object]] = {}
    for name in [name for name in fields if name in names]:
        value = fields.pop(name)
        slot, field = names[name]
        if name == "largest_case" and value is not None:
            value = _largest_key(owner, fields, value)
        if value is not None:
            slots.setdefault(slot, {})[field] = value
    guards = slots.get("guards", {})
    if "refusal_errors" in guards and "modes" not in guards:
        del slots["guards"]  # nothing reads refusal errors without modes to refuse
    for slot, values in slots.items():
        kind = classes[slot]
        shown = ", ".join(f"{field}=..." for field in values)
        new_spelling.append(f"{slot}={kind.__name__}({shown})")
        present = fields.get(slot)
        if isinstance(present, kind):  # dataclasses.replace(target, capacity=...), say
            values = {f: getattr(present, f) for f in present.given()} | values  # type: ignore[attr-defined]
        fields[slot] = kind(**values)
    warn_at_user(
        f"{owner}({'=..., '.join(old)}=...) is the spelling of pytest-cudagraph 0.3.0, "
        f"accepted until {REMOVED_IN}; write {'; '.join(new_spelling)} "
        "(from pytest_cudagraph.conformance)"
    )
    return fields


def _cases(owner: str, fields: dict[str, object]) -> dict[str, object]:
    """``keys`` and ``draw`` for 0.3.0's ``make_inputs(generator, number)`` over ``num_keys``."""
    make_inputs, num_keys = fields.pop("make_inputs", None), fields.pop("num_keys", None)
    if "keys" in fields or "draw" in fields:
        raise TypeError(
            f"{owner}: make_inputs and num_keys are 0.3.0's spelling of draw and keys; give "
            "draw and keys, not both spellings"
        )
    if make_inputs is None or num_keys is None:
        missing = "num_keys" if make_inputs is not None else "make_inputs"
        raise TypeError(f"{owner}: make_inputs and num_keys go together; {missing} is missing")
    if isinstance(num_keys, bool) or not isinstance(num_keys, int) or num_keys < 1:
        raise ValueError(f"{owner}: num_keys must be an int >= 1, got {num_keys!r}")
    if not callable(make_inputs):
        raise TypeError(f"{owner}: make_inputs must be callable, got {type(make_inputs).__name__}")
    return {"keys": range(num_keys), "draw": numbered_draw(make_inputs)}


def numbered_draw(make_inputs: Callable[[object, int], T]) -> Callable[[object, Case], T]:
    """``draw(generator, case)`` calling 0.3.0's ``make_inputs(generator, case.number)``."""

    def draw(generator: object, case: Case) -> T:
        return make_inputs(generator, case.number)

    draw.old_spelling = make_inputs  # type: ignore[attr-defined]
    return draw


def _largest_key(owner: str, fields: Mapping[str, object], case: object) -> Hashable:
    keys = fields.get("keys")
    if not isinstance(keys, Sequence):
        keys = None
    if isinstance(case, bool) or not isinstance(case, int) or case < 0:
        raise ValueError(f"{owner}: largest_case must be an int >= 0, got {case!r}")
    if keys is None or not len(keys):
        raise TypeError(f"{owner}: largest_case needs keys (or num_keys) to name its key")
    return keys[case % len(keys)]


def old_attribute(target: object, name: str, defaults: Mapping[str, object]) -> Any:
    """0.3.0's flat field ``name`` of a target, read from its new home with a warning
    (``defaults``: what a field not given read as in 0.3.0)."""
    owner = type(target).__name__
    if name in OLD_FIELDS:
        slot, field = OLD_FIELDS[name]
        warn_at_user(
            f"{owner}.{name} is the spelling of pytest-cudagraph 0.3.0, accepted until "
            f"{REMOVED_IN}; read {owner}.{slot}.{field}"
        )
        capability = getattr(target, slot)
        value = getattr(capability, field) if capability is not None else None
        if name == "largest_case" and value is not None:
            keys: Sequence[Hashable] = getattr(target, "keys")  # noqa: B009
            return list(keys).index(value)
        return defaults.get(name) if value is None else value
    raise AttributeError(f"{owner!r} object has no attribute {name!r}")


# draw(generator, key), the spelling before 0.3.0


def draw_spelling(draw: Callable[..., object]) -> str | None:
    """What ``draw``'s second parameter says it takes: "case", "key", or None (unnamed)."""
    try:
        parameters = list(inspect.signature(draw).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return None
    name = positional[1].name
    return name if name in ("case", "key") else None


def first_draw(draw: Callable[..., T], generator: object, case: Case) -> tuple[Callable[..., T], T]:
    """Case ``case`` drawn with ``draw``: ``(the draw to keep, the inputs)``. A draw written
    for the release before 0.3.0, ``draw(generator, key)``, is kept wrapped (it gets
    ``case.key``), with a DeprecationWarning at its definition. Told apart by its parameter's
    name (``case`` or ``key``) or, unnamed, by which spelling it accepts; one that fails both
    ways raises DrawSpellingError with both errors."""
    spelling = draw_spelling(draw)
    if spelling == "key":
        return _keyed(draw), draw(generator, case.key)
    if spelling == "case":
        return draw, draw(generator, case)
    try:
        return draw, draw(generator, case)
    except Exception as new_error:
        try:
            inputs = draw(generator, case.key)
        except Exception as old_error:
            raise DrawSpellingError(
                f"draw(generator, case) raised {type(new_error).__name__}: {new_error}; "
                f"called as draw(generator, key), the spelling before 0.3.0, it raised "
                f"{type(old_error).__name__}: {old_error}. Name its second parameter "
                "'case' (it gets a Case: case.key, case.repeat, case.number) or 'key'"
            ) from new_error
        return _keyed(draw), inputs


def _keyed(draw: Callable[..., T]) -> Callable[..., T]:
    code = getattr(draw, "__code__", None)
    where = (code.co_filename, code.co_firstlineno) if code is not None else None
    warn_at_user(
        f"draw(generator, key) ({getattr(draw, '__qualname__', 'draw')}) is the spelling before "
        f"pytest-cudagraph 0.3.0, accepted until {REMOVED_IN}; write draw(generator, case) and "
        "read case.key",
        where,
    )

    def keyed(generator: object, case: Case) -> T:
        return draw(generator, case.key)

    keyed.old_spelling = draw  # type: ignore[attr-defined]
    return keyed
