"""Module state by path: copied, written back in place, compared; a Python-side counter, a
batch norm's running statistics and tensors kept in lists and dicts are state like any
parameter; two sides that hold the same module or buffer are told apart from two alike."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_cudagraph.engines.state import (
    load_state,
    module_state,
    shared_state,
    state_differences,
    state_view,
    tensor_addresses,
)


class Counting(nn.Module):
    """A batch norm and a Python-side counter of its calls, as a training loop keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(3)
        self.calls = 0
        self.scale = torch.ones(3)  # a tensor attribute that is neither parameter nor buffer
        self._cache = torch.zeros(1)  # private: not state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.norm(x) * self.scale


def test_the_state_is_every_parameter_buffer_tensor_and_number_by_path() -> None:
    state = module_state(Counting())
    # The batch norm's settings (eps, momentum, ...) are number attributes too.
    assert sorted(state) == [
        "calls",
        "norm.affine",
        "norm.bias",
        "norm.eps",
        "norm.momentum",
        "norm.num_batches_tracked",
        "norm.num_features",
        "norm.running_mean",
        "norm.running_var",
        "norm.track_running_stats",
        "norm.training",
        "norm.weight",
        "scale",
        "training",
    ]


def test_a_copy_is_not_changed_by_later_calls_and_differences_name_their_path() -> None:
    model = Counting().train()
    before = module_state(model)
    with torch.no_grad():
        model(torch.randn(4, 3))
    after = module_state(model)
    found = {mismatch.path: mismatch for mismatch in state_differences(before, after)}
    assert sorted(found) == [
        "state['calls']",
        "state['norm.num_batches_tracked']",
        "state['norm.running_mean']",
        "state['norm.running_var']",
    ]
    assert found["state['calls']"].describe() == (
        "state['calls']: 0 in eager, 1 in graphed (|diff| 1, rel inf; tolerance exact)"
    )


def test_load_state_writes_in_place_keeping_every_tensors_storage() -> None:
    source, target = Counting().train(), Counting()
    with torch.no_grad():
        source(torch.randn(4, 3))
    storage = target.norm.running_mean.untyped_storage().data_ptr()
    load_state(target, module_state(source))
    assert not state_differences(module_state(source), module_state(target))
    assert target.norm.running_mean.untyped_storage().data_ptr() == storage
    assert target.calls == 1 and target.training


def test_a_mapping_of_modules_names_each_by_its_key() -> None:
    state = module_state({"encoder": nn.Linear(2, 2), "head": nn.Linear(2, 1)})
    assert {"encoder.weight", "head.bias"} <= set(state)
    assert {"0.weight", "1.bias"} <= set(module_state([nn.Linear(2, 2), nn.Linear(2, 1)]))


def test_a_state_that_does_not_fit_is_refused_before_anything_is_written() -> None:
    model = Counting()
    state = module_state(model)
    with pytest.raises(ValueError, match=r"paths \['scale', 'training'\] missing, \['extra'\]"):
        load_state(
            model, {**{path: value for path, value in state.items() if path < "s"}, "extra": 1}
        )
    wrong = {**state, "norm.running_mean": torch.zeros(4), "calls": 5}
    with pytest.raises(
        ValueError, match=r"norm.running_mean: a torch.float32 tensor of shape \(4,\)"
    ):
        load_state(model, wrong)
    assert model.calls == 0  # nothing written
    with pytest.raises(ValueError, match=r"calls: str 'x' is not a number"):
        load_state(model, {**state, "calls": "x"})
    with pytest.raises(TypeError, match=r"state lives in a torch.nn.Module.*got int"):
        module_state(3)
    with pytest.raises(
        TypeError, match=r"\['head'\] must be a torch.nn.Module or a tensor, got str"
    ):
        module_state({"head": "linear"})


class Watched(Counting):
    """Records every attribute set on it after construction."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_set_names", [])  # private: not state

    def __setattr__(self, name: str, value: object) -> None:
        if "_set_names" in self.__dict__:
            self._set_names.append(name)
        super().__setattr__(name, value)


def test_load_state_sets_a_number_only_where_it_differs() -> None:
    """Compiled code guards on module attributes: setting one to its own value can recompile."""
    model = Watched()
    load_state(model, module_state(model))
    assert model._set_names == []
    load_state(model, {**module_state(model), "calls": 3})
    assert model._set_names == ["calls"] and model.calls == 3


def test_a_tensor_of_another_dtype_is_refused_and_nothing_written() -> None:
    model = Counting()
    state = module_state(model)
    wrong = {**state, "scale": torch.full((3,), 2.0, dtype=torch.float64), "calls": 5}
    with pytest.raises(ValueError, match=r"scale: a torch.float64 tensor of shape \(3,\)"):
        load_state(model, wrong)
    assert model.calls == 0 and torch.equal(model.scale, torch.ones(3))


def test_a_state_with_every_path_and_one_more_is_refused() -> None:
    model = Counting()
    with pytest.raises(ValueError, match=r"paths \[\] missing, \['extra'\] not theirs"):
        load_state(model, {**module_state(model), "extra": 1})


def test_states_are_compared_within_the_tolerance() -> None:
    expected, actual = {"w": torch.zeros(2)}, {"w": torch.full((2,), 0.25)}
    assert state_differences(expected, actual, atol=0.5) == []
    assert state_differences(expected, actual, rtol=0.5) != []


class Remembering(nn.Module):
    """State a decode step keeps outside its buffers: a KV pair in a list, a dict of caches, and
    a history list each call appends to."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = [torch.zeros(2), torch.zeros(2)]
        self.caches = {"k": torch.zeros(3), "length": 0}
        self.history: list[torch.Tensor] = []
        self.names = ["not", "state"]  # no tensor in it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kv[0].add_(x)
        self.caches["length"] += 1
        self.history.append(x.clone())
        return self.kv[0] * 2


def test_tensors_kept_in_lists_and_dicts_are_state_and_compared_by_index() -> None:
    eager, graphed = Remembering(), Remembering()
    assert sorted(module_state(eager)) == ["caches", "history", "kv", "training"]
    eager(torch.ones(2))
    graphed(torch.ones(2))
    assert state_differences(state_view(eager), state_view(graphed)) == []
    graphed.kv[0].add_(1)
    graphed(torch.ones(2))
    differences = state_differences(state_view(eager), state_view(graphed))
    found = [mismatch.describe() for mismatch in differences]
    assert found[0].startswith("state['kv'][0] at index (0,): eager 1, graphed 3")
    assert found[1].startswith("state['caches']['length']: 1 in eager, 2 in graphed")
    assert found[2] == "state['history']: length 1 in eager, 2 in graphed"


def test_load_state_copies_into_listed_tensors_and_gives_a_list_the_states_length() -> None:
    source, target = Remembering(), Remembering()
    for _ in range(3):
        source(torch.ones(2))
    target(torch.full((2,), 5.0))
    kv, history = target.kv[0], target.history
    first = history[0]
    load_state(target, module_state(source))
    assert target.kv[0] is kv and torch.equal(kv, torch.full((2,), 3.0))  # copied into
    assert target.history is history and len(history) == 3 and history[0] is first
    assert target.caches["length"] == 3
    assert not state_differences(state_view(source), state_view(target))
    source.history.clear()
    load_state(target, module_state(source))
    assert target.history == []


def test_tensors_given_themselves_are_state_written_in_place() -> None:
    eager = {"cache": torch.zeros(2, 3), "steps": [torch.zeros(1)]}
    graphed = {"cache": torch.ones(2, 3), "steps": [torch.ones(1)]}
    assert sorted(module_state(eager)) == ["cache", "steps.0"]
    addresses = tensor_addresses(eager)
    assert sorted(addresses) == ["state['cache']", "state['steps.0']"]
    load_state(eager, module_state(graphed))
    assert torch.equal(eager["cache"], torch.ones(2, 3)) and tensor_addresses(eager) == addresses
    assert sorted(module_state(torch.zeros(1))) == ["tensor"]


def test_a_tuple_or_tensor_that_does_not_fit_is_refused_naming_its_index() -> None:
    model = Remembering()
    model.kv = (torch.zeros(2), torch.zeros(2))
    state = module_state(model)
    with pytest.raises(ValueError, match=r"kv: a tuple of 1 does not fit one of 2"):
        load_state(model, {**state, "kv": (torch.zeros(2),)})
    with pytest.raises(ValueError, match=r"kv\[1\]: a torch.float32 tensor of shape \(3,\)"):
        load_state(model, {**state, "kv": (torch.zeros(2), torch.zeros(3))})


def test_two_sides_holding_the_same_module_or_buffer_are_named() -> None:
    shared = Counting()
    assert (
        shared_state([shared], [shared])[0] == "the module at '0.(root)' is the one at '0.(root)'"
    )
    assert shared_state({"a": shared}, {"b": Counting()}) == []
    twin = Counting()
    twin.norm.register_buffer("running_mean", shared.norm.running_mean)
    assert shared_state(shared, twin) == [
        "state['norm.running_mean'] and state['norm.running_mean'] share storage"
    ]
    twin = Counting()
    twin.norm.weight = shared.norm.weight  # weights shared by both sides: read, not written
    assert shared_state(shared, twin) == []
