"""How the checks judge code that keeps state: accumulating state in whole episodes of the length
found (calling eager from a reset until a call raises) or declared, a trajectory one episode from
a reset; side isolation from a reset where only ``State.reset`` is given; what a runner capturing
every key when it is built leaves in the state, judged on a fresh target (skipped, saying why,
without a factory); state no walk can finish refused naming where; and the user's state
callables named when they raise."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable

import pytest
import torch
from cpu_checks import KEYS, RunningTotal, cpu_target, reported, rows, run
from graph_stand_ins import StandInGraph, StandInGraphs, captured
from torch import Tensor, nn

from pytest_cudagraph.conformance import Cache, CudaGraphTarget, State, Trajectory, checks
from pytest_cudagraph.conformance._catalog import declaration_of
from pytest_cudagraph.conformance._judging import probe
from pytest_cudagraph.conformance._loading import UserCodeError
from pytest_cudagraph.conformance.checks import (
    test_01_parity,
    test_15_side_isolation,
    test_20_stateful,
    test_21_module_state,
    test_23_trajectory,
    test_24_capture_state,
)

Failed = pytest.fail.Exception
POSITIONS = 16


class Decoder(nn.Module):
    """A KV cache of 16 positions filled one a call, its position kept as a Python int: the
    17th call of an episode raises. ``window``: the graphed side's, attending over the first
    ``window`` positions only (a graph captured for a shorter bucket), so that it goes wrong
    from its ``window + 1``-th call."""

    def __init__(self, window: int = POSITIONS) -> None:
        super().__init__()
        self.register_buffer("kv", torch.zeros(POSITIONS, 4))
        self.position = 0
        self._window = window

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        self.kv[self.position] = inputs["x"].mean(0)  # IndexError once the cache is full
        self.position += 1
        return inputs["x"] + self.kv[: self._window].sum(0)

    def reset(self) -> None:
        self.kv.zero_()
        self.position = 0


def decoders(window: int, episode_calls: int | None) -> CudaGraphTarget:
    eager, graphed = Decoder(), Decoder(window)
    return cpu_target(
        eager=eager,
        graphed=StandInGraphs(graphed, rows),
        state=State(
            sides=lambda: (eager, graphed),
            reset=lambda: (eager.reset(), graphed.reset()),
            episode_calls=episode_calls,
        ),
    )


@pytest.mark.parametrize(
    ("episode_calls", "how"),
    [
        (None, "found: call 17 of case 0 after State.reset() raised"),
        (POSITIONS, "declared by State.episode_calls"),
    ],
    ids=["found", "declared"],
)
def test_a_step_wrong_from_its_ninth_call_fails_parity_in_episodes_of_sixteen(
    episode_calls: int | None, how: str
) -> None:
    with pytest.raises(Failed) as failure:
        run(test_01_parity.test_parity, decoders(window=8, episode_calls=episode_calls))
    assert reported(failure)[0].startswith(
        "cuda_graph_parity: case 8 of 66 (Case(number=24, key=2, repeat=8)) differs: output at "
    )
    (figure,) = run(test_01_parity.test_parity, decoders(POSITIONS, episode_calls))
    assert figure.endswith(f"judged in episodes of 16 calls from State.reset ({how})")


def test_a_trajectory_is_one_episode_from_a_reset_no_longer_than_an_episode() -> None:
    """A decode fed its own outputs: 16 steps fill the cache (a 17th would raise), even after
    an earlier check left it half full; the step going wrong at its ninth call is named."""

    def stepping(window: int) -> CudaGraphTarget:
        target = decoders(window, episode_calls=None)
        return dataclasses.replace(
            target, trajectory=Trajectory(lambda inputs, output: {"x": output.clone()})
        )

    target = stepping(POSITIONS)
    assert target.graphed is not None
    probe(target)  # made at an earlier check, which then left the episode half done:
    for _ in range(5):
        target.eager({"x": torch.zeros(2, 4)})
        target.graphed({"x": torch.zeros(2, 4)})
    (figure,) = run(test_23_trajectory.test_trajectory, target)
    assert figure.startswith(
        "16 of 16 steps (an episode of 16 calls) equal from case 0 (free running), over 1 key"
    )
    with pytest.raises(Failed) as failure:
        run(test_23_trajectory.test_trajectory, stepping(window=8))
    assert reported(failure)[0] == (
        "step 8 of a free running trajectory from case 0 (key 2, seed 8) differs after 8 equal "
        "steps:"
    )


def every_check() -> list[Callable[..., None]]:
    """Every check in the suite's order, with its declaration."""
    found = []
    for module in sorted(pkgutil.iter_modules(checks.__path__), key=lambda m: m.name):
        loaded = importlib.import_module(f"{checks.__name__}.{module.name}")
        found += [value for value in vars(loaded).values() if declaration_of(value) is not None]
    return found


def test_every_check_keeps_a_kv_decoder_inside_its_sixteen_call_episodes() -> None:
    """One right target through every check it gives what they need, in the suite's order:
    checks that call the graphed side alone, or each side in turn, reset it when an episode
    is full and run from a reset (a 17th call would raise in the user's code)."""
    eager, graphed = Decoder(), Decoder()
    graphs = StandInGraphs(graphed, rows)
    target = cpu_target(
        eager=eager,
        graphed=graphs,
        state=State(sides=lambda: (eager, graphed), reset=lambda: (eager.reset(), graphed.reset())),
        cache=Cache(reset=graphs.graphs.clear, capacity=len(KEYS)),
        trajectory=Trajectory(lambda inputs, output: {"x": output.clone()}),
    )
    ran = []
    for check in every_check():
        declaration = declaration_of(check)
        assert declaration is not None
        gpu_only = declaration.runs_on == "gpu" and declaration.name != "concurrency"
        # Replay order's megabytes of canaries cost seconds here; its calls are in lockstep.
        if gpu_only or declaration.lacking(target) or declaration.name == "replay order":
            continue
        run(check, target)
        ran.append(declaration.name)
    assert ran == [
        "target contract",
        "dry run",
        "parity",
        "no baked inputs",
        "owned outputs",
        "lock safety",
        "concurrency",
        "output storage",
        "captures",
        "side isolation",
        "inputs unchanged",
        "graphs used",
        "state isolation",
        "state reset",
        "module state",
        "no rebound tensors",
        "trajectory",
        "capture does not advance state",
    ]


# Side isolation with only a reset


def test_side_isolation_passes_a_correct_accumulating_target_giving_only_a_reset() -> None:
    """The eager call the second half is held to is taken from a reset, and the eager side
    reset again before the graphed call on other inputs: what it answers after is what a
    fresh episode answers."""
    eager, graphed = RunningTotal(), RunningTotal()

    def reset() -> None:
        eager.total.zero_()
        graphed.total.zero_()

    target = cpu_target(eager=eager, graphed=StandInGraphs(graphed, rows), state=State(reset=reset))
    (figure,) = run(test_15_side_isolation.test_side_isolation, target)
    assert figure.startswith("3 keys, each side right after the other on other inputs; state kept")
    shared = RunningTotal()  # one module both sides run on: the hazard side isolation is for
    together = cpu_target(
        eager=shared,
        graphed=StandInGraphs(lambda inputs: shared(inputs) * 1, rows),
        state=State(reset=shared.total.zero_),
    )
    with pytest.raises(Failed, match=r"key 2, graphed right after eager on other inputs"):
        run(test_15_side_isolation.test_side_isolation, together)


# Capture does not advance state: a runner that captures every key when it is built


class Positions(nn.Module):
    """A position counter (a buffer) and a cache written at it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position", torch.zeros((), dtype=torch.long))
        self.register_buffer("kv", torch.zeros(64, 4))

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        self.kv[self.position] = inputs["x"].mean(0)
        self.position += 1
        return inputs["x"] + self.kv.sum(0)


class StartUpRunner:
    """A serving runner: every key's graph captured when it is built; with ``warms_live`` its
    warm-up runs the step on the live state (advancing the position once per key), else on
    a scratch copy, as vLLM captures into a slot no request uses."""

    def __init__(self, model: Positions, warms_live: bool) -> None:
        self.model = model
        self.graphs: dict[int, StandInGraph] = {}
        for key in KEYS:
            warmed = model if warms_live else Positions()
            warmed({"x": torch.zeros(key, 4)})
            self.graphs[key] = captured()

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        self.graphs[rows(inputs)].replay()
        return self.model(inputs)


def started(warms_live: bool) -> CudaGraphTarget:
    eager, graphed = Positions(), Positions()
    runner = StartUpRunner(graphed, warms_live)
    return cpu_target(eager=eager, graphed=runner, state=State(sides=lambda: (eager, graphed)))


def test_capture_does_not_advance_state_judges_a_runner_built_with_its_graphs() -> None:
    check = test_24_capture_state.test_capture_does_not_advance_state
    assert run(check, started(False), target_factory=lambda: started(False)) == [
        "3 capture(s) while building a fresh target: its state left as a target's that made no "
        "call; first calls of 3 keys checked"
    ]
    with pytest.raises(Failed) as failure:
        run(check, started(True), target_factory=lambda: started(True))
    assert reported(failure)[:2] == [
        "the capture moved the state:",
        "after building (its captures), before any call: state['position'] at index (): eager "
        "0, graphed 3 (|diff| 3, rel inf; tolerance exact); 1 of 1 elements differ, largest "
        "|diff| 3",
    ]
    with pytest.raises(pytest.skip.Exception) as skipped:
        run(check, started(True))
    assert str(skipped.value) == (
        "no call of the session's target captured a graph (code that captures at start-up?) and "
        "no factory is given to build a fresh one, whose building the check would judge"
    )


# State no walk can finish, and the user's state callables


class Looping(nn.Module):
    def __init__(self, deep: bool) -> None:
        super().__init__()
        self.register_buffer("kv", torch.zeros(4))
        history: list[object] = [0]
        if deep:
            for _ in range(5000):
                history = [history]
        else:
            history.append(history)
        self.history = history

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        return inputs["x"] * 2


@pytest.mark.parametrize(
    ("deep", "message"),
    [
        (False, r"^history\[1\]: holds itself \(it is history again\)"),
        (True, r"^history(\[0\]){100}: nested deeper than 100 containers"),
    ],
    ids=["holds itself", "5,000 deep"],
)
def test_state_no_walk_can_finish_is_refused_naming_its_path_not_recursing(
    deep: bool, message: str
) -> None:
    eager, graphed = Looping(deep), Looping(deep)
    target = cpu_target(
        eager=eager,
        graphed=StandInGraphs(graphed, rows),
        state=State(sides=lambda: (eager, graphed)),
    )
    named = r"^State.sides\(\) gives state the suite cannot walk: " + message.removeprefix("^")
    for check in (test_01_parity.test_parity, test_21_module_state.test_module_state):
        with pytest.raises(AssertionError, match=named):
            run(check, target, prepared=False)


def boom() -> None:
    raise RuntimeError("lost the cache")


def accumulating(cache: Cache | None = None, **state: object) -> CudaGraphTarget:
    eager, graphed = RunningTotal(), RunningTotal()
    given: dict[str, object] = {"sides": lambda: (eager, graphed), **state}
    return cpu_target(
        eager=eager,
        graphed=StandInGraphs(graphed, rows),
        state=State(**given),  # type: ignore[arg-type]
        cache=cache,
    )


@pytest.mark.parametrize(
    ("target", "check", "field"),
    [
        (lambda: accumulating(reset=boom), test_20_stateful.test_state_isolation, "State.reset"),
        (lambda: accumulating(sides=boom), test_01_parity.test_parity, "State.sides"),
        (
            lambda: accumulating(cache=Cache(reset=boom)),
            test_15_side_isolation.test_side_isolation,
            "Cache.reset",
        ),
    ],
    ids=["State.reset", "State.sides", "Cache.reset"],
)
def test_a_state_or_cache_callable_that_raises_is_named_in_one_line(
    target: Callable[[], CudaGraphTarget], check: Callable[..., None], field: str
) -> None:
    """The suite turns it into a failure with the user's frames; called as a function, the
    check lets it through as a UserCodeError naming the field."""
    for prepared in (True, False):
        with pytest.raises(UserCodeError) as raised:
            run(check, target(), prepared=prepared)
        assert str(raised.value) == f"{field}() raised RuntimeError: lost the cache"
        assert isinstance(raised.value.__cause__, RuntimeError)
