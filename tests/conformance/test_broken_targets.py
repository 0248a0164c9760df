"""The suite can fail: each deliberately broken target (broken_targets.py) fails exactly the checks
its fault must fail, the one meant for it among them, and passes every other check.

Each run is the whole suite in a fresh process on the GPU, except the worker-processes check:
it spawns workers that load the plain reference from a checkpoint, so no broken cache can reach
it, and it is the slowest check (two spawned processes, each loading the model)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from suite_runner import table_verdicts
from test_broken_zoo_targets import declared_names

from pytest_cudagraph.skips import needs_cuda

# factory -> (the check meant for the fault, every check that must fail).
BROKEN = {
    # Parity, device binding, lock safety (its next call on a cached key), concurrency, padded
    # batches (two sizes share the bucket of 4), replay order and capture does not advance
    # state (its first replay is of another case) also change the memory on a cached key; the
    # other checks give each key one memory only.
    "baked_memory": (
        "no baked inputs",
        {
            "no baked inputs",
            "parity",
            "device binding",
            "lock safety",
            "concurrency",
            "padded batches",
            "replay order",
            "capture does not advance state",
        },
    ),
    # Parity and output storage find later calls' outputs in the same storage as earlier ones;
    # concurrency compares the outputs once every thread is done, when replays of the same key
    # have overwritten them. Every other check compares an output before the next call.
    "static_output": (
        "owned outputs",
        {"owned outputs", "parity", "output storage", "concurrency"},
    ),
    "lock_kept_on_error": ("lock safety", {"lock safety"}),
    # Cycling more keys than its capacity recaptures nothing: the long run sees it too.
    "unbounded": ("bounded memory", {"bounded memory", "memory over a long run"}),
    # Only where the current device is not the target's does the side stream land elsewhere.
    "wrong_device": ("device binding", {"device binding"}),
}
TWO_GPUS = {"wrong_device"}


def test_the_expected_verdicts_name_declared_checks() -> None:
    named = set().union(*(must_fail for _, must_fail in BROKEN.values()))
    assert named <= declared_names(), named - declared_names()


@needs_cuda
@pytest.mark.parametrize("factory", list(BROKEN))
def test_a_broken_target_fails_the_checks_meant_for_its_fault(
    run_suite: Callable[..., pytest.RunResult], factory: str
) -> None:
    if factory in TWO_GPUS and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 visible GPUs: only the device-binding check can catch {factory}")
    intended, must_fail = BROKEN[factory]
    assert intended in must_fail
    if torch.cuda.device_count() < 2:
        must_fail = must_fail - {"device binding"}  # it skips there
    result = run_suite(
        "--cudagraph-target", f"broken_targets:{factory}", "-k", "not worker_processes"
    )
    verdicts = table_verdicts(result)
    if verdicts.get(intended) == "skipped":  # e.g. NVML cannot see processes here
        row = next(line for line in result.stdout.lines if line.startswith(f"  {intended} "))
        pytest.skip(f"the check meant for {factory} skipped: {row.strip()}")
    failed = {check for check, verdict in verdicts.items() if verdict in ("FAILED", "ERROR")}
    assert failed == must_fail, result.stdout.str()
    assert set(verdicts.values()) <= {"passed", "skipped", "FAILED", "ERROR"}
    # A skip may only be for want of a second GPU or of NVML, never of CUDA itself.
    for line in result.stdout.lines:
        assert "needs CUDA" not in line
    assert result.ret == pytest.ExitCode.TESTS_FAILED
