"""Capture does not advance state: the call that captures a key's graph changes the state as one
eager call does. Warm-ups run the step before a capture (``make_graphed_callables`` three
times, cudagraph trees once), harmless for position-addressed state but not for a step that
accumulates (a position it advances, running statistics): cudagraph trees run the body once
per call for this reason, and vLLM captures into a slot no request uses.

Needs ``state.sides``. Both sides from one state, the graphed side is called on up to 4 keys
(after ``cache.reset()`` where given) until a call captures; then eager on the same inputs, up
to 6 times: the graphed state must equal eager's after one call, and equal after k calls says
the step ran k times. Then the key's first replay, from one state, against eager. The figure
names the state model found. Where no call captures, a fresh target from the factory is
judged; where none captures there either, the check fails as not exercised."""

from __future__ import annotations

import functools
import itertools

import pytest

from pytest_cudagraph.conformance.catalog import given, needed
from pytest_cudagraph.conformance.judging import (
    Lockstep,
    case_in_key,
    differences,
    draw,
    eager_call,
    graphed_call,
    state_model,
    states_apart,
)
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget, State
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.witness import Factory, fresh_target
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
MOST_STEPS = 6  # eager calls the capturing call's state is looked for among
# Calls of a key a capture may take: cudagraph trees warm a key up on its first call, record it
# on the second.
CALLS_TO_CAPTURE = 3
SEED = 0


@needs_cuda
def test_capture_does_not_advance_state(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    record_figure: FigureRecorder,
) -> None:
    needed(target, State, "sides")
    reset_cache = given(target, Cache, "reset")
    if reset_cache is not None:
        reset_cache()  # a graph for the first call to capture
    found = judged(target, capture_counter)
    tried = ["after cache.reset()" if reset_cache is not None else "the session's target"]
    if found is None and target_factory is not None:
        with fresh_target(target_factory, []) as (made, _):
            found = judged(made, CaptureCounter(capture_counter.graph_class))
        tried.append("a fresh target from the factory")
    if found is None:
        pytest.fail(
            f"not exercised: no graphed call on up to {MAX_KEYS} keys captured a graph (tried: "
            f"{', '.join(tried)}): what a capture does to the state cannot be judged",
            pytrace=False,
        )
    problems, figure = found
    record_figure(figure)
    assert not problems, "\n".join(problems)


def judged(target: CudaGraphTarget, counter: CaptureCounter) -> tuple[list[str], str] | None:
    """The problems and the figure of the first call on up to ``MAX_KEYS`` keys that captures a
    graph, both sides from one state; None where no call captured."""
    sides = target.state.sides if target.state is not None else None
    lockstep = Lockstep(target, sides, None)  # in step by the state copied in, not by a reset
    assert lockstep.sides is not None
    key_count = min(MAX_KEYS, target.num_keys)
    with counter:
        for key_index, repeat in itertools.product(range(key_count), range(CALLS_TO_CAPTURE)):
            case = case_in_key(target, key_index, repeat)
            inputs = functools.partial(draw, target, case, case)
            lockstep.sync()
            captures = len(counter.captures)
            actual = graphed_call(target, inputs(), SEED)
            expected = eager_call(target, inputs(), SEED)  # the same call: sides in step
            if len(counter.captures) > captures:
                break
        else:
            return None
    key = target.key_of(inputs())
    where = f"case {case} (key {key!r})"
    problems = [
        f"{where}, the call that captured: {d}"
        for d in differences(target, inputs(), expected, actual)
    ]
    apart = states_apart(target, lockstep.sides)
    steps = 1
    while states_apart(target, lockstep.sides) and steps < MOST_STEPS:
        eager_call(target, inputs(), SEED)
        steps += 1
    if not apart:
        found = "the capturing call left the state of one eager call"
    elif not states_apart(target, lockstep.sides):
        found = f"the capturing call left the state of {steps} eager calls"
        problems.append(
            f"{where}: the call that captured its graph left the state of {steps} eager calls "
            f"on its inputs: the step ran {steps} times, {steps - 1} more than it was called "
            "(warm-ups or the capture ran it on the live state)"
        )
    else:
        found = f"the capturing call left a state no eager call of 1 to {MOST_STEPS} leaves"
        problems.append(
            f"{where}: after the call that captured its graph the state is no eager call's "
            f"(1 to {MOST_STEPS} calls on its inputs); after one: {apart[0].describe()}"
        )
    later = case + target.num_keys
    lockstep.sync()  # the eager side made more calls
    problems += lockstep.judge(
        functools.partial(draw, target, later, later), SEED, f"case {later}, its first replay"
    )
    problems += lockstep.problems()
    model = state_model(target).describe()  # after the capture: the probe may capture too
    return problems, f"{where}: {found}; its first replay checked; {model}"
