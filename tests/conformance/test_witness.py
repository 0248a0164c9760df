"""pytest_cudagraph.conformance.witness on the CPU, with stand-in graphs: a judgement rests on
captures made for it, had where they can be (the check's own calls, after the cache's reset, on
a key the check did not call, on a fresh target built inside the count), and a check that can
have none fails as not exercised; and whether a target still replays its graphs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from cpu_checks import KEYS, cpu_target, double
from graph_stand_ins import StandInGraph, StandInGraphs

from pytest_cudagraph.conformance import Cache, CudaGraphTarget, Fallbacks
from pytest_cudagraph.conformance.judging import calls_over_keys, draw
from pytest_cudagraph.conformance.witness import Judgement, runs_its_graphs, witnessed
from pytest_cudagraph.engines.captures import CaptureCounter


def rows(inputs: dict[str, torch.Tensor]) -> int:
    return inputs["x"].shape[0]


def calls(target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter) -> Judgement:
    """Two rounds over ``keys``; no problem found."""
    assert target.graphed is not None
    for _, case in calls_over_keys(target, keys, range(2)):
        target.graphed(draw(target, case, seed=case))
    return Judgement([], f"keys {list(keys)}")


def held_target(reset: bool = False) -> CudaGraphTarget:
    """A target on stand-in graphs, every key captured before the check; ``reset`` drops them."""
    graphs = StandInGraphs(double, rows)
    target = cpu_target(graphed=graphs, cache=Cache(reset=graphs.graphs.clear) if reset else None)
    for case in range(len(KEYS)):
        graphs(draw(target, case, seed=case))
    return target


def witness(target: CudaGraphTarget, keys: Sequence[int], **given: object) -> str:
    seen = witnessed(target, CaptureCounter(StandInGraph), calls, keys, **given)  # type: ignore[arg-type]
    return f"{seen.judgement.figure}: {seen.describe()}"


def test_captures_made_by_the_checks_own_calls_are_witnessed_there() -> None:
    target = cpu_target(graphed=StandInGraphs(double, rows))
    assert witness(target, range(3), fresh=None) == "keys [0, 1, 2]: 3 capture(s) in this check"


def test_without_one_the_cheapest_chance_that_captures_is_taken() -> None:
    assert witness(held_target(reset=True), range(3), fresh=None) == (
        "keys [0, 1, 2]: 3 capture(s) after cache.reset()"
    )
    target = held_target()
    graphs = target.graphed
    assert isinstance(graphs, StandInGraphs)
    graphs.graphs.pop(4)  # the last key, as if no earlier check had called it
    assert witness(target, range(2), fresh=None) == (
        "keys [2]: 1 capture(s) on key 4, which this check had not called"
    )
    assert witness(held_target(), range(3), fresh=lambda: held_target()) == (
        "keys [0, 1, 2]: 3 capture(s) on a fresh target from the factory"  # built in the count
    )


def test_with_no_capture_to_be_had_the_check_fails_naming_what_it_tried() -> None:
    def broken_factory() -> CudaGraphTarget:
        raise RuntimeError("no GPU left")

    with pytest.raises(pytest.fail.Exception) as failure:
        witness(held_target(), range(2), fresh=broken_factory)
    assert str(failure.value).startswith(
        "not exercised: every graph this check called was captured before it, and no capture "
        "could be had here (tried: on key 4, which this check had not called, on a fresh target "
        "from the factory (the factory raised RuntimeError: no GPU left));"
    )


def test_what_a_check_found_without_a_capture_stands() -> None:
    def finds(target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter) -> Judgement:
        return Judgement(["a caller's input changed"], "one call")

    seen = witnessed(held_target(), CaptureCounter(StandInGraph), finds, range(3), None)
    assert (seen.judgement.problems, seen.describe()) == (
        ["a caller's input changed"],
        "0 capture(s) in this check",
    )


def test_a_target_runs_its_graphs_until_it_drops_them_and_declared_calls_tell_nothing() -> None:
    graphs = StandInGraphs(double, rows)
    target = cpu_target(graphed=graphs)
    assert runs_its_graphs(target, StandInGraph) is True
    dropped = cpu_target(graphed=double)  # runs without a graph
    assert runs_its_graphs(dropped, StandInGraph) is False
    declared = cpu_target(graphed=double, fallbacks=Fallbacks(runs_eagerly=lambda inputs: True))
    assert runs_its_graphs(declared, StandInGraph) is None
