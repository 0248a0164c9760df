"""pytest_cudagraph.conformance._diagnosis on the CPU: each module's output recorded by hooks,
the first that differs named in the order eager's modules finished, and what a target lacks for
a diagnosis said; a graphed side that wraps the model (a module around it, a runner holding it)
is matched by its modules' names. The graphed side is eager code here (on a GPU the hooks' copies
are recorded into the graph and replayed with it: test_own_graphs.py's twin graphed_layer_off)."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from cpu_checks import cpu_target
from torch import Tensor, nn

from pytest_cudagraph.conformance import Cache, Case, CudaGraphTarget, State, Tolerance
from pytest_cudagraph.conformance._diagnosis import (
    fail_naming_the_module,
    first_difference,
    models_of,
    recorded_call,
    where_it_differs,
)
from pytest_cudagraph.conformance._judging import numbered
from pytest_cudagraph.engines.compare import EXACT


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))


def off_at(model: nn.Sequential, index: int) -> nn.Sequential:
    """A copy of ``model`` whose layer ``index`` computes otherwise."""
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken[index].weight.mul_(1.5)
    return broken


def test_each_modules_output_is_recorded_in_the_order_modules_finish() -> None:
    model = mlp()
    x = torch.randn(2, 4)
    recorded = recorded_call({"": model}, lambda: model(x))
    assert recorded.order() == ["0", "1", "2", "3", "4", "model"]
    assert torch.equal(recorded.outputs["model"], model(x))
    assert all(not module._forward_hooks for module in model.modules()), "hooks removed"


def test_the_first_module_that_differs_is_named_not_the_ones_after_it() -> None:
    model, x = mlp(), torch.randn(2, 4)
    broken = off_at(model, 2)
    eager = recorded_call({"": model}, lambda: model(x))
    graphed = recorded_call({"": broken}, lambda: broken(x))
    found = first_difference(eager, graphed, EXACT)
    assert found is not None and found.startswith("the first module whose output differs is 2: ")
    assert first_difference(eager, eager, EXACT) is None
    # Beyond the tolerance only: a difference within it is no difference.
    assert first_difference(eager, graphed, Tolerance(atol=1e6)) is None


def cases(target: CudaGraphTarget, *numbers: int) -> list[Case]:
    return [numbered(target, number) for number in numbers]


def target_of(
    eager_model: nn.Module, graphed_model: nn.Module, **changes: object
) -> tuple[CudaGraphTarget, list[int]]:
    """Both sides' models as its state, and how often its cache was reset."""
    resets: list[int] = []
    fields: dict[str, object] = dict(
        eager=lambda inputs: eager_model(inputs["x"]),
        graphed=lambda inputs: graphed_model(inputs["x"]),
        draw=lambda generator, case: {"x": torch.randn(case.key, 4, generator=generator)},
        state=State(sides=lambda: (eager_model, graphed_model)),
        cache=Cache(reset=lambda: resets.append(1)),
    )
    return cpu_target(**{**fields, **changes}), resets


def test_a_target_built_from_modules_is_told_where_its_graph_went_wrong() -> None:
    model = mlp()
    target, resets = target_of(model, off_at(model, 4))
    assert where_it_differs(target, cases(target, 0, 1)).startswith(
        "case 0: the first module whose output differs is 4: 4 at index"
    )
    assert resets == [1], "the cache reset once, so that the graphed call captures afresh"
    same, _ = target_of(model, copy.deepcopy(model))
    assert where_it_differs(same, cases(same, 0, 1)) == (
        "every module's output agrees in the diagnostic calls: the difference is past them"
    )


def test_what_a_target_lacks_for_a_diagnosis_is_said() -> None:
    plain = cpu_target()
    assert where_it_differs(plain, cases(plain, 0)) == (
        "give State(sides=...) to have the first module whose output differs named"
    )
    tensors = cpu_target(state=State(sides=lambda: (torch.zeros(1), torch.zeros(1))))
    assert where_it_differs(tensors, cases(tensors, 0)) == (
        "the target's State.sides holds no torch.nn.Module: no module to name"
    )
    model = mlp()
    replayed = cpu_target(  # the graphed side runs no module in Python: a replay
        eager=lambda inputs: model(inputs["x"]),
        graphed=lambda inputs: torch.zeros(inputs["x"].shape[0], 4),
        draw=lambda generator, case: {"x": torch.randn(case.key, 4, generator=generator)},
        state=State(sides=lambda: (model, copy.deepcopy(model))),
    )
    assert where_it_differs(replayed, cases(replayed, 0)).startswith(
        "no module of the graphed side ran"
    )


def test_a_failure_keeps_its_message_and_gains_the_diagnosis() -> None:
    model = mlp()
    target, _ = target_of(model, off_at(model, 0))
    with pytest.raises(pytest.fail.Exception) as failure:
        fail_naming_the_module(
            target, cases(target, 0), AssertionError("parity: 1 of 64 cases differ")
        )
    first, second = str(failure.value).splitlines()
    assert first == "parity: 1 of 64 cases differ"
    assert second.startswith(
        "where the graph went wrong: case 0: the first module whose output differs is 0: "
    )

    def raising(inputs: dict[str, Tensor]) -> Tensor:
        raise RuntimeError("out of memory")

    broken = target_of(model, copy.deepcopy(model), graphed=raising)[0]
    with pytest.raises(pytest.fail.Exception, match=r"raised RuntimeError: out of memory$"):
        fail_naming_the_module(broken, cases(broken, 0), AssertionError("parity failed"))
    # Sides that share their state break the State rule; the failure is kept, the rule said.
    shared = target_of(model, model)[0]
    with pytest.raises(pytest.fail.Exception) as failure:
        fail_naming_the_module(shared, cases(shared, 0), AssertionError("parity failed"))
    first, second = str(failure.value).splitlines()
    assert first == "parity failed"
    assert second.startswith(
        "where the graph went wrong: the diagnostic calls raised AssertionError: State.sides() "
        "gives both sides the same state"
    )


class Wrapper(nn.Module):
    """What a graphed side often runs: the model inside a module of its own."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x)


def test_a_graphed_side_wrapping_the_model_is_matched_by_its_modules_names() -> None:
    """Eager's ``4`` is the wrapper's ``inner.4``: the first that differs is named, not passed
    over as a module the graphed side did not run."""
    model = mlp()
    wrapped = Wrapper(off_at(model, 2))
    target, _ = target_of(model, wrapped)
    assert where_it_differs(target, cases(target, 0)).startswith(
        "case 0: the first module whose output differs is 2: 2 at index"
    )
    same, _ = target_of(model, Wrapper(copy.deepcopy(model)))
    assert where_it_differs(same, cases(same, 0)) == (
        "every module's output agrees in the diagnostic calls: the difference is past them"
    )


def test_a_name_ending_two_graphed_names_is_matched_to_neither() -> None:
    """Eager's ``0`` ends both ``a.0`` and ``b.0``: which one is its twin cannot be told, so
    neither is compared; with one wrapper, the one twin is."""
    model, x = mlp(), torch.randn(2, 4)
    twice = nn.ModuleDict({"a": off_at(model, 0), "b": off_at(model, 0)})
    eager = recorded_call({"": model}, lambda: model(x))
    graphed = recorded_call({"": twice}, lambda: (twice["a"](x), twice["b"](x))[0])
    assert {"a.0", "b.0"} <= set(graphed.order()) and "0" not in graphed.outputs
    assert first_difference(eager, graphed, EXACT) is None
    wrapped = Wrapper(off_at(model, 0))
    graphed = recorded_call({"": wrapped}, lambda: wrapped(x))
    found = first_difference(eager, graphed, EXACT)
    assert found is not None and found.startswith("the first module whose output differs is 0: ")


class Runner:
    """A graphed side's runner: no module itself, the model among its public attributes."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._spare = copy.deepcopy(model)  # private: not one of the side's models
        self.steps = 0

    def __call__(self, x: Tensor) -> Tensor:
        self.steps += 1
        return self.model(x)


def test_the_modules_a_runner_holds_are_its_public_module_attributes() -> None:
    model = mlp()
    runner = Runner(off_at(model, 4))
    assert models_of(runner) == {"model": runner.model}
    assert models_of(types.SimpleNamespace(first=model, count=3)) == {"first": model}
    assert models_of({"m": model, "n": 1}) == {"m": model}
    assert models_of([model, torch.zeros(1)]) == {"0": model}
    assert models_of(model) == {"": model}
    target = cpu_target(
        eager=lambda inputs: model(inputs["x"]),
        graphed=lambda inputs: runner(inputs["x"]),
        draw=lambda generator, case: {"x": torch.randn(case.key, 4, generator=generator)},
        state=State(sides=lambda: (model, runner)),
    )
    assert where_it_differs(target, cases(target, 0)).startswith(
        "case 0: the first module whose output differs is 4: 4 at index"
    )
