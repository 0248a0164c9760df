"""pytest_cudagraph.conformance.diagnosis on the CPU: each module's output recorded by hooks,
the first that differs named in the order eager's modules finished, and what a target lacks for
a diagnosis said. The graphed side is eager code here (on a GPU the hooks' copies are recorded
into the graph and replayed with it: test_own_graphs.py's broken twin graphed_layer_off)."""

from __future__ import annotations

import copy

import pytest
import torch
from cpu_checks import cpu_target
from torch import Tensor, nn

from pytest_cudagraph.conformance import Cache, CudaGraphTarget, State, Tolerance
from pytest_cudagraph.conformance.diagnosis import (
    fail_naming_the_module,
    first_difference,
    recorded_call,
    where_it_differs,
)
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
    assert where_it_differs(target, [0, 1]).startswith(
        "case 0: the first module whose output differs is 4: 4 at index"
    )
    assert resets == [1], "the cache reset once, so that the graphed call captures afresh"
    same, _ = target_of(model, copy.deepcopy(model))
    assert where_it_differs(same, [0, 1]) == (
        "every module's output agrees in the diagnostic calls: the difference is past them"
    )


def test_what_a_target_lacks_for_a_diagnosis_is_said() -> None:
    assert where_it_differs(cpu_target(), [0]) == (
        "give State(sides=...) to have the first module whose output differs named"
    )
    tensors = cpu_target(state=State(sides=lambda: (torch.zeros(1), torch.zeros(1))))
    assert where_it_differs(tensors, [0]) == (
        "the target's State.sides holds no torch.nn.Module: no module to name"
    )
    model = mlp()
    replayed = cpu_target(  # the graphed side runs no module in Python: a replay
        eager=lambda inputs: model(inputs["x"]),
        graphed=lambda inputs: torch.zeros(inputs["x"].shape[0], 4),
        draw=lambda generator, case: {"x": torch.randn(case.key, 4, generator=generator)},
        state=State(sides=lambda: (model, copy.deepcopy(model))),
    )
    assert where_it_differs(replayed, [0]).startswith("no module of the graphed side ran")


def test_a_failure_keeps_its_message_and_gains_the_diagnosis() -> None:
    model = mlp()
    target, _ = target_of(model, off_at(model, 0))
    with pytest.raises(pytest.fail.Exception) as failure:
        fail_naming_the_module(target, [0], AssertionError("parity: 1 of 64 cases differ"))
    first, second = str(failure.value).splitlines()
    assert first == "parity: 1 of 64 cases differ"
    assert second.startswith(
        "where the graph went wrong: case 0: the first module whose output differs is 0: "
    )

    def raising(inputs: dict[str, Tensor]) -> Tensor:
        raise RuntimeError("out of memory")

    broken = target_of(model, model, graphed=raising)[0]
    with pytest.raises(pytest.fail.Exception, match=r"raised RuntimeError: out of memory$"):
        fail_naming_the_module(broken, [0], AssertionError("parity failed"))
