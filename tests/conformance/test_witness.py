"""pytest_cudagraph.conformance._witness on the CPU, with stand-in graphs: a judgement rests on a
capture of one of the keys it called that served a later call of that key, had where it can be
(the check's own calls, after the cache's reset, on a key the check did not call, on a fresh
target built inside the count); a graph captured and replayed within one call (a throwaway
graph a runner makes per call) is no witness, and a check that can have none fails as not
exercised; and how many graphs a call of the target replays."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence

import pytest
import torch
from cpu_checks import KEYS, cpu_target, double, rows
from graph_stand_ins import StandInGraph, StandInGraphs, captured

from pytest_cudagraph.conformance import Cache, CudaGraphTarget, Fallbacks
from pytest_cudagraph.conformance._judging import calls_over_keys, draw, graphed_path
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Witness, graphs_per_call, labelled
from pytest_cudagraph.engines.captures import CaptureCounter


def calls(target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter) -> Judgement:
    """Two rounds over ``keys``, each call labelled with its case; no problem found."""
    for _, case in calls_over_keys(target, keys, range(2)):
        with labelled(counter, case):
            graphed_path(target)(draw(target, case, seed=case.number))
    return Judgement([], f"keys {list(keys)}", 2 * len(keys), "calls")


def held_target(reset: bool = False) -> CudaGraphTarget:
    """A target on stand-in graphs, every key captured before the check; ``reset`` drops them."""
    graphs = StandInGraphs(double, rows)
    target = cpu_target(graphed=graphs, cache=Cache(reset=graphs.graphs.clear) if reset else None)
    for key in KEYS:
        graphs({"x": torch.zeros(key, 4)})
    return target


def witness(target: CudaGraphTarget, keys: Sequence[Hashable], **given: object) -> str:
    fresh = given.get("fresh")
    seen = Witness(target, CaptureCounter(StandInGraph), fresh)(calls, keys)  # type: ignore[arg-type]
    return f"{seen.judgement.figure}: {seen.describe()}"


def test_captures_made_by_the_checks_own_calls_are_witnessed_there() -> None:
    target = cpu_target(graphed=StandInGraphs(double, rows))
    assert witness(target, KEYS) == "keys [2, 3, 4]: 3 capture(s) of its keys in this check"


def test_without_one_the_cheapest_chance_that_captures_is_taken() -> None:
    assert witness(held_target(reset=True), KEYS) == (
        "keys [2, 3, 4]: 3 capture(s) of its keys after cache.reset()"
    )
    target = held_target()
    graphs = target.graphed
    assert isinstance(graphs, StandInGraphs)
    graphs.graphs.pop(4)  # the last key, as if no earlier check had called it
    assert witness(target, [2, 3]) == (
        "keys [4]: 1 capture(s) of its keys on key 4, which this check had not called"
    )
    assert witness(held_target(), KEYS, fresh=lambda: held_target()) == (
        "keys [2, 3, 4]: 3 capture(s) of its keys on a fresh target from the factory"
    )  # built in the count


def test_with_no_capture_to_be_had_the_check_fails_naming_what_it_tried() -> None:
    def broken_factory() -> CudaGraphTarget:
        raise RuntimeError("no GPU left")

    with pytest.raises(pytest.fail.Exception) as failure:
        witness(held_target(), [2, 3], fresh=broken_factory)
    assert str(failure.value).startswith(
        "not exercised: no capture of a key this check called served a later call of it (every "
        "graph it called was captured before it, or captured and never replayed again), and none "
        "could be had here (tried: on key 4, which this check had not called, on a fresh target "
        "from the factory (the factory raised RuntimeError: no GPU left));"
    )
    with pytest.raises(pytest.fail.Exception, match=r"a fresh target \(no factory given\)\)"):
        witness(held_target(), KEYS)


def test_what_a_check_found_without_a_capture_stands() -> None:
    def finds(
        target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter
    ) -> Judgement:
        return Judgement(["a caller's input changed"], "one call", 1, "calls")

    seen = Witness(held_target(), CaptureCounter(StandInGraph), None)(finds, KEYS)
    assert (seen.judgement.problems, seen.describe()) == (
        ["a caller's input changed"],
        "0 capture(s) of its keys in this check",
    )


class Throwaway:
    """A runner (petals' shape) whose real graph of a key is captured on that key's first call,
    which also captures and replays a small graph of its own in every call: a replay per call,
    and no capture that served a later call once its keys' graphs exist."""

    def __init__(self) -> None:
        self.graphs = StandInGraphs(double, rows)

    def __call__(self, inputs: dict[str, object]) -> object:
        captured().replay()
        return self.graphs(inputs)


def test_a_graph_captured_and_replayed_within_one_call_is_no_witness() -> None:
    runner = Throwaway()
    for key in KEYS:  # an earlier check called every key
        runner({"x": torch.zeros(key, 4)})
    counter = CaptureCounter(StandInGraph)
    with pytest.raises(pytest.fail.Exception, match=r"^not exercised: no capture of a key"):
        Witness(cpu_target(graphed=runner), counter, None)(calls, KEYS)
    assert len(counter.captures) == 2 * len(KEYS) and counter.replays == 2 * len(KEYS)
    assert counter.witnessed(KEYS) == []
    lazily = Witness(
        cpu_target(graphed=runner),
        CaptureCounter(StandInGraph),
        lambda: cpu_target(graphed=Throwaway()),
    )
    assert lazily(calls, KEYS).describe() == (
        "3 capture(s) of its keys on a fresh target from the factory"
    )


class AtStartUp:
    """nano-vllm's runner's shape: every key's graph captured when it is built, each call a
    replay."""

    def __init__(self) -> None:
        self.graphs = {key: captured() for key in KEYS}

    def __call__(self, inputs: dict[str, object]) -> object:
        self.graphs[rows(inputs)].replay()  # type: ignore[arg-type]
        return double(inputs)  # type: ignore[arg-type]


def test_what_a_fresh_targets_building_captured_and_a_call_replayed_is_a_witness() -> None:
    held = cpu_target(graphed=AtStartUp())
    with pytest.raises(pytest.fail.Exception, match=r"tried: a fresh target \(no factory given\)"):
        Witness(held, CaptureCounter(StandInGraph), None)(calls, KEYS)
    fresh = Witness(held, CaptureCounter(StandInGraph), lambda: cpu_target(graphed=AtStartUp()))
    assert fresh(calls, [3]).describe() == (
        "1 capture(s) of its keys on a fresh target from the factory"
    )  # key 3's graph: the only one of the three built that a call of the check replayed


def test_a_capture_made_outside_the_checks_calls_is_no_witness() -> None:
    """A call the check does not label (a probe of the state, on inputs of its own) captures
    key 2's graph, which the check's calls then replay: what that capture kept is not what
    the check's calls gave it."""

    def probed_first(
        target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter
    ) -> Judgement:
        graphed_path(target)({"x": torch.zeros(keys[0], 4)})  # type: ignore[arg-type]
        return calls(target, keys, counter)

    counter = CaptureCounter(StandInGraph)
    with pytest.raises(pytest.fail.Exception, match=r"^not exercised: no capture of a key"):
        Witness(cpu_target(graphed=StandInGraphs(double, rows)), counter, None)(probed_first, [2])
    assert [capture.replayed_in for capture in counter.captures] == [frozenset({0, 1})]


def test_how_many_graphs_a_call_replays_and_declared_calls_tell_nothing() -> None:
    assert graphs_per_call(cpu_target(graphed=StandInGraphs(double, rows)), StandInGraph) == 1
    assert graphs_per_call(cpu_target(graphed=double), StandInGraph) == 0  # no graph
    declared = cpu_target(graphed=double, fallbacks=Fallbacks(runs_eagerly=lambda inputs: True))
    assert graphs_per_call(declared, StandInGraph) is None

    def piecewise(inputs: dict[str, object]) -> object:
        first.replay()
        second.replay()
        return double(inputs)  # type: ignore[arg-type]

    first, second = captured(), captured()
    assert graphs_per_call(cpu_target(graphed=piecewise), StandInGraph) == 2


class Counting(torch.nn.Module):
    """State a call writes by position: ``seen[rows]`` is set to the rows' sum."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen[x.shape[0]] = x.sum()
        return x * 2


def warmed_up_target() -> CudaGraphTarget:
    """Stateful, with cudagraph trees' contract (emulated: a key warms up on its first call and
    is captured on its second) and no ``cache.reset``: a probe of its state would capture."""
    from pytest_cudagraph.conformance import State
    from pytest_cudagraph.conformance._adapters import TreesEmulation

    eager, graphed = Counting(), Counting()
    return cpu_target(
        eager=lambda inputs: eager(inputs["x"]),
        graphed=TreesEmulation(lambda inputs: graphed(inputs["x"])),
        state=State(sides=lambda: (eager, graphed)),
    )


def test_a_fresh_target_takes_the_session_targets_probe_so_its_calls_capture_in_the_count() -> None:
    """The check's calls (through ``Lockstep``, which probes the state) on a fresh target: a
    probe of the fresh target's own would make the capture outside the count, leaving the
    check not exercised on code whose graphs are captured on a later call (compiled)."""
    from pytest_cudagraph.conformance._judging import Lockstep
    from pytest_cudagraph.engines.emulation import CUDAGraph, emulated_graphs

    def in_lockstep(
        target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter
    ) -> Judgement:
        lockstep = Lockstep(target)
        problems = []
        for _, case in calls_over_keys(target, keys, range(3)):
            with labelled(counter, case):
                problems += lockstep.judge(functools.partial(draw, target, case, 0), 0, "a call")
        return Judgement([*problems, *lockstep.problems()], "judged", 3, "calls")

    with emulated_graphs():
        session = warmed_up_target()
        in_lockstep(session, KEYS, CaptureCounter(CUDAGraph))  # earlier checks' calls
        seen = Witness(session, CaptureCounter(CUDAGraph), warmed_up_target)(in_lockstep, KEYS)
    assert seen.judgement.problems == []
    assert seen.describe() == "3 capture(s) of its keys on a fresh target from the factory"
