"""Lock safety: a fault injected at each stage leaves the lock free (when the code has one) and
no half-built entry (when it lists its keys), and the next call is correct.

The stages are the target's own fault points (warm_up, capture, replay and any other it names)
or, for code without them, torch's own graph API (capture_begin, capture_end, replay:
pytest_cudagraph.engines.graph_faults), so that any code built on torch's graphs is checked.
Each fault is armed and the graphed path called over a few keys until it fires: a build stage at
the first capture (after ``reset()``; without one, at the first key not captured yet), any
other stage at its first call once a key was called. A stage of torch's API that no call
reaches is reported (code that captured every graph up front never captures again); one the
target named that no call reaches fails. A target that keeps state (``State``) is judged from
one state: before each faulted call and before the next call, the sides are brought together
from the eager side (a failed call may leave the graphed side's state half-written), and the
eager side makes the same calls."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

import pytest

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Lockstep,
    called,
    case_of,
    differences,
    draw,
    graphed_call,
    lock_was_held,
    stream_kept,
)
from pytest_cudagraph.conformance._protocol import Cache, Case, CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines import graph_faults
from pytest_cudagraph.engines.faults import FaultInjector
from pytest_cudagraph.engines.graph_faults import GraphFaults

BUILD_STAGES = ("warm_up", "capture", "capture_begin", "capture_end")
KEYS = 4
ROUNDS = 3  # compiled code records a key's graph on its second call and replays on the third
SEED = 0

# stage -> arm(exc): a context in which that stage raises ``exc`` once, giving "did it fire?"
Arm = Callable[[BaseException], AbstractContextManager[Callable[[], bool]]]


class InjectedFault(RuntimeError):
    pass


@pytest.fixture
def torch_graph_faults() -> GraphFaults:
    """Fault points at torch.cuda.CUDAGraph's methods."""
    return GraphFaults()


@check(
    "lock safety",
    sharper_with=(
        "cache.fault_points",
        "cache.reset",
        "cache.cached_keys",
        "cache.lock",
        "state.sides",
        "state.reset",
    ),
    breaks_target=True,
)
def test_lock_safety(
    target: CudaGraphTarget,
    cache: Cache | None,
    fault_injector: FaultInjector,
    torch_graph_faults: GraphFaults,
    conclude: Conclude,
) -> None:
    fault_points = cache.fault_points if cache is not None else None
    reset = cache.reset if cache is not None else None
    own = fault_points is not None
    stages = (
        declared_stages(fault_points, fault_injector)
        if fault_points is not None
        else torch_stages(torch_graph_faults)
    )
    lockstep = Lockstep(target)
    keys = list(target.keys[:KEYS])
    problems: list[str] = []
    unreached: list[str] = []
    fired_stages = 0
    for index, (stage, arm) in enumerate(stages.items()):
        if reset is not None:
            called("Cache.reset", reset)
        cases = [
            case_of(target, keys[(index + j) % len(keys)], r)
            for r in range(ROUNDS)
            for j in range(len(keys))
        ]
        if stage not in BUILD_STAGES:
            with stream_kept(target.device):
                graphed_call(target, draw(target, cases[0], seed=0), SEED)
        cached_before = cached(target)
        with arm(InjectedFault(f"fault at {stage}")) as fired:
            for case in cases:
                lockstep.sync()  # the eager answer of a call that recovers is taken from here
                returned, error = faulted_call(target, case)
                if fired() or error is not None:
                    break
        if not fired():
            if error is not None:
                problems.append(f"{stage}: a call raised before the fault: {error}")
            elif own:
                problems.append(
                    f"{stage}: never called in {len(cases)} calls, so no fault was injected"
                )
            else:
                unreached.append(stage)
            continue
        fired_stages += 1
        problems += [f"{stage}: {p}" for p in after_fault(lockstep, case, returned, cached_before)]
    problems += lockstep.problems()
    if not own and len(unreached) == len(stages):
        problems.append(
            f"no call reached torch's graph API ({', '.join(stages)}) in "
            f"{ROUNDS * len(keys)} calls: does the graphed path run CUDA graphs?"
        )
    named = "" if own else " (torch's graph API)"
    checked = ", ".join(
        what
        for what, given in (
            ("lock", cache.lock if cache is not None else None),
            ("entries", cache.cached_keys if cache is not None else None),
            ("next call", True),
        )
        if given is not None
    )
    missed = f"; not reached: {', '.join(unreached)}" if unreached else ""
    figure = f"faults at {', '.join(stages)}{named}: {checked} checked{missed}"
    conclude(Judgement(problems, figure, fired_stages, "faults fired"), "after a fault:")


def cached(target: CudaGraphTarget) -> set[object]:
    """The keys the target's cache holds now, where it lists them (``Cache.cached_keys``)."""
    cached_keys = target.cache.cached_keys if target.cache is not None else None
    return set(called("Cache.cached_keys", cached_keys)) if cached_keys is not None else set()


def faulted_call(target: CudaGraphTarget, case: Case) -> tuple[object | None, str | None]:
    """The graphed call of ``case`` (its output, None if it raised the fault) and any other
    error it raised."""
    try:
        with stream_kept(target.device):
            return graphed_call(target, draw(target, case, seed=1), SEED), None
    except InjectedFault:
        return None, None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def after_fault(
    lockstep: Lockstep, case: Case, returned: object | None, cached_before: set[object]
) -> list[str]:
    """What a fault left behind: a held lock, a key left cached, a wrong answer then or next
    (each against the eager side's answer from the state the graphed call started from)."""
    target = lockstep.target
    problems = []
    if lock_was_held(target):
        problems.append("the lock was still held after the fault (released to go on)")
    left = cached(target) - cached_before
    if left:
        problems.append(f"the failed call left keys {sorted(map(repr, left))} cached")
    inputs = draw(target, case, seed=1)
    if returned is not None:  # the code recovered by itself; it must still be right
        expected = lockstep.eager(inputs, SEED)
        problems += [
            f"recovered call: {d}" for d in differences(target, inputs, expected, returned)
        ]
    lockstep.sync()
    expected = lockstep.eager(inputs, SEED)
    try:
        with stream_kept(target.device):
            actual = lockstep.graphed(draw(target, case, seed=1), SEED, "the next call")
    except Exception as error:
        return [*problems, f"next call raised {type(error).__name__}: {error}"]
    problems += [f"next call: {d}" for d in differences(target, inputs, expected, actual)]
    return problems


def declared_stages(
    points: Mapping[str, tuple[object, str]], injector: FaultInjector
) -> dict[str, Arm]:
    """The target's own fault points: (object, method name) made to raise."""

    def arm_at(owner: object, method: str) -> Arm:
        @contextmanager
        def arm(exc: BaseException) -> Iterator[Callable[[], bool]]:
            fault = injector.fail(owner, method, exc=exc)
            try:
                yield lambda: fault.raised
            finally:
                injector.restore()

        return arm

    return {stage: arm_at(owner, method) for stage, (owner, method) in points.items()}


def torch_stages(faults: GraphFaults) -> dict[str, Arm]:
    """torch.cuda.CUDAGraph's capture_begin, capture_end and replay made to raise."""

    def arm_at(stage: str) -> Arm:
        @contextmanager
        def arm(exc: BaseException) -> Iterator[Callable[[], bool]]:
            with faults.inject(stage, exc) as fault:
                yield lambda: fault.fired

        return arm

    return {stage: arm_at(stage) for stage in graph_faults.STAGES}
