"""The numbers docs/conformance.md's table of checks states are the checks' own constants (read
from their modules with ``ast``): a check that changes one names the row to update."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "pytest_cudagraph" / "conformance" / "checks"
TABLE = ROOT / "docs" / "conformance.md"

# (row of the table, check module, constant, how the row says it)
CLAIMS = [
    ("dry run", "test_00_target", "MAX_KEYS", "up to {}"),
    ("target contract", "test_00_target", "MAX_KEYS", "up to {}"),
    ("parity", "test_01_parity", "CASES", "{} cases"),
    ("parity", "test_01_parity", "MAX_KEYS", "up to {} keys"),
    ("owned outputs", "test_03_owned_outputs", "LATER_CALLS", "over {} eager calls"),
    ("lock safety", "test_08_lock_safety", "KEYS", "up to {} keys"),
    ("lock safety", "test_08_lock_safety", "ROUNDS", "{} rounds"),
    ("bounded memory", "test_09_bounded_memory", "SHAPES", "{} calls"),
    ("bounded memory", "test_09_bounded_memory", "SLACK_MIB", "+ {} MiB"),
    ("bounded memory", "test_09_bounded_memory", "RESET_BOUND_MIB", "graph_memory_bound({})"),
    ("memory over a long run", "test_09_bounded_memory", "WARM_ROUNDS", "after {} warm-up rounds"),
    ("memory over a long run", "test_09_bounded_memory", "LONG_RUN_KEYS", "up to {} keys"),
    ("memory over a long run", "test_09_bounded_memory", "JUDGED_ROUNDS", "{} more rounds"),
    ("memory over a long run", "test_09_bounded_memory", "SLACK_MIB", "more than {} MiB"),
    ("concurrency", "test_10_concurrency", "THREADS", "{} threads"),
    ("concurrency", "test_10_concurrency", "CALLS_PER_THREAD", "x {} calls"),
    ("concurrency", "test_10_concurrency", "KEYS", "on {} keys"),
    ("concurrency", "test_10_concurrency", "TIMEOUT_S", "after {:g} s"),
    ("graphs not skipped", "test_12_graphs_not_skipped", "ROUNDS", "after {} rounds"),
    ("graphs not skipped", "test_12_graphs_not_skipped", "MAX_KEYS", "up to {} keys"),
    ("output storage", "test_13_output_storage", "ROUNDS", "over {} rounds"),
    ("output storage", "test_13_output_storage", "MAX_KEYS", "up to {} keys"),
    ("captures", "test_14_captures", "ROUNDS", "over {} rounds"),
    ("captures", "test_14_captures", "MAX_KEYS", "up to {} keys"),
    ("captures", "test_14_captures", "TIMED_CALLS", "{} timed calls"),
    ("side isolation", "test_15_side_isolation", "KEYS", "up to {} keys"),
    ("state isolation", "test_20_stateful", "KEYS", "on each of {} keys"),
]


def constants(module: str) -> dict[str, object]:
    tree = ast.parse((CHECKS / f"{module}.py").read_text())
    return {
        target.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.isupper()
    }


def rows() -> dict[str, str]:
    table = TABLE.read_text().split("## The checks", 1)[1]
    cells = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ")]
    return {cell[0].strip(): "|".join(cell[1:]) for cell in cells[2:]}


@pytest.mark.parametrize(
    ("row", "module", "name", "phrase"), CLAIMS, ids=[f"{c[0]}: {c[2]}" for c in CLAIMS]
)
def test_the_table_states_the_checks_constant(
    row: str, module: str, name: str, phrase: str
) -> None:
    expected = phrase.format(constants(module)[name])
    assert expected in rows()[row], f"docs/conformance.md, row {row!r}: say {expected!r}"
