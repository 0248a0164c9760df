"""Records: the plain data a test records for the results, and each report's own account.

A test records with ``record(item, kind, value)``: the value travels in the report's
``user_properties`` (xdist carries it to the controller) in an envelope whose run token tells
it from a user's own ``record_property``. ``records_from`` gathers one report's records and its
``phase`` record (outcome, seconds, whole reason, the user's properties as ``plain`` holds
them). A user's property is never trusted to behave: one whose ``str``, iteration or keys raise
is kept as a description, so that it never ends a run that passed.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_cudagraph.reasons import outcome_of, reason_of

RECORD_PREFIX = "cudagraph_"
ENVELOPE = "pytest_cudagraph"  # the key of a recorded value in its envelope
TOKEN = "run"  # the key of the run token in an envelope
PHASE = "phase"  # the kind of the record every report gives (not recordable by hand)
# How deep plain data nests: a user's property past it is cut (``plain``), a record refused.
MAX_NESTING = 64
PLAIN_DATA = "dicts with string keys, lists, tuples, strings, numbers, bools and None"
NOT_JSON = "not JSON: "  # how the description of a value JSON cannot hold opens
# Set on a report of a test that uses the plugin (its markers, fixtures or conformance
# checks); a plain attribute, so it travels from xdist workers.
USES_PLUGIN = "cudagraph_uses_plugin"


@dataclass(frozen=True)
class Record:
    """One piece of plain data a test recorded (``kind`` names the section that reads it)."""

    kind: str
    nodeid: str
    value: Any  # JSON-shaped, as it came through the report; its kind's section knows the shape


# This process's run token: every envelope carries it, so that a value a user gives
# record_property in the envelope's shape is never read as the plugin's. An xdist worker takes
# its controller's (``join_run``), so that the controller reads the workers' envelopes.
_run = {"token": secrets.token_hex(16)}


def run_token() -> str:
    """The token the envelopes of this run carry (an xdist controller hands it to workers)."""
    return _run["token"]


def join_run(token: str) -> None:
    """Carry ``token``, the controller's, in this xdist worker's envelopes."""
    if not isinstance(token, str) or not token:
        raise TypeError(f"a run token is a non-empty string, got {token!r}")
    _run["token"] = token


def envelope(kind: str, value: object) -> tuple[str, dict[str, object]]:
    """The ``user_properties`` entry that carries a record (what ``record`` appends)."""
    if not isinstance(kind, str):
        raise TypeError(f"a record's kind must be a string, got {kind!r}")
    if not kind or kind == PHASE:
        raise ValueError(f"a record's kind must be a non-empty name other than {PHASE!r}")
    return (RECORD_PREFIX + kind, {ENVELOPE: value, TOKEN: run_token()})


def record(item: pytest.Item, kind: str, value: object) -> None:
    """Record ``value`` for the sections: plain data (JSON's types, ``check_plain``), as it
    may travel from an xdist worker and goes into the results file."""
    check_plain(value, f"record {kind!r}")
    item.user_properties.append(envelope(kind, value))


def check_plain(value: object, path: str, ancestors: tuple[int, ...] = ()) -> None:
    """TypeError naming the part of ``value`` that is not plain data: dicts with string keys,
    lists and tuples, strings, numbers, bools and None, nested at most ``MAX_NESTING`` deep,
    holding no container that holds it, and walked without raising."""
    if value is None or isinstance(value, (str, int, float)):
        return
    if not isinstance(value, (dict, list, tuple)):
        raise TypeError(
            f"{path}: a value of type {type_name(value)} is not plain data ({PLAIN_DATA})"
        )
    if id(value) in ancestors or len(ancestors) == MAX_NESTING:
        why = "holds itself" if id(value) in ancestors else f"is deeper than {MAX_NESTING} levels"
        raise TypeError(f"{path}: {why} ({PLAIN_DATA})")
    try:
        items = _items(value)
    except _Unwalkable as error:
        raise TypeError(f"{path}: {error} ({PLAIN_DATA})") from None
    for key, item in items:
        if isinstance(value, dict) and not isinstance(key, str):
            raise TypeError(f"{path}: the key {key!r} is not a string ({PLAIN_DATA})")
        check_plain(item, f"{path}[{key!r}]", (*ancestors, id(value)))


class _Unwalkable(Exception):
    """A container whose own ``items`` or iteration raised (a user's class), described."""


def _items(container: Mapping[Any, object] | list[object] | tuple[object, ...]) -> list[Any]:
    """The (key, value) pairs of a mapping, or the (index, item) pairs of a list or tuple;
    ``_Unwalkable`` where a subclass's own ``items`` or iteration raises."""
    try:
        if isinstance(container, Mapping):
            return list(container.items())
        return list(enumerate(container))
    except Exception as error:  # a user's own class: anything may raise, named by its type
        raise _Unwalkable(
            f"a {type_name(container)} whose iteration raised {type_name(error)}"
        ) from None


def plugin_values(properties: Iterable[object]) -> list[tuple[str, object]]:
    """(kind, value) of each entry of ``properties`` that ``record`` wrote, in order."""
    found = []
    for entry in properties:
        name, value = _pair(entry)
        if _is_envelope(name, value):
            assert isinstance(name, str) and isinstance(value, dict)
            found.append((name.removeprefix(RECORD_PREFIX), value[ENVELOPE]))
    return found


def foreign_properties(properties: Iterable[object]) -> list[list[object]]:
    """The user's own properties (``record_property``): every entry ``record`` did not write,
    as [name, value]; a value of our prefix that is not ours is kept here, never read as ours."""
    pairs = (_pair(entry) for entry in properties)
    return [[name, value] for name, value in pairs if not _is_envelope(name, value)]


def _pair(entry: object) -> tuple[object, object]:
    # Exact types only: a subclass's own len() or indexing is the user's code, which may raise.
    if (type(entry) is tuple or type(entry) is list) and len(entry) == 2:
        return entry[0], entry[1]
    return None, entry


def _is_envelope(name: object, value: object) -> bool:
    # Exact types before any comparison: a subclass's ``==`` or ``startswith`` may raise.
    return (
        type(name) is str
        and name.startswith(RECORD_PREFIX)
        and name != RECORD_PREFIX + PHASE  # never recorded by hand (``envelope`` refuses it)
        and type(value) is dict
        and value.keys() == {ENVELOPE, TOKEN}
        and type(value[TOKEN]) is str
        and value[TOKEN] == run_token()
    )


def records_from(report: pytest.TestReport | pytest.CollectReport) -> list[Record]:
    """The records in one report: what its test recorded (from the call's report, which holds
    everything recorded up to then), then the report's own ``phase`` record. Collection gives
    a phase record only where it failed or skipped."""
    found = []
    if report.when == "call":
        found += [Record(kind, report.nodeid, v) for kind, v in plugin_values(_properties(report))]
    if report.when != "collect" or not report.passed:
        found.append(Record(PHASE, report.nodeid, phase_of(report)))
    return found


def _properties(report: pytest.TestReport | pytest.CollectReport) -> list[object]:
    return list(getattr(report, "user_properties", ()))


def phase_of(report: pytest.TestReport | pytest.CollectReport) -> dict[str, object]:
    """One report as plain data: its phase, outcome (as pytest counts it), seconds, whole
    reason, whether its test uses the plugin (a marker or fixture of it, or a record for it,
    as each conformance check holds from collection on), and the user's own properties."""
    recorded = bool(plugin_values(_properties(report)))
    return {
        "when": report.when,
        "outcome": outcome_of(report),
        "duration": float(getattr(report, "duration", 0.0)),
        "reason": reason_of(report),
        "uses_plugin": recorded or bool(getattr(report, USES_PLUGIN, False)),
        "worker": getattr(report, "worker_id", None),
        "properties": [
            [plain(name), plain(value)] for name, value in foreign_properties(_properties(report))
        ],
    }


def plain(value: object, ancestors: tuple[int, ...] = ()) -> object:
    """``value`` as strict JSON holds it, in JSON's own types, never raising: a non-finite
    float becomes its name ("nan", "inf", "-inf"), a tuple a list, a mapping whose keys print
    alike (``{1: a, "1": b}``) a list of [key, value] pairs, any other object its ``str``. What
    JSON cannot hold is described, in text opening with ``NOT_JSON``: a container that holds
    itself, nests deeper than ``MAX_NESTING`` or whose iteration raises, an int too long for
    JSON's decimal form (kept in hex), an object whose ``str`` raises."""
    if isinstance(value, float):  # a subclass as its float: its own methods may raise
        number = float.__float__(value)
        return number if math.isfinite(number) else str(number)
    if isinstance(value, int) and not isinstance(value, bool):
        number = int.__int__(value)
        return number if _has_decimal_form(number) else f"{NOT_JSON}an int, in hex {number:#x}"
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if not isinstance(value, (Mapping, list, tuple)):
        return text_of(value)
    if id(value) in ancestors:
        return f"{NOT_JSON}a {type_name(value)} that holds itself"
    if len(ancestors) == MAX_NESTING:
        return f"{NOT_JSON}a {type_name(value)} nested deeper than {MAX_NESTING} levels"
    try:
        items = _items(value)
    except _Unwalkable as error:
        return f"{NOT_JSON}{error}"
    inner = (*ancestors, id(value))
    if not isinstance(value, Mapping):
        return [plain(item, inner) for _, item in items]
    keyed = [
        (str.__str__(key) if isinstance(key, str) else text_of(key), key, item)
        for key, item in items
    ]
    if len({text for text, _, _ in keyed}) == len(keyed):
        return {text: plain(item, inner) for text, _, item in keyed}
    return [[plain(key, inner), plain(item, inner)] for _, key, item in keyed]


def _has_decimal_form(number: int) -> bool:
    try:
        int.__repr__(number)  # refused past sys.get_int_max_str_digits() (Python 3.11 on)
    except ValueError:
        return False
    return True


def text_of(value: object) -> str:
    """``str(value)`` as a plain ``str``, or a description where the value's ``__str__``
    raises (or gives a subclass of str, whose own methods may raise)."""
    try:
        return str.__str__(str(value))
    except Exception as error:  # its error's own text may raise too: named by its type
        return f"{NOT_JSON}a {type_name(value)} whose str() raised {type_name(error)}"


def type_name(value: object) -> str:
    """The qualified name of ``value``'s type, as messages name it (builtins bare)."""
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
