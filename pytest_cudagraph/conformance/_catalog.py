"""A check declares itself once: its name, what it needs of a target and what sharpens it, where
it can judge, whether its verdict rests on a capture it saw (witnessed) and whether it may break
the target.

``@check(...)`` puts one frozen ``Declaration`` on a check function as the mark
``cudagraph_check``; the suite reads it at collection (``declaration_of``), as pytest's skipping
reads its marks, and everything else comes from it: the row's name in the table, the skips for
what the target does not give or for a missing GPU, the target rebuilt after a check that
breaks it, ``pytest-cudagraph checks`` and the docs' table (``needs_table``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, TypeVar

import pytest

from pytest_cudagraph.conformance._protocol import CAPABILITIES, CudaGraphTarget

CHECKS_FOLDER = Path(__file__).parent / "checks"
MARK = "cudagraph_check"
# Where a check can judge: anywhere ("cpu": the target's code, no graph), on CUDA graphs
# ("graphs"), or on a GPU itself ("gpu": NVML, two devices, real streams, worker processes).
RunsOn = Literal["cpu", "graphs", "gpu"]
RUNS_ON: tuple[RunsOn, ...] = ("cpu", "graphs", "gpu")
SLOTS = {kind.SLOT: kind for kind in CAPABILITIES}
F = TypeVar("F", bound=Callable[..., object])
T = TypeVar("T")


@dataclass(frozen=True)
class Declaration:
    """What a check is: ``name`` (as the table shows it), ``needs`` (each ``slot`` or
    ``slot.field`` of the target: the check skips without it), ``sharper_with`` (what it uses
    when given), ``runs_on``, ``witnessed`` and ``breaks_target`` (it injects faults or fills a
    cache past its capacity: the suite looks for the target's graphs after it)."""

    name: str
    needs: tuple[str, ...] = ()
    sharper_with: tuple[str, ...] = ()
    runs_on: RunsOn = "graphs"
    witnessed: bool = False
    breaks_target: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a check's name must be a non-empty string, got {self.name!r}")
        for need in (*self.needs, *self.sharper_with):
            slot, _, field = need.partition(".")
            kind = SLOTS.get(slot)
            if kind is None or (field and field not in {f.name for f in fields(kind)}):
                raise ValueError(f"check {self.name!r}: {need!r} is no capability or field of one")
        if self.runs_on not in RUNS_ON:
            raise ValueError(f"check {self.name!r}: runs_on must be one of {RUNS_ON}")

    def lacking(self, target: CudaGraphTarget) -> list[str]:
        """Which of ``needs`` the target does not give."""
        missing = []
        for need in self.needs:
            slot, _, field = need.partition(".")
            value = getattr(target, slot)
            if value is None or (field and getattr(value, field) is None):
                missing.append(need)
        return missing


def check(
    name: str,
    *,
    needs: Sequence[str] = (),
    sharper_with: Sequence[str] = (),
    runs_on: RunsOn = "graphs",
    witnessed: bool = False,
    breaks_target: bool = False,
) -> Callable[[F], F]:
    """Declare the check it decorates (see ``Declaration``)."""
    declaration = Declaration(
        name, tuple(needs), tuple(sharper_with), runs_on, witnessed, breaks_target
    )
    mark: Callable[[F], F] = getattr(pytest.mark, MARK)(declaration)
    return mark


def declaration_of(item: pytest.Item | Callable[..., object]) -> Declaration | None:
    """The declaration of a collected check, or of a check function; None for anything else."""
    if isinstance(item, pytest.Item):
        marker = item.get_closest_marker(MARK)
        marks = [marker] if marker is not None else []
    else:
        marks = [mark for mark in getattr(item, "pytestmark", []) if mark.name == MARK]
    if not marks:
        return None
    found = marks[0].args[0]
    if not isinstance(found, Declaration):
        raise TypeError(f"the {MARK} mark takes a Declaration, got {type(found).__name__}")
    return found


def declared_checks(folder: Path = CHECKS_FOLDER) -> list[Declaration]:
    """Every check of the suite, in the table's order (its modules', then their functions')."""
    found = []
    for path in sorted(folder.glob("test_*.py")):
        module = importlib.import_module(f"pytest_cudagraph.conformance.checks.{path.stem}")
        for value in vars(module).values():
            declaration = declaration_of(value) if callable(value) else None
            if declaration is not None:
                found.append(declaration)
    return found


def needs_table(checks: Sequence[Declaration]) -> list[str]:
    """What each check needs, as a Markdown table (docs/own-graphs.md holds it;
    ``pytest-cudagraph checks`` prints it)."""
    lines = [
        "| check | judges on | needs | sharper with | witnessed |",
        "| --- | --- | --- | --- | --- |",
    ]
    where = {"cpu": "anything", "graphs": "CUDA graphs", "gpu": "a GPU"}
    for row in checks:
        needs = ", ".join(f"`{need}`" for need in row.needs) or "-"
        uses = ", ".join(f"`{use}`" for use in row.sharper_with) or "-"
        witnessed = "yes" if row.witnessed else "no"
        lines.append(f"| {row.name} | {where[row.runs_on]} | {needs} | {uses} | {witnessed} |")
    return lines


def lacking_reason(missing: Sequence[str]) -> str:
    """The skip reason of a check whose capabilities (or fields of one) are not given."""
    return (
        f"the target does not give {', '.join(missing)} (optional; `pytest-cudagraph checks` "
        "lists what each check needs)"
    )


def declared(value: T | None) -> T:
    """A field the check's declaration needs, which the target gives (the check skipped
    otherwise)."""
    if value is None:
        raise TypeError("a field the check's declaration needs is missing: declare it in needs")
    return value
