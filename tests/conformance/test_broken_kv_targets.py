"""The stateful checks can fail, and reasyn-kv passes: each broken KV twin (broken_kv_targets.py)
fails the check meant for its hazard, and fails only checks that compare graphed episodes with
eager ones; reasyn-kv itself passes every check it does not skip for a stated reason.

Each run is the conformance suite in a fresh process on the GPU. The memory checks are left out
of the twins' runs: no twin changes what a graph holds, and they are the slowest checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from suite_runner import table_verdicts
from test_broken_zoo_targets import declared_names

from pytest_cudagraph.skips import needs_cuda

# Checks that compare a graphed episode with eager after the graph of its key was used before:
# a stateful hazard may show in any of them, depending on the episodes they draw.
REPLAYING = {
    "parity",
    "no baked inputs",
    "lock safety",
    "concurrency",
    "device binding",
    "state isolation",
    "state reset",
    "side isolation",
    "replay order",
}
# factory -> (the check meant for its hazard, every check that may fail with it).
BROKEN = {
    # Positions frozen at the capture's 0: even a key's first episode is wrong.
    "baked_position": ("no baked inputs", REPLAYING | {"owned outputs"}),
    # Right whenever a batch's rows share a position: batch-1 keys pass.
    "shared_position": ("parity", REPLAYING | {"owned outputs"}),
    # Right on a key's first episode; wrong on a later one that starts behind the last.
    "stale_position_counter": ("state isolation", REPLAYING),
    # Only reset_state() swaps the buffers, and only the state-reset check calls it.
    "reallocating_reset": ("state reset", {"state reset"}),
}


def test_the_expected_verdicts_name_declared_checks() -> None:
    named = {"owned outputs", *REPLAYING}
    for intended, may_fail in BROKEN.values():
        named |= {intended, *may_fail}
    assert named <= declared_names(), named - declared_names()


@needs_cuda
def test_reasyn_kv_passes_every_check_it_runs(run_suite: Callable[..., pytest.RunResult]) -> None:
    result = run_suite("--cudagraph-target", "reasyn-kv")
    verdicts = table_verdicts(result)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert set(verdicts.values()) <= {"passed", "skipped"}
    for check in ("parity", "no baked inputs", "owned outputs", "state isolation", "state reset"):
        assert verdicts[check] == "passed", result.stdout.str()
    for line in result.stdout.lines:
        assert "needs CUDA" not in line


@needs_cuda
@pytest.mark.parametrize("factory", list(BROKEN))
def test_a_broken_kv_target_fails_the_check_meant_for_its_hazard(
    run_suite: Callable[..., pytest.RunResult], factory: str
) -> None:
    intended, may_fail = BROKEN[factory]
    result = run_suite("--cudagraph-target", f"broken_kv_targets:{factory}", "-k", "not memory")
    verdicts = table_verdicts(result)
    failed = {check for check, verdict in verdicts.items() if verdict in ("FAILED", "ERROR")}
    assert intended in failed, result.stdout.str()
    assert failed <= may_fail, result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
