"""Stateful code judged right: a decode step over a static KV cache in module buffers, each side
a copy of its own, passes every comparing check in any order; its broken twins
(broken_stateful_targets.py) fail the check meant for their fault, naming the call, the state
tensor and the element where the two sides parted.

On the CPU (in CI): the checks called as functions on each twin's stand-in (its graphs on a
stand-in of torch's graph class, whose replay runs the step), in the suite's order and in
shuffled orders, each after what the suite's target fixture does between checks. On a GPU:
the suite run on each twin (the docs' compiled example among them)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import replace

import broken_stateful_targets
import pytest
import torch
from cpu_checks import CPU, run
from graph_stand_ins import StandInGraph
from suite_runner import table_verdicts
from test_broken_zoo_targets import declared_names, skip_reason

from pytest_cudagraph.conformance import CudaGraphTarget, State, validate_target
from pytest_cudagraph.conformance._catalog import lacking_reason
from pytest_cudagraph.conformance._judging import (
    MOST_FOUND_EPISODE_CALLS,
    draw,
    in_step,
    numbered,
    state_model,
)
from pytest_cudagraph.conformance.checks import (
    test_00_target,
    test_01_parity,
    test_02_no_baked_inputs,
    test_03_owned_outputs,
    test_08_lock_safety,
    test_10_concurrency,
    test_15_side_isolation,
    test_20_stateful,
    test_21_module_state,
    test_24_capture_state,
)
from pytest_cudagraph.engines.faults import FaultInjector
from pytest_cudagraph.engines.graph_faults import GraphFaults
from pytest_cudagraph.engines.parity import ParityChecker, ParityResult
from pytest_cudagraph.skips import needs_cuda

TWINS = ("decode_step", "stale_position", "capture_advancing_cache", "accumulating_decode")


def stand_in(factory: str) -> CudaGraphTarget:
    return getattr(broken_stateful_targets, factory)(CPU, StandInGraph)


def parity(target: CudaGraphTarget) -> list[str]:
    results: list[ParityResult] = []
    figures = run(
        test_01_parity.test_parity,
        target,
        graph_parity=ParityChecker(CPU, on_result=results.append),
    )
    assert [result.ok for result in results] == [True], results[0].details()
    return figures


def lock_safety(target: CudaGraphTarget) -> list[str]:
    return run(
        test_08_lock_safety.test_lock_safety,
        target,
        fault_injector=FaultInjector(),
        torch_graph_faults=GraphFaults(StandInGraph),
    )


def check(function: Callable[..., None]) -> Callable[[CudaGraphTarget], list[str]]:
    return lambda target: run(function, target)


# Every comparing check that runs on these twins (the others skip for a capability they lack).
COMPARING: dict[str, Callable[[CudaGraphTarget], list[str]]] = {
    "parity": parity,
    "no baked inputs": check(test_02_no_baked_inputs.test_no_baked_inputs),
    "owned outputs": check(test_03_owned_outputs.test_owned_outputs),
    "lock safety": lock_safety,
    "concurrency": check(test_10_concurrency.test_concurrency),
    "side isolation": check(test_15_side_isolation.test_side_isolation),
    "module state": check(test_21_module_state.test_module_state),
    "capture does not advance state": check(
        test_24_capture_state.test_capture_does_not_advance_state
    ),
}
EPISODES = {
    "state isolation": check(test_20_stateful.test_state_isolation),
    "state reset": check(test_20_stateful.test_state_reset),
}


def as_the_suite_runs(target: CudaGraphTarget, checks: list[str]) -> dict[str, list[str]]:
    """Each check in turn, after what the suite's target fixture does before one (the cache
    reset, the two sides' states brought together): check -> its figures."""
    figures = {}
    for name in checks:
        assert target.cache is not None and target.cache.reset is not None
        target.cache.reset()
        in_step(target)
        figures[name] = {**COMPARING, **EPISODES}[name](target)
    return figures


# The acceptance case: a position-addressed KV cache, each side its own


@pytest.mark.parametrize(
    "order", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_a_decode_step_over_a_static_kv_cache_passes_every_comparing_check_in_any_order(
    order: int,
) -> None:
    checks = list(COMPARING)
    random.Random(order).shuffle(checks)
    figures = as_the_suite_runs(stand_in("decode_step"), checks)
    assert figures["parity"][-1] == (
        "64 cases over 1 keys, exact; state compared after each call; position-addressed or "
        "pure writes (a repeated call changed nothing)"
    )
    assert figures["capture does not advance state"] == [
        "case 0 (key (1, 1)): the capturing call left the state of one eager call; its first "
        "replay checked; position-addressed or pure writes (a repeated call changed nothing)"
    ]
    concurrency = figures["concurrency"][0]
    assert "; it keeps state: each answer depends on the calls before it)" in concurrency


def test_checks_that_call_one_side_more_leave_the_next_check_in_step_by_themselves() -> None:
    """Without the suite's fixture between them: owned outputs makes its later calls on both
    sides, concurrency replays the threads' calls eagerly in their order, so the checks after
    them compare two caches that took the same writes."""
    target = stand_in("decode_step")
    for name in ("owned outputs", "concurrency", "side isolation", "no baked inputs", "parity"):
        COMPARING[name](target)


def test_the_probe_tells_a_position_addressed_cache_from_an_accumulating_one() -> None:
    assert not state_model(stand_in("decode_step")).accumulating
    model = state_model(stand_in("accumulating_decode"))
    assert model.describe() == (
        "accumulating state (a repeated call changed the graphed side's state['position'] at "
        "index (0,))"
    )


ACCUMULATING = (
    "accumulating state (a repeated call changed the graphed side's state['position'] at index "
    "(0,)), judged in episodes of "
)


def test_an_accumulating_step_is_judged_by_episodes_and_passes() -> None:
    """Its episode found: the eager side called from a reset until a call raises, which none of
    the longest episode the suite looks for does (the position wraps)."""
    target = stand_in("accumulating_decode")
    figures = as_the_suite_runs(target, [*COMPARING, *EPISODES])
    found = (
        f"{ACCUMULATING}{MOST_FOUND_EPISODE_CALLS} calls from State.reset (no call of "
        f"{MOST_FOUND_EPISODE_CALLS} after State.reset() raised; give State(episode_calls=...) "
        "for longer episodes)"
    )
    for name in ("parity", "side isolation", "state isolation", "state reset"):
        assert figures[name][-1].endswith(f"; {found}"), figures[name]
    assert figures["capture does not advance state"][0].startswith(
        "case 0 (key (1, 1)): the capturing call left the state of one eager call"
    )


def test_an_accumulating_step_is_judged_by_the_episodes_it_declares() -> None:
    target = stand_in("accumulating_decode")
    assert target.state is not None
    declared = replace(target, state=replace(target.state, episode_calls=8))
    figures = as_the_suite_runs(declared, ["parity", *EPISODES])
    for name in ("parity", *EPISODES):
        assert figures[name][-1].endswith(
            f"; {ACCUMULATING}8 calls from State.reset (declared by State.episode_calls)"
        ), figures[name]


@pytest.mark.parametrize("declared", ["sides", "reset"])
def test_the_dry_run_repeats_a_call_from_the_state_it_started_in(declared: str) -> None:
    """The dry run calls eager twice on case 0, the second time after the other keys too: a
    step that advances its own position answers otherwise each time unless the state is put
    back first, copied back where State.sides says what holds it, else by a new episode."""
    target = broken_stateful_targets.accumulating_decode(CPU)  # eager alone on the CPU
    assert target.state is not None and target.state.reset is not None
    if declared == "reset":
        target = replace(target, state=State(reset=target.state.reset))
    # draw, key_of, eager, Cache.reset, State.reset and, where given, State.sides
    callables = 6 if declared == "sides" else 5
    assert run(test_00_target.test_dry_run, target) == [
        f"eager once on each of 1 key; {callables} of your callables ran"
    ]
    undeclared = replace(target, state=None)
    with pytest.raises(pytest.fail.Exception, match=r"is not reproducible under one seed"):
        run(test_00_target.test_dry_run, undeclared)


# The broken twins


def test_a_stale_position_fails_no_baked_inputs_and_parity_names_the_cache_element() -> None:
    target = stand_in("stale_position")
    with pytest.raises(pytest.fail.Exception, match=r"input_pos changed: output at index"):
        COMPARING["no baked inputs"](target)
    assert target.cache is not None and target.cache.reset is not None
    target.cache.reset()
    with pytest.raises(pytest.fail.Exception) as failure:
        run(test_01_parity.test_parity, target, graph_parity=ParityChecker(CPU))
    message = str(failure.value)
    assert (
        "the two sides' states parted after call 1 (key (1, 1); the first replay after its "
        in message
    )
    assert "capture): state['layers.0.kv_cache.k_cache'] at index (0, 0, " in message


def test_capture_advancing_the_cache_fails_naming_how_many_times_the_step_ran() -> None:
    target = stand_in("capture_advancing_cache")
    with pytest.raises(pytest.fail.Exception) as failure:
        COMPARING["capture does not advance state"](target)
    assert (
        "case 0 (key (1, 1)): the call that captured its graph left the state of 4 eager calls "
        "on its inputs: the step ran 4 times, 3 more than it was called (warm-ups or the "
        "capture ran it on the live state)"
    ) in str(failure.value)
    with pytest.raises(pytest.fail.Exception) as failure:
        COMPARING["module state"](target)
    found = re.search(
        r"case 0 \(key \(1, 1\)\), building its graph \(warm-ups, capture, replay\): "
        r"state\['position'\] at index \(0,\): eager (\d+), graphed (\d+)",
        str(failure.value),
    )
    assert found is not None and int(found[2]) - int(found[1]) == 3, str(failure.value)


def test_capture_does_not_advance_state_needs_a_capture_and_state_sides() -> None:
    target = stand_in("decode_step")
    target.graphed(
        {"x": torch.zeros(1, 1, dtype=torch.long), "input_pos": torch.zeros(1, dtype=torch.long)}
    )
    no_reset = replace(target, cache=None)  # its one key captured already
    with pytest.raises(
        pytest.skip.Exception,
        match=r"^no call of the session's target captured a graph \(code that captures at "
        r"start-up\?\) and no factory is given to build a fresh one",
    ):
        COMPARING["capture does not advance state"](no_reset)
    # A factory whose targets capture neither when built nor when called: nothing judged.
    with pytest.raises(pytest.fail.Exception) as failure:
        run(
            test_24_capture_state.test_capture_does_not_advance_state,
            no_reset,
            target_factory=lambda: no_reset,
        )
    assert str(failure.value) == (
        "not exercised: no graphed call on up to 4 keys captured a graph, nor did building a "
        "target (tried: the session's target, a fresh target from the factory, built and "
        "called): what a capture does to the state cannot be judged"
    )
    # A fresh target from the factory captures on its first call.
    fresh = run(
        test_24_capture_state.test_capture_does_not_advance_state,
        no_reset,
        target_factory=lambda: stand_in("decode_step"),
    )
    assert "the capturing call left the state of one eager call" in fresh[0]
    without_state = replace(target, state=None)
    assert skip_reason(
        test_24_capture_state.test_capture_does_not_advance_state, without_state
    ) == lacking_reason(["state.sides"])


@pytest.mark.parametrize(
    "factory",
    [pytest.param(TWINS[0], marks=pytest.mark.slow), *TWINS[1:]],  # the first compiles its step
)
def test_each_twin_keeps_the_protocol_on_the_cpu(factory: str) -> None:
    target = getattr(broken_stateful_targets, factory)(CPU)
    validate_target(factory, target, CPU)
    case = numbered(target, 0)
    inputs = draw(target, case, seed=0)
    assert target.key_of(inputs) == case.key
    target.eager(inputs)
    assert target.state is not None and target.state.sides is not None


WARMED_AT_START_UP = """
import torch

from pytest_cudagraph.conformance import State, hand_written


class Slots(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4))

    def forward(self, inputs):
        self.cache[int(inputs["at"])] = inputs["x"]
        return self.cache.sum().reshape(1)


def make_target(device):
    eager, graphed = Slots(), Slots()
    graphed.cache.fill_(1.0)  # warmed up at start-up on its live cache
    return hand_written(
        device=device,
        eager=eager,
        graphed=graphed,
        keys=[0],
        draw=lambda generator, case: {"x": torch.rand((), generator=generator), "at": 0},
        key_of=lambda inputs: 0,
        state=State(sides=lambda: (eager, graphed)),
    )
"""


@pytest.mark.slow
def test_the_suite_brings_the_sides_states_together_before_each_check(
    run_suite: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What one side did before a check (its start-up here, an earlier check's calls in a
    run) does not reach the check's comparison: the dry run compares the graphed side, which
    runs on the CPU, with eager from one state."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(warmed=WARMED_AT_START_UP)
    result = run_suite("--cudagraph-target", "warmed:make_target", "-k", "dry_run")
    assert table_verdicts(result) == {"dry run": "passed"}, result.stdout.str()


# GPU: the suite on each twin

# Checks that compare the sides after a key's graph was used: a stateful fault may show in any.
REPLAYING = {
    "parity",
    "no baked inputs",
    "owned outputs",
    "lock safety",
    "concurrency",
    "device binding",
    "side isolation",
    "module state",
    "capture does not advance state",
}
# factory -> (the check meant for its fault, every check that may fail with it); the right ones
# pass every check.
BROKEN = {
    "stale_position": ("no baked inputs", REPLAYING),
    "capture_advancing_cache": (
        "capture does not advance state",
        REPLAYING | {"state isolation", "state reset"},
    ),
}
RIGHT = ("decode_step", "accumulating_decode")


def test_the_gpu_verdicts_name_declared_checks() -> None:
    named = {*COMPARING, *EPISODES, *REPLAYING}
    for intended, may_fail in BROKEN.values():
        named |= {intended, *may_fail}
    assert named <= declared_names(), named - declared_names()


def failed(result: pytest.RunResult) -> set[str]:
    return {
        check for check, verdict in table_verdicts(result).items() if verdict in ("FAILED", "ERROR")
    }


@needs_cuda
@pytest.mark.parametrize("factory", RIGHT)
def test_a_right_stateful_target_passes_the_suite_on_a_gpu(
    run_suite: Callable[..., pytest.RunResult], factory: str
) -> None:
    result = run_suite("--cudagraph-target", f"broken_stateful_targets:{factory}")
    assert not failed(result), result.stdout.str()
    assert result.ret == pytest.ExitCode.OK


@needs_cuda
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_compiled_decode_step_passes_in_random_orders_of_checks(
    run_suite: Callable[..., pytest.RunResult], seed: int
) -> None:
    pytest.importorskip("pytest_randomly", reason="-p randomly needs pytest-randomly installed")
    spec = "broken_stateful_targets:decode_step"
    result = run_suite("--cudagraph-target", spec, "-p", "randomly", f"--randomly-seed={seed}")
    assert not failed(result), result.stdout.str()


@needs_cuda
@pytest.mark.parametrize("factory", list(BROKEN))
def test_a_broken_stateful_twin_fails_the_check_meant_for_its_fault(
    run_suite: Callable[..., pytest.RunResult], factory: str
) -> None:
    intended, may_fail = BROKEN[factory]
    result = run_suite("--cudagraph-target", f"broken_stateful_targets:{factory}")
    assert intended in failed(result), result.stdout.str()
    assert failed(result) <= may_fail, result.stdout.str()
