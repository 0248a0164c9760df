"""Verdicts a broken target could pass by judging nothing, or by judging what it does not do: each
check on a small target shaped like real code that breaks it, and on a correct twin. A cache
written ``graphs.setdefault(key, capture(...))`` captures on every call; a graphed side whose
graphs hold no tensor gives no rebound tensors nothing to judge; a ``State.reset`` that resets
nothing carries every episode into the next on both sides alike; every call declared eager
leaves graphs used nothing to judge; a ``real_part`` selecting nothing compares nothing; one
piece of a piecewise runner falls back to eager for good; a petals-style runner, whose graphs
were captured before the check, captures a throwaway graph in every call."""

from __future__ import annotations

import pytest
import torch
from cpu_checks import KEYS, RunningTotal, cpu_target, double, reported, rows, run
from graph_stand_ins import StandInGraph, StandInGraphs, captured
from torch import Tensor

from pytest_cudagraph.conformance import Cache, CudaGraphTarget, Fallbacks, State
from pytest_cudagraph.conformance.checks import (
    test_00_target,
    test_14_captures,
    test_16_inputs_unchanged,
    test_19_graphs_used,
    test_20_stateful,
    test_22_rebound_tensors,
)

Failed = pytest.fail.Exception
NOT_EXERCISED = r"^not exercised: "


# Captures: a cache that captures again on every call


class SetdefaultCache:
    """``self.graphs.setdefault(key, capture(...))``: the capture, an argument, runs on every
    call; the first graph is kept and replayed, every later one thrown away unreplayed."""

    def __init__(self) -> None:
        self.graphs: dict[int, StandInGraph] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        self.graphs.setdefault(rows(inputs), captured()).replay()
        return double(inputs)


class CheckedCache(SetdefaultCache):
    """The same cache, capturing only a key it does not hold."""

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = rows(inputs)
        if key not in self.graphs:
            self.graphs[key] = captured()
        self.graphs[key].replay()
        return double(inputs)


def test_captures_fails_a_setdefault_cache_that_captures_on_every_call() -> None:
    held = Cache(capacity=len(KEYS))
    with pytest.raises(Failed) as failure:
        run(test_14_captures.test_captures, cpu_target(graphed=SetdefaultCache(), cache=held))
    assert reported(failure) == [
        "keys the cache held were captured again (3 keys, capacity 3):",
        "2 in 5 of 5 rounds",
        "3 in 4 of 5 rounds",
        "4 in 4 of 5 rounds",
    ]
    (figure,) = run(test_14_captures.test_captures, cpu_target(graphed=CheckedCache(), cache=held))
    assert figure.startswith("4 rounds over 3 keys: 3 captures, 6.0 replays per capture;")


# No rebound tensors: nothing held to judge


class StaticRunner(CheckedCache):
    """Its graphs read a static input buffer it holds, copied into on each call."""

    def __init__(self) -> None:
        super().__init__()
        self.static_x = torch.zeros(max(KEYS), 4)

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        self.static_x[: rows(inputs)] = inputs["x"]
        return super().__call__({"x": self.static_x[: rows(inputs)]})


def test_no_rebound_tensors_skips_where_nothing_could_be_rebound_and_fails_without_a_capture() -> (
    None
):
    """A graphed side holding no tensor across calls, whose captures' reads no dispatcher saw:
    nothing could be rebound (a skip saying so); with no capture at all, nothing was judged."""
    check = test_22_rebound_tensors.test_no_rebound_tensors
    with pytest.raises(pytest.skip.Exception, match="nothing here a graph reads could be rebound"):
        run(check, cpu_target(graphed=CheckedCache()))
    with pytest.raises(Failed, match=NOT_EXERCISED + "no capture of a key"):
        run(check, cpu_target(graphed=double))
    (figure,) = run(check, cpu_target(graphed=StaticRunner()))
    assert figure.startswith(
        "9 calls over 3 keys: no read recorded at capture, so the graphed side walked: 6"
    )


# State isolation and reset: a reset that resets nothing


def totals(resets: bool) -> CudaGraphTarget:
    eager, graphed = RunningTotal(), RunningTotal()

    def reset() -> None:
        if resets:
            for side in (eager, graphed):
                side.total.zero_()

    return cpu_target(
        eager=eager,
        graphed=StandInGraphs(graphed, rows),
        state=State(reset=reset, episode_calls=4),
    )


@pytest.mark.parametrize(
    "check",
    [test_20_stateful.test_state_isolation, test_20_stateful.test_state_reset],
    ids=["state isolation", "state reset"],
)
def test_the_stateful_checks_fail_a_reset_that_resets_nothing(check: object) -> None:
    with pytest.raises(AssertionError) as refused:
        run(check, totals(resets=False))  # type: ignore[arg-type]
    assert str(refused.value).startswith(
        "State.reset() does not end the state: eager's first call of case 0 after a reset "
        "answers otherwise once more calls and another reset came before it: output at index"
    )
    (figure,) = run(check, totals(resets=True))  # type: ignore[arg-type]
    assert "judged in episodes of 4 calls from State.reset" in figure


# Graphs used: every call declared eager, and a piece that falls back for good


def test_graphs_used_fails_as_not_exercised_when_every_call_is_declared_eager() -> None:
    eager_always = Fallbacks(runs_eagerly=lambda inputs: True)
    with pytest.raises(Failed, match=NOT_EXERCISED + r"this check judged 0 calls not declared"):
        run(test_19_graphs_used.test_graphs_used, cpu_target(fallbacks=eager_always))
    above = Fallbacks(runs_eagerly=lambda inputs: rows(inputs) == max(KEYS))  # one key eager
    (figure,) = run(
        test_19_graphs_used.test_graphs_used,
        cpu_target(graphed=CheckedCache(), fallbacks=above),
    )
    assert figure.endswith("0 calls without their graphs; 2 eager, as the target declares")


class Piecewise:
    """A runner replaying two graphs per key (two layer segments, eager attention between);
    with ``falls_back``, the second piece's graph is dropped after its first ``warm`` calls
    (an error in its capture path) and that piece runs eagerly from then on, still right."""

    def __init__(self, falls_back: bool, warm: int = 2 * len(KEYS)) -> None:
        self.graphs: dict[int, tuple[StandInGraph, StandInGraph]] = {}
        self.falls_back, self.warm, self.calls = falls_back, warm, 0

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = rows(inputs)
        self.calls += 1
        if key not in self.graphs:
            self.graphs[key] = (captured(), captured())
        first, second = self.graphs[key]
        first.replay()
        if not (self.falls_back and self.calls > self.warm):
            second.replay()
        return double(inputs)


def test_graphs_used_fails_a_piecewise_runner_whose_second_piece_falls_back_for_good() -> None:
    check = test_19_graphs_used.test_graphs_used
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(graphed=Piecewise(falls_back=True)))
    lines = reported(failure)
    assert lines[0] == (
        "6 of 6 calls of cached keys ran without their graphs (none declared in runs_eagerly):"
    )
    assert lines[1] == (
        "call 6 (case 6, key 2) replayed 1 graph(s), where a call of its key replayed 2 in the "
        "warm-up rounds: the graphed path ran without them"
    )
    (figure,) = run(check, cpu_target(graphed=Piecewise(falls_back=False)))
    assert figure == (
        "6 calls over 3 keys after 2 warm-up rounds: 24 replays, 0 calls without their graphs"
    )


# The dry run: a real part that selects nothing


def test_the_dry_run_fails_a_real_part_selecting_nothing() -> None:
    """Rows past the real batch: every comparison of the real part would pass on nothing."""
    past_the_batch = cpu_target(real_part=lambda inputs: slice(rows(inputs), None))
    with pytest.raises(Failed) as failure:
        run(test_00_target.test_dry_run, past_the_batch)
    assert reported(failure)[:2] == [
        "the dry run failed on 3 of 3 keys:",
        "case 0: eager on case 0: key 2, repeat 0; inputs x float32[2, 4]: real_part selects no "
        "element of the output: every comparison would judge nothing",
    ]
    run(test_00_target.test_dry_run, cpu_target(real_part=lambda inputs: slice(0, rows(inputs))))


# Inputs unchanged: a petals-style runner with a throwaway graph per call


class PetalsRunner:
    """petals' shape: make_graphed_callables handed the caller's first tensors of a key, which
    become the graph's static inputs and take every later call's inputs; and a small graph of
    its own captured and replayed in every call. With ``own_buffers`` it copies the first
    inputs instead (the correct twin)."""

    def __init__(self, own_buffers: bool = False) -> None:
        self.own_buffers = own_buffers
        self.graphs: dict[int, tuple[StandInGraph, Tensor]] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        captured().replay()  # a throwaway graph, per call
        x = inputs["x"]
        if rows(inputs) not in self.graphs:
            static = x.clone() if self.own_buffers else x  # the caller's tensor, kept
            self.graphs[rows(inputs)] = (captured(), static)
        graph, static = self.graphs[rows(inputs)]
        static.copy_(x)
        graph.replay()
        return static * 2


def petals(own_buffers: bool = False) -> CudaGraphTarget:
    """A petals-style target whose real graphs were captured before the check (an earlier
    check called every key)."""
    runner = PetalsRunner(own_buffers)
    for key in KEYS:
        runner({"x": torch.zeros(key, 4)})
    return cpu_target(graphed=runner)


def test_inputs_unchanged_fails_a_petals_style_runner_despite_its_throwaway_graphs() -> None:
    """The throwaway graphs replay in every call and serve none after it: no witness. A fresh
    target captures its real graphs in the check, on the check's tensors, and shows them
    rewritten; without a factory the check cannot judge, and fails saying so."""
    check = test_16_inputs_unchanged.test_inputs_unchanged
    with pytest.raises(Failed) as failure:
        run(check, petals(), target_factory=fresh)
    lines = reported(failure)
    assert lines[0] == "graphed calls left the caller's inputs other than eager leaves them:"
    assert lines[1].startswith("input 'x' of call 0 (case 0, key 2) at index (0, 0): eager left ")
    with pytest.raises(Failed, match=NOT_EXERCISED + r"no capture of a key this check called"):
        run(check, petals())
    (figure,) = run(check, petals(own_buffers=True), target_factory=lambda: fresh(True))
    assert figure.endswith("3 capture(s) of its keys on a fresh target from the factory")


def fresh(own_buffers: bool = False) -> CudaGraphTarget:
    return cpu_target(graphed=PetalsRunner(own_buffers))
