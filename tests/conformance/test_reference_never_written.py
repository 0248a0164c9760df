"""The eager side is the reference: the checks compare the graphed side with it and never write
it. A graphed side built with other weights, or left in train(), fails every check that compares
the two sides, naming the kind of state that differs, and the user's eager model leaves the
checks as it entered them. The state compared and brought together is all the code keeps in
Python too (counters, lists of lengths, namespaces, numpy arrays), and ``State.sides`` must give
the objects that hold it, not copies or empty containers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cpu_checks import KEYS, cpu_target, reported, rows, run
from graph_stand_ins import StandInGraphs, captured
from torch import Tensor, nn

from pytest_cudagraph.conformance import Case, CudaGraphTarget, State
from pytest_cudagraph.conformance.checks import (
    test_00_target,
    test_01_parity,
    test_02_no_baked_inputs,
    test_03_owned_outputs,
    test_08_lock_safety,
    test_10_concurrency,
    test_15_side_isolation,
    test_18_replay_order,
    test_20_stateful,
    test_21_module_state,
    test_24_capture_state,
)

Failed = pytest.fail.Exception
WIDTH = 4
POSITIONS = 8


class Decoder(nn.Module):
    """A decode step writing its KV cache at the position it is given, then reading every
    position: weights, a dropout that train() turns on, a buffer each call writes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(0.5)
        self.register_buffer("kv", torch.zeros(POSITIONS, WIDTH))

    def forward(self, inputs: dict[str, object]) -> Tensor:
        x = inputs["x"]
        assert isinstance(x, Tensor)
        self.kv[int(inputs["at"])] = self.proj(x).mean(0)  # type: ignore[call-overload]
        return self.drop(self.kv.sum(0) + x)


def draw(generator: torch.Generator, case: Case) -> dict[str, object]:
    return {
        "x": torch.randn(case.key, WIDTH, generator=generator),  # type: ignore[call-overload]
        "at": int(torch.randint(POSITIONS, (), generator=generator)),
    }


def decoders(
    loaded: bool = True, graphed_mode: str = "eval"
) -> tuple[CudaGraphTarget, Decoder, Decoder]:
    """Eager and graphed decoders (the graphed one on stand-in graphs, a graph per key): its
    weights loaded from eager's, or left as built (``loaded``); put in ``graphed_mode``."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        eager, graphed = Decoder().eval(), Decoder()
    if loaded:
        graphed.load_state_dict(eager.state_dict())
    graphed.train(graphed_mode == "train")

    def reset() -> None:
        for side in (eager, graphed):
            side.kv.zero_()

    target = cpu_target(
        eager=eager,
        graphed=StandInGraphs(graphed, rows),
        draw=draw,
        state=State(sides=lambda: (eager, graphed), reset=reset),
    )
    return target, eager, graphed


# Every check that compares the two sides, and what it needs beyond the target.
COMPARING: list[tuple[Callable[..., None], dict[str, object]]] = [
    (test_01_parity.test_parity, {}),
    (test_03_owned_outputs.test_owned_outputs, {}),
    (test_08_lock_safety.test_lock_safety, {}),
    (test_10_concurrency.test_concurrency, {}),
    (test_15_side_isolation.test_side_isolation, {}),
    (test_18_replay_order.test_replay_order, {}),
    (test_20_stateful.test_state_isolation, {}),
    (test_20_stateful.test_state_reset, {}),
    (test_21_module_state.test_module_state, {}),
    (test_24_capture_state.test_capture_does_not_advance_state, {}),
]
IDS = [check.__name__.removeprefix("test_") for check, _ in COMPARING]


def state_dict_of(module: nn.Module) -> dict[str, Tensor]:
    return copy.deepcopy(module.state_dict())


def same(first: dict[str, Tensor], second: dict[str, Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(("check", "fixtures"), COMPARING, ids=IDS)
def test_weights_never_loaded_on_the_graphed_side_fail_each_comparing_check_naming_them(
    check: Callable[..., None], fixtures: dict[str, object]
) -> None:
    """The check itself refuses (not only the suite's fixture before it), and the eager model
    keeps its own weights: they are never copied from the graphed side."""
    target, eager, _ = decoders(loaded=False)
    before = state_dict_of(eager)
    with pytest.raises(AssertionError) as refused:
        run(check, target, prepared=False, **fixtures)
    assert str(refused.value).startswith(
        "the two sides differ in what no call writes, a parameter: state['proj.weight'] at index "
    )
    assert same(state_dict_of(eager), before)
    twin, _, _ = decoders()
    run(check, twin, **fixtures)


@pytest.mark.parametrize(("check", "fixtures"), COMPARING[:3], ids=IDS[:3])
def test_a_graphed_side_left_in_train_mode_fails_naming_the_mode(
    check: Callable[..., None], fixtures: dict[str, object]
) -> None:
    target, eager, _ = decoders(graphed_mode="train")
    with pytest.raises(AssertionError) as refused:
        run(check, target, prepared=False, **fixtures)
    assert str(refused.value).startswith(
        "the two sides differ in what no call writes, a mode: state['training']: False in eager, "
        "True in graphed (and 2 more)"
    )
    assert not eager.training and not eager.drop.training


def test_before_a_check_that_compares_no_state_the_suite_names_the_weights() -> None:
    """No baked inputs keeps no lockstep: the suite brings the sides together before it."""
    target, eager, _ = decoders(loaded=False)
    before = state_dict_of(eager)
    with pytest.raises(Failed, match=r"^the two sides differ in what no call writes, a parameter"):
        run(test_02_no_baked_inputs.test_no_baked_inputs, target)
    assert same(state_dict_of(eager), before)


class Scribbling(Decoder):
    """A graphed decoder that writes 100 more than eager into the position it is given, from
    its ``wrong_from``-th call on (private: no state)."""

    def __init__(self, wrong_from: int) -> None:
        super().__init__()
        self._calls, self._wrong_from = 0, wrong_from

    def forward(self, inputs: dict[str, object]) -> Tensor:
        output = super().forward(inputs)
        self._calls += 1
        if self._calls > self._wrong_from:
            self.kv[int(inputs["at"])] += 100.0  # type: ignore[call-overload]
        return output


def test_what_the_graphed_side_wrote_wrong_never_reaches_the_eager_side() -> None:
    eager = Decoder().eval()
    graphed = Scribbling(wrong_from=3).eval()  # right through the probe's three calls
    graphed.load_state_dict(eager.state_dict())
    target = cpu_target(
        eager=eager,
        graphed=StandInGraphs(graphed, rows),
        draw=draw,
        state=State(sides=lambda: (eager, graphed)),
    )
    with pytest.raises(Failed) as failure:
        run(test_01_parity.test_parity, target)
    assert reported(failure)[0] == "the two sides' states parted:"
    assert reported(failure)[1].startswith(
        "the two sides' states parted after call 0 (key 2; a replay): state['kv'] at index ("
    )
    assert eager.kv.abs().max() < 50, "graphed's scribbles were copied into the eager side"


# State kept in Python: numbers, lists of ints, namespaces, numpy arrays


class Scheduler(nn.Module):
    """A decode step with the bookkeeping serving code keeps in Python beside its KV cache:
    a step counter, a length per key in a list, a namespace of totals, a histogram of batch
    sizes in a numpy array."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kv", torch.zeros(POSITIONS, WIDTH))
        self.steps = 0
        self.seq_lens = [0] * len(KEYS)
        self.totals = SimpleNamespace(tokens=0)
        self.batch_sizes = np.zeros(max(KEYS) + 1, dtype=np.int64)

    def bookkeeping(self, batch: int) -> None:
        self.steps += 1
        self.seq_lens[KEYS.index(batch)] += 1
        self.totals.tokens += batch
        self.batch_sizes[batch] += 1

    def step(self, inputs: dict[str, object]) -> Tensor:
        x = inputs["x"]
        assert isinstance(x, Tensor)
        self.kv[int(inputs["at"])] = x.mean(0)  # type: ignore[call-overload]
        return self.kv.sum(0) + x

    def forward(self, inputs: dict[str, object]) -> Tensor:
        self.bookkeeping(rows(inputs))  # type: ignore[arg-type]
        return self.step(inputs)


class SchedulerRunner:
    """The scheduler behind stand-in graphs, a graph per batch size: the step's tensor work
    replayed each call; its bookkeeping run on every call (``each_call``) or, as when it is
    left in the captured forward, only while the graph is captured."""

    def __init__(self, scheduler: Scheduler, each_call: bool) -> None:
        self.scheduler, self._each_call = scheduler, each_call
        self._graphs: dict[int, object] = {}

    def __call__(self, inputs: dict[str, object]) -> Tensor:
        batch = rows(inputs)  # type: ignore[arg-type]
        if batch not in self._graphs:
            self._graphs[batch] = captured()
            self.scheduler.bookkeeping(batch)  # Python runs while the graph is captured
        elif self._each_call:
            self.scheduler.bookkeeping(batch)
        self._graphs[batch].replay()  # type: ignore[attr-defined]
        return self.scheduler.step(inputs)


def schedulers(each_call: bool) -> CudaGraphTarget:
    eager, graphed = Scheduler(), Scheduler()
    return cpu_target(
        eager=eager,
        graphed=SchedulerRunner(graphed, each_call),
        draw=draw,
        state=State(sides=lambda: (eager, graphed)),
    )


def test_counters_lists_namespaces_and_arrays_kept_in_python_are_compared() -> None:
    with pytest.raises(Failed) as failure:
        run(test_21_module_state.test_module_state, schedulers(each_call=False))
    lines = reported(failure)
    assert lines[:5] == [
        "a graphed call changed its modules' state unlike an eager call:",
        "case 0 (key 2), a replay: state['steps']: 1 in eager, 0 in graphed (|diff| 1, rel 1; "
        "tolerance exact)",
        "case 0 (key 2), a replay: state['seq_lens'][0]: 1 in eager, 0 in graphed (|diff| 1, rel "
        "1; tolerance exact)",
        "case 0 (key 2), a replay: state['totals'].tokens: 2 in eager, 0 in graphed (|diff| 2, "
        "rel 1; tolerance exact)",
        "case 0 (key 2), a replay: state['batch_sizes'] at index (2,): eager 1, graphed 0 "
        "(|diff| 1, rel 1; tolerance exact); 1 of 5 elements differ, largest |diff| 1",
    ]
    with pytest.raises(Failed, match=r"parted after call 0 \(key 2; a replay\): state\['steps'\]"):
        run(test_01_parity.test_parity, schedulers(each_call=False))


def test_a_target_keeping_such_state_right_passes_and_its_state_is_copied_in_place() -> None:
    target = schedulers(each_call=True)
    assert run(test_00_target.test_dry_run, target) == [
        "eager and graphed once on each of 3 keys (graphed runs without CUDA); 4 of your "
        "callables ran"
    ]
    assert run(test_21_module_state.test_module_state, target) == [
        "4 call pairs over 2 keys (0 built a graph): 6 pieces of state compared"
    ]
    run(test_01_parity.test_parity, target)
    assert target.state is not None and target.state.sides is not None
    eager, graphed = target.state.sides()
    held = graphed.seq_lens, graphed.totals, graphed.batch_sizes  # type: ignore[attr-defined]
    eager.steps = 10  # type: ignore[attr-defined]
    graphed.steps = 5  # type: ignore[attr-defined]
    run(test_15_side_isolation.test_side_isolation, target)  # brought together first
    assert graphed.steps == eager.steps  # type: ignore[attr-defined]
    assert (graphed.seq_lens, graphed.totals, graphed.batch_sizes) == held  # type: ignore[attr-defined]


# State.sides giving copies or nothing


@pytest.mark.parametrize(
    ("sides", "refusal"),
    [
        (
            lambda eager, graphed: (eager.kv.clone(), graphed.kv.clone()),
            "State.sides() gives the eager side's state anew on each call (tensor is another "
            "object each time): it returns copies, which no call writes",
        ),
        (
            lambda eager, graphed: (copy.deepcopy(eager.state_dict()), graphed.state_dict()),
            "State.sides() gives the eager side's state anew on each call (kv is another "
            "object each time): it returns copies, which no call writes",
        ),
        (
            lambda eager, graphed: ({}, {}),
            "State.sides() gives the eager side no state (nothing a step could write)",
        ),
        (
            lambda eager, graphed: ([], []),
            "State.sides() gives the eager side no state (nothing a step could write)",
        ),
    ],
    ids=["clone()", "a deep-copied state_dict", "empty dicts", "empty lists"],
)
def test_state_sides_giving_copies_or_nothing_fail_the_checks(
    sides: Callable[[Decoder, Decoder], tuple[object, object]], refusal: str
) -> None:
    target, eager, graphed = decoders()
    target.state = State(sides=lambda: sides(eager, graphed))
    for check in (test_01_parity.test_parity, test_21_module_state.test_module_state):
        with pytest.raises(Failed) as failure:
            run(check, target)
        assert str(failure.value).startswith(refusal)
