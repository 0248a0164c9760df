"""The checks whose verdict rests on a capture, on the twins of broken_witness_targets.py.

On the CPU (in CI): each check called as a function on the twins, their graphs stand-in graphs
counted by the check's capture counter: a runner keeping the capturing call's inputs fails
inputs unchanged however its graphs were captured before, a runner recording clones no graph
reads passes no rebound tensors and a buffer rebound wherever it is kept fails it, a piecewise
runner passes captures, and a target that drops its graphs after a fault is seen to, reported
naming the check and rebuilt from the factory. On a GPU: the same verdicts through the suite,
and the fallback reported once."""

from __future__ import annotations

from collections.abc import Callable

import broken_witness_targets as twins
import pytest
import torch
from cpu_checks import CPU, run
from graph_stand_ins import StandInGraph
from suite_runner import table_verdicts
from test_broken_zoo_targets import declared_names, reported

from pytest_cudagraph.conformance import CudaGraphTarget, _suite, conftest
from pytest_cudagraph.conformance._judging import case_of, draw
from pytest_cudagraph.conformance._witness import graphs_per_call
from pytest_cudagraph.conformance.checks import (
    test_14_captures,
    test_16_inputs_unchanged,
    test_19_graphs_used,
    test_22_rebound_tensors,
)
from pytest_cudagraph.engines.graph_faults import GraphFaults
from pytest_cudagraph.examples.piecewise_runner import make_layers
from pytest_cudagraph.skips import needs_cuda

inputs_unchanged = test_16_inputs_unchanged.test_inputs_unchanged
rebound_tensors = test_22_rebound_tensors.test_no_rebound_tensors


def called_on_every_key(target: CudaGraphTarget) -> CudaGraphTarget:
    """``target`` after an earlier check's calls: every key captured already."""
    assert target.graphed is not None
    for key in target.keys:
        case = case_of(target, key)
        target.graphed(draw(target, case, seed=case.number))
    return target


# Inputs unchanged: the capturing call's inputs, however its graphs were captured


def test_a_runner_keeping_the_capturing_calls_inputs_fails_as_the_first_check() -> None:
    with pytest.raises(pytest.fail.Exception) as failure:
        run(inputs_unchanged, twins.caller_tensors_kept(CPU))
    lines = reported(failure)
    assert lines[0] == "graphed calls left the caller's inputs other than eager leaves them:"
    assert lines[1].startswith("input 'x' of call 0 (case 0, key (2, 32)) at index (0, 0): eager")
    assert lines[1].endswith("seen after call 2 (case 2, key (2, 32))")


def test_it_fails_when_an_earlier_check_captured_its_graphs() -> None:
    """No reset and every key held: the check gets a capture on a fresh target."""
    captured_before = called_on_every_key(twins.caller_tensors_kept(CPU))
    with pytest.raises(pytest.fail.Exception, match=r"input 'x' of call 0 .* seen after call 2"):
        run(
            inputs_unchanged,
            captured_before,
            target_factory=lambda: twins.caller_tensors_kept(CPU),
        )


def test_without_a_capture_to_be_had_it_is_not_exercised_and_does_not_pass() -> None:
    captured_before = called_on_every_key(twins.caller_tensors_kept(CPU))
    with pytest.raises(pytest.fail.Exception) as failure:
        run(inputs_unchanged, captured_before)
    assert str(failure.value) == (
        "not exercised: no capture of a key this check called served a later call of it (every "
        "graph it called was captured before it, or captured and never replayed again), and "
        "none could be had here (tried: a fresh target (no factory given)); a verdict on graphs "
        "captured elsewhere would say nothing of what a capture does"
    )


@pytest.mark.parametrize("factory", [twins.falls_back_for_good, twins.unread_recordings])
def test_runners_with_static_buffers_of_their_own_pass_inputs_unchanged(
    factory: Callable[[torch.device], CudaGraphTarget],
) -> None:
    (figure,) = run(inputs_unchanged, factory(CPU), target_factory=lambda: factory(CPU))
    assert figure.startswith("6 calls over 2 keys: 6 input tensors held to eager's effect after")


# No rebound tensors: only what a graph may read


def test_clones_no_graph_reads_may_be_replaced_at_will() -> None:
    """nano-vllm's runner captured its graphs at start-up: the check builds a fresh one."""
    captured_at_start = twins.unread_recordings(CPU)
    (figure,) = run(
        rebound_tensors, captured_at_start, target_factory=lambda: twins.unread_recordings(CPU)
    )
    assert figure == (
        "6 calls over 2 keys: no read recorded at capture, so the graphed side walked: 30 tensors judged "
        "over the calls; 2 capture(s) of its keys on a fresh target from the factory"
    )


@pytest.mark.parametrize("route", list(twins.ROUTES))
def test_a_static_buffer_rebound_fails_wherever_the_cache_keeps_it(route: str) -> None:
    (figure,) = run(rebound_tensors, twins.rebinding_through(route, CPU, rebind=False))
    assert figure.startswith(
        "6 calls over 2 keys: no read recorded at capture, so the graphed side walked: 32"
    )
    with pytest.raises(pytest.fail.Exception) as failure:
        run(rebound_tensors, twins.rebinding_through(route, CPU))
    lines = reported(failure)
    assert len(lines) == 1 + 2  # each key's buffer, replaced on its first replay
    assert "buffers[torch.Size([2, 32])] was rebound: its storage moved" in lines[1]


# Captures: one key's graphs captured in one round are one capture


def test_a_piecewise_runner_captures_each_key_once_with_a_graph_per_layer() -> None:
    (figure,) = run(test_14_captures.test_captures, twins.piecewise(CPU))
    assert figure.startswith("4 rounds over 2 keys: 6 captures, 7.0 replays per capture;")
    assert figure.endswith("; 6 capture(s) of its keys in this check")


# A permanent fallback


def test_a_target_that_drops_its_graphs_after_a_fault_is_seen_to() -> None:
    target = twins.falls_back_for_good(CPU)
    assert graphs_per_call(target, StandInGraph) == 1
    run(test_19_graphs_used.test_graphs_used, target)
    with (
        GraphFaults(StandInGraph).inject("replay", RuntimeError("a fault")),
        pytest.raises(RuntimeError, match="a fault"),
    ):
        run(test_19_graphs_used.test_graphs_used, target)
    assert graphs_per_call(target, StandInGraph) == 0
    with pytest.raises(
        pytest.fail.Exception, match=r"4 of 4 calls of cached keys ran without their graphs"
    ):
        run(test_19_graphs_used.test_graphs_used, target)


def test_a_piecewise_runner_replays_a_graph_per_layer_in_each_call() -> None:
    """How many graphs a call replays is what the suite watches after a check that may break
    the target: one piece falling back for good shows as fewer."""
    assert graphs_per_call(twins.piecewise(CPU), StandInGraph) == len(make_layers(CPU))


# GPU: the same verdicts through the suite


def failed(result: pytest.RunResult) -> set[str]:
    return {check for check, v in table_verdicts(result).items() if v in ("FAILED", "ERROR")}


@needs_cuda
@pytest.mark.parametrize("before", ["", "parity or output_storage or "])
def test_inputs_unchanged_fails_the_kept_inputs_whatever_ran_before(
    run_suite: Callable[..., pytest.RunResult], before: str
) -> None:
    spec = "broken_witness_targets:caller_tensors_kept"
    result = run_suite("--cudagraph-target", spec, "-k", f"{before}inputs_unchanged")
    assert "inputs unchanged" in failed(result), result.stdout.str()


# (spec, the check it passes, -k selecting that check's function)
CORRECT_TWINS = [
    ("broken_witness_targets:unread_recordings", "no rebound tensors", "rebound_tensors"),
    ("broken_witness_targets:piecewise", "captures", "captures"),
    ("pytest_cudagraph.examples.piecewise_runner_target:make_target", "captures", "captures"),
]
# The checks whose verdicts the GPU tests read, by their rows' names.
NAMED = {"inputs unchanged", "lock safety", *(check for _, check, _ in CORRECT_TWINS)}


def test_the_gpu_verdicts_name_declared_checks() -> None:
    assert NAMED <= declared_names(), NAMED - declared_names()


@needs_cuda
@pytest.mark.parametrize(("spec", "check", "k"), CORRECT_TWINS)
def test_the_correct_twins_pass_their_check(
    run_suite: Callable[..., pytest.RunResult], spec: str, check: str, k: str
) -> None:
    result = run_suite("--cudagraph-target", spec, "-k", f"parity or {k}")
    assert table_verdicts(result)[check] == "passed", result.stdout.str()


@needs_cuda
def test_a_permanent_fallback_is_reported_once_and_judges_no_later_check(
    run_suite: Callable[..., pytest.RunResult],
) -> None:
    spec = "broken_witness_targets:falls_back_for_good"
    result = run_suite("--cudagraph-target", spec, "-k", "not worker_processes")
    assert failed(result) == {"lock safety"}, result.stdout.str()  # every later check passed
    result.stdout.fnmatch_lines(
        ["  lock safety *ERROR*after lock safety, the target runs without its graphs for good*"]
    )


def test_a_permanent_fallback_is_reported_naming_the_check_and_the_target_rebuilt(
    pytester: pytest.Pytester,
) -> None:
    """What the suite's ``target`` fixture does after a check that broke the target."""
    spec = "broken_witness_targets:falls_back_for_good"
    config = pytester.parseconfigure("--cudagraph-target", spec)
    broken = twins.falls_back_for_good(CPU)
    with pytest.raises(pytest.fail.Exception) as failure:
        conftest.fail_permanent_fallback(config, "lock safety", broken)
    assert str(failure.value) == (
        "after lock safety, the target runs without its graphs for good: its calls replay "
        "fewer graphs than they did before this check (a fall back to eager, as code that "
        "drops its graphs after an error makes); the checks after this one run on a target "
        "rebuilt from the factory"
    )
    rebuilt = config.stash[_suite.REBUILT]
    assert rebuilt is not broken and graphs_per_call(rebuilt, StandInGraph) == 1


def test_a_target_that_cannot_be_rebuilt_is_reported_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        unbuildable="def make_target(device):\n    raise RuntimeError('no GPU left')\n"
    )
    pytester.syspathinsert()
    config = pytester.parseconfigure("--cudagraph-target", "unbuildable:make_target")
    with pytest.raises(pytest.fail.Exception) as failure:
        conftest.fail_permanent_fallback(config, "bounded memory", twins.falls_back_for_good(CPU))
    assert str(failure.value).endswith(
        "it could not be rebuilt (conformance target 'unbuildable:make_target': the factory "
        "raised RuntimeError: no GPU left), so the checks after this one judge it so"
    )
    assert _suite.REBUILT not in config.stash
