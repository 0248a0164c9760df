"""The checks of what a target declares can fail: each target of broken_contract_targets.py
fails the check meant for its fault and only that one. The CPU twins on the CPU (in CI: the dry
run, the contract and the guards run there), the GPU twins on a GPU; each run is the suite in a
fresh process."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from suite_runner import table_verdicts
from test_broken_zoo_targets import declared_names

from pytest_cudagraph.skips import needs_cuda

# Each test runs the suite on a broken target (the README's test command leaves it out).
pytestmark = pytest.mark.slow

# factory -> the one check that fails it.
ON_THE_CPU = {
    "eager_raises": "dry run",
    "unseeded_eager": "dry run",
    "tolerance_of_a_missing_part": "dry run",
    "assert_guard_undeclared": "guards",
    "rows_from_the_generator": "target contract",
}
ON_A_GPU = {
    "runner_busy_after_a_fault": "lock safety",
    "runner_keeps_a_workspace_per_call": "memory over a long run",
    # The graphed side computes from what the last eager call left: concurrency, whose eager
    # answers all come before the threads run, sees it too.
    "unwritten_shared_state": "side isolation",
}
ALSO_FAILS = {"unwritten_shared_state": {"concurrency"}}
# The decode example's dry run compiles it on the CPU; the examples' own test runs that already.
LEFT_OUT = {"assert_guard_undeclared": ["-k", "not dry_run"]}


def test_the_expected_verdicts_name_declared_checks() -> None:
    named = {*ON_THE_CPU.values(), *ON_A_GPU.values()} | set().union(*ALSO_FAILS.values())
    assert named <= declared_names(), named - declared_names()


def failed(result: pytest.RunResult) -> set[str]:
    return {
        check for check, verdict in table_verdicts(result).items() if verdict in ("FAILED", "ERROR")
    }


@pytest.mark.parametrize("factory", list(ON_THE_CPU))
def test_a_cpu_twin_fails_the_check_meant_for_it_without_cuda(
    run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch, factory: str
) -> None:
    """Graphs not emulated: the checks that judge without graphs catch it alone (emulated, a bug
    in eager fails every check that calls it)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    spec = f"broken_contract_targets:{factory}"
    off = "--cudagraph-emulate=off"
    result = run_suite("--cudagraph-target", spec, off, *LEFT_OUT.get(factory, []))
    assert failed(result) == {ON_THE_CPU[factory]}, result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@needs_cuda
@pytest.mark.parametrize("factory", list(ON_A_GPU))
def test_a_gpu_twin_fails_the_check_meant_for_it(
    run_suite: Callable[..., pytest.RunResult], factory: str
) -> None:
    result = run_suite("--cudagraph-target", f"broken_contract_targets:{factory}")
    assert failed(result) == {ON_A_GPU[factory], *ALSO_FAILS.get(factory, ())}, result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
