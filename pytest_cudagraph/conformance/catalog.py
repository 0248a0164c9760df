"""What each check needs of a target, and what it uses when given, in one place: the checks'
own calls of ``needed`` and ``given``.

A check asks for a capability with ``needed(target, Cache, "capacity")``, skipping without it
(naming what is missing), or reads one it can do without with ``given(target, Cache, "lock")``.
``check_needs()`` reads those calls from the check modules' source (``ast``: nothing imported),
so the tables of what each check needs (the docs, the account a CPU run ends with) are the
checks' own.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pytest_cudagraph.conformance.protocol import CAPABILITIES, Capability, CudaGraphTarget

CHECKS_FOLDER = Path(__file__).parent
C = TypeVar("C", bound=Capability)
SLOTS = {kind.__name__: kind.SLOT for kind in CAPABILITIES}


def needed(target: CudaGraphTarget, kind: type[C], *fields: str) -> C:
    """The target's capability of class ``kind``, with ``fields`` of it given; the check skips,
    naming what is missing, otherwise."""
    value = target.capability(kind)
    if value is None:
        pytest.skip(lacking_reason([kind.SLOT]))
    missing = [f"{kind.SLOT}.{name}" for name in fields if getattr(value, name) is None]
    if missing:
        pytest.skip(lacking_reason(missing))
    return value


def given(target: CudaGraphTarget, kind: type[Capability], field: str) -> Any:
    """The ``field`` of the target's capability of class ``kind``, or None where the target
    does not give it: for a check that is sharper with it and runs without it."""
    value = target.capability(kind)
    return None if value is None else getattr(value, field)


def lacking_reason(missing: Sequence[str]) -> str:
    """The skip reason of a check whose capabilities (or fields of one) are not given."""
    return (
        f"the target does not give {', '.join(missing)} (optional; `pytest-cudagraph checks` "
        "lists what each check needs)"
    )


def lacking(target: CudaGraphTarget, needs: Sequence[str]) -> list[str]:
    """Which of ``needs`` (``slot`` or ``slot.field``) the target does not give."""
    missing = []
    for need in needs:
        slot, _, field = need.partition(".")
        value = getattr(target, slot)
        if value is None or (field and getattr(value, field) is None):
            missing.append(need)
    return missing


@dataclass(frozen=True)
class CheckNeeds:
    """One check: its name as the table shows it, whether it needs CUDA, what it needs (each
    ``slot`` or ``slot.field``) and what it uses when given."""

    check: str
    cuda: bool
    needs: tuple[str, ...]
    uses: tuple[str, ...]


def check_needs(folder: Path = CHECKS_FOLDER) -> list[CheckNeeds]:
    """Every check of the suite in the table's order, read from its module's source: the
    ``needed`` and ``given`` calls in the check, its fixtures and the functions it calls."""
    found = []
    for path in sorted(folder.glob("test_*.py")):
        module = ast.parse(path.read_text())
        functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
        for name, function in functions.items():
            if not name.startswith("test_"):
                continue
            needs: list[str] = []
            uses: list[str] = []
            for node in _reached(function, functions):
                for call in ast.walk(node):
                    asked = _asked(call)
                    if asked is not None:
                        kind, paths = asked
                        (needs if kind == "needed" else uses).extend(
                            p for p in paths if p not in needs and p not in uses
                        )
            cuda = any(ast.unparse(d) == "needs_cuda" for d in function.decorator_list)
            check = name.removeprefix("test_").replace("_", " ")
            found.append(CheckNeeds(check, cuda, tuple(needs), tuple(uses)))
    return found


def _reached(start: ast.FunctionDef, functions: dict[str, ast.FunctionDef]) -> list[ast.AST]:
    """``start`` and the module's functions it reaches: by a call, or as a fixture it asks for."""
    seen: dict[str, ast.FunctionDef] = {start.name: start}
    todo = [start]
    while todo:
        node = todo.pop()
        names = {arg.arg for arg in node.args.args}
        names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name in sorted(names & functions.keys() - seen.keys()):
            seen[name] = functions[name]
            todo.append(functions[name])
    return list(seen.values())


def _asked(node: ast.AST) -> tuple[str, list[str]] | None:
    """``("needed" | "given", [slot or slot.field, ...])`` of a call of either, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id not in ("needed", "given") or len(node.args) < 2:
        return None
    kind = node.args[1]
    if not isinstance(kind, ast.Name) or kind.id not in SLOTS:
        return None
    slot = SLOTS[kind.id]
    fields = [
        a.value for a in node.args[2:] if isinstance(a, ast.Constant) and isinstance(a.value, str)
    ]
    return node.func.id, [f"{slot}.{field}" for field in fields] or [slot]


def needs_table(checks: Sequence[CheckNeeds]) -> list[str]:
    """What each check needs, as a Markdown table (docs/own-graphs.md holds it;
    ``pytest-cudagraph checks`` prints it)."""
    lines = ["| check | CUDA | needs | sharper with |", "| --- | --- | --- | --- |"]
    for row in checks:
        needs = ", ".join(f"`{need}`" for need in row.needs) or "-"
        uses = ", ".join(f"`{use}`" for use in row.uses) or "-"
        lines.append(f"| {row.check} | {'yes' if row.cuda else 'no'} | {needs} | {uses} |")
    return lines
