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
judged: code that captures every key when it is built (as serving engines do at start-up) must
leave the state as a target that made no call has it, and its first calls equal eager's. Where
no capture can be had, the check fails as not exercised; without a factory it skips, saying
why."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator

import pytest

from pytest_cudagraph.conformance._catalog import check, declared
from pytest_cudagraph.conformance._judging import (
    Episodes,
    Lockstep,
    called,
    case_of,
    differences,
    draw,
    eager_call,
    graphed_call,
    sides_of,
    state_model,
    states_apart,
)
from pytest_cudagraph.conformance._protocol import CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import CALLS_TO_CAPTURE, Factory, fresh_target
from pytest_cudagraph.engines.captures import CaptureCounter

MAX_KEYS = 4
MOST_STEPS = 6  # eager calls the capturing call's state is looked for among
SEED = 0


@check(
    "capture does not advance state",
    needs=("state.sides",),
    sharper_with=("cache.reset",),
    witnessed=True,
)
def test_capture_does_not_advance_state(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    conclude: Conclude,
) -> None:
    if target.cache is not None and target.cache.reset is not None:
        called("Cache.reset", target.cache.reset)  # a graph for the first call to capture
    found = judged(target, capture_counter)
    tried = ["the session's target"]
    if found is None and target_factory is None:
        pytest.skip(
            "no call of the session's target captured a graph (code that captures at start-up?) "
            "and no factory is given to build a fresh one, whose building the check would judge"
        )
    if found is None and target_factory is not None:
        building = CaptureCounter(capture_counter.graph_class)
        with fresh_target_counted(target_factory, building, target) as made:
            found = built_with_captures(made, building)
            if found is None:  # building captured nothing: its calls may
                found = judged(made, CaptureCounter(capture_counter.graph_class))
        tried.append("a fresh target from the factory, built and called")
    if found is None:
        pytest.fail(
            f"not exercised: no graphed call on up to {MAX_KEYS} keys captured a graph, nor did "
            f"building a target (tried: {', '.join(tried)}): what a capture does to the state "
            "cannot be judged",
            pytrace=False,
        )
    conclude(found, "the capture moved the state:")


def judged(target: CudaGraphTarget, counter: CaptureCounter) -> Judgement | None:
    """The judgement of the first call on up to ``MAX_KEYS`` keys that captures a graph, both
    sides from one state; None where no call captured."""
    lockstep = Lockstep(target, episodes=False)  # in step by the state copied in
    Episodes(target).begin()  # where the state accumulates, an episode from its start
    with counter:
        for key, repeat in itertools.product(target.keys[:MAX_KEYS], range(CALLS_TO_CAPTURE)):
            case = case_of(target, key, repeat)
            inputs = functools.partial(draw, target, case, case.number)
            lockstep.sync()
            captures = len(counter.captures)
            actual = graphed_call(target, inputs(), SEED)
            expected = eager_call(target, inputs(), SEED)  # the same call: sides in step
            if len(counter.captures) > captures:
                break
        else:
            return None
    where = f"case {case.number} (key {key!r})"
    problems = [
        f"{where}, the call that captured: {d}"
        for d in differences(target, inputs(), expected, actual)
    ]
    found, more = steps_found(lockstep, where, inputs)
    problems += more
    later = case_of(target, key, repeat + 1)
    lockstep.sync()  # the eager side made more calls
    problems += lockstep.judge(
        functools.partial(draw, target, later, later.number), SEED, f"{where}, its first replay"
    )
    problems += lockstep.problems()
    model = state_model(target).describe()  # after the capture: the probe may capture too
    figure = f"{where}: {found}; its first replay checked; {model}"
    return Judgement(problems, figure, 2, "calls judged (the capturing one, its first replay)")


def steps_found(
    lockstep: Lockstep, where: str, inputs: Callable[[], Inputs]
) -> tuple[str, list[str]]:
    """How many eager calls the capturing call's state stands for (eager called again on its
    inputs until the states meet, up to ``MOST_STEPS``), and the problem it makes."""
    target, sides = lockstep.target, declared(lockstep.sides)
    apart = states_apart(target, sides)
    steps = 1
    while states_apart(target, sides) and steps < MOST_STEPS:
        eager_call(target, inputs(), SEED)
        steps += 1
    if not apart:
        return "the capturing call left the state of one eager call", []
    if not states_apart(target, sides):
        return f"the capturing call left the state of {steps} eager calls", [
            f"{where}: the call that captured its graph left the state of {steps} eager calls "
            f"on its inputs: the step ran {steps} times, {steps - 1} more than it was called "
            "(warm-ups or the capture ran it on the live state)"
        ]
    return f"the capturing call left a state no eager call of 1 to {MOST_STEPS} leaves", [
        f"{where}: after the call that captured its graph the state is no eager call's "
        f"(1 to {MOST_STEPS} calls on its inputs); after one: {apart[0].describe()}"
    ]


@contextlib.contextmanager
def fresh_target_counted(
    factory: Factory, counter: CaptureCounter, like: CudaGraphTarget
) -> Iterator[CudaGraphTarget]:
    """A fresh target from ``factory`` (``like`` the session's), its building counted by
    ``counter`` (the counter closed before the target is called)."""
    with contextlib.ExitStack() as stack:
        with counter:
            made, _ = stack.enter_context(fresh_target(factory, [], like))
        yield made


def built_with_captures(target: CudaGraphTarget, counter: CaptureCounter) -> Judgement | None:
    """A target whose building captured graphs (start-up capture), judged: its state right after
    building is a target's that made no call (the sides compared: the eager side made none),
    and its first call of each captured key equals eager's; None where building captured
    nothing."""
    if not counter.captures:
        return None
    sides = declared(sides_of(target))  # before any call: the probe calls both sides
    problems = [
        f"after building (its captures), before any call: {m.describe()}"
        for m in states_apart(target, sides)
    ]
    lockstep = Lockstep(target, episodes=False)
    keys = target.keys[:MAX_KEYS]
    for key in keys:
        case = case_of(target, key)
        make = functools.partial(draw, target, case, case.number)
        problems += lockstep.judge(make, SEED, f"key {key!r}, its first call after building")
    problems += lockstep.problems()
    figure = (
        f"{len(counter.captures)} capture(s) while building a fresh target: its state left as "
        f"a target's that made no call; first calls of {len(keys)} keys checked"
    )
    return Judgement(problems, figure, len(keys) + 1, "calls and states judged")
