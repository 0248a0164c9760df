"""Module state by path: copied, written back in place, compared; a Python-side counter, a
batch norm's running statistics, tensors kept in lists and dicts, host-side positions in lists,
namespaces, numpy arrays and a runner that is no module are state like any parameter, each of
a kind; two sides that hold the same module, buffer or list are told apart from two alike."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import threading
import types
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.state import (
    load_state,
    module_state,
    shared_state,
    state_differences,
    state_identity,
    state_kinds,
    state_size,
    state_view,
    tensor_addresses,
    written_paths,
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
    with pytest.raises(TypeError, match=r"^head must be a torch.nn.Module, a tensor, .* got str"):
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


def test_a_nan_is_not_set_again_and_an_equal_number_of_another_type_is() -> None:
    model = Watched()
    model.ratio = float("nan")
    model._set_names.clear()
    load_state(model, module_state(model))
    assert model._set_names == []
    load_state(model, {**module_state(model), "calls": 0.0})
    assert model._set_names == ["calls"] and type(model.calls) is float


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


@dataclasses.dataclass
class Positions:
    """A namespace a serving engine keeps for its batch."""

    lengths: list[int]
    step: int = 0


@dataclasses.dataclass(frozen=True)
class Settings:
    """A configuration: numbers and names, never written."""

    block_size: int = 16
    name: str = "settings"


@dataclasses.dataclass(frozen=True)
class Static:
    """Static buffers bundled in a frozen dataclass: written in place, so state."""

    tokens: torch.Tensor
    size: int = 2


class HostSide(nn.Module):
    """State kept in Python beside a buffer (positions in a list, a dict of slots, namespaces),
    and attributes that are no state at all."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_buffer("cache", torch.zeros(2))
        self.lengths = [3, 4]
        self.slots = {"a": 0, "b": 1}
        self.ns = types.SimpleNamespace(step=0, done=False)
        self.args = argparse.Namespace(offset=1.5)
        self.positions = Positions([1, 2])
        self.static = Static(torch.zeros(2))
        self.tagged = ["bucket", 8]  # one number beside a name: state
        self.names = ["not", "state"]  # no number, no tensor
        self.settings = Settings()  # a frozen configuration
        self.lock = threading.Lock()
        self.act = torch.relu
        self.config = object()
        self.use_cache = True
        self.scale = 2.0
        self.extra = torch.zeros(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lengths[0] += 1
        self.ns.step += 1
        self.positions.lengths.append(len(self.positions.lengths))
        self.cache.add_(1)
        return self.linear(x)


def test_each_piece_has_a_kind_and_what_is_not_state_is_skipped() -> None:
    assert state_kinds(HostSide()) == {
        "cache": "buffer",
        "training": "mode",
        "lengths": "container",
        "slots": "container",
        "ns": "container",
        "args": "container",
        "positions": "container",
        "static": "container",
        "tagged": "container",
        "use_cache": "flag",
        "scale": "number",
        "extra": "tensor",
        "linear.weight": "parameter",
        "linear.bias": "parameter",
        "linear.training": "mode",
        "linear.in_features": "number",
        "linear.out_features": "number",
    }
    assert state_size(HostSide()) == 17


def test_numbers_lists_and_namespaces_are_compared_and_written_in_place() -> None:
    eager, graphed = HostSide(), HostSide()
    graphed.load_state_dict(eager.state_dict())
    graphed(torch.ones(2))
    found = state_differences(state_view(eager), state_view(graphed))
    assert [mismatch.path for mismatch in found] == [
        "state['cache']",
        "state['lengths'][0]",
        "state['ns'].step",
        "state['positions'].lengths",
    ]

    def held(side: HostSide) -> list[object]:
        return [side.lengths, side.ns, side.positions, side.positions.lengths, side.args]

    kept = held(eager)
    load_state(eager, module_state(graphed))
    assert state_differences(state_view(eager), state_view(graphed)) == []
    assert all(now is then for now, then in zip(held(eager), kept, strict=True))  # in place
    assert eager.positions.lengths == [1, 2, 2] and eager.ns.step == 1 and eager.lengths[0] == 4


def test_entries_and_attributes_the_state_lacks_are_removed_in_place() -> None:
    source, target = HostSide(), HostSide()
    target.slots["c"] = 2
    target.ns.extra = 1
    slots, space = target.slots, target.ns
    load_state(target, module_state(source))
    assert target.slots is slots and slots == {"a": 0, "b": 1}
    assert target.ns is space and vars(space) == {"step": 0, "done": False}


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("slots", [0, 1], r"^slots: a list of 2 does not fit a dict of 2"),
        ("ns", Positions([]), r"^ns: a Positions of 2 does not fit a SimpleNamespace of 2"),
        ("extra", 0.0, r"^extra: float 0.0 does not fit a torch.float32 tensor"),
        ("scale", [1.0], r"^scale: a list of 1 is not a number"),
    ],
)
def test_a_container_or_leaf_of_another_kind_does_not_fit(
    path: str, value: object, message: str
) -> None:
    model = HostSide()
    with pytest.raises(ValueError, match=message):
        load_state(model, {**module_state(model), path: value})


def test_a_copy_keeps_each_namespaces_type_and_is_not_reached_by_later_writes() -> None:
    model = HostSide()
    saved = module_state(model)
    model(torch.ones(2))
    assert isinstance(saved["ns"], types.SimpleNamespace) and saved["ns"].step == 0
    assert isinstance(saved["args"], argparse.Namespace)
    assert isinstance(saved["positions"], Positions) and saved["positions"].lengths == [1, 2]
    assert isinstance(saved["static"], Static)


def test_immutable_entries_must_match_as_they_cannot_be_set() -> None:
    model = HostSide()
    model.kernel = (3, 3)
    state = module_state(model)
    with pytest.raises(ValueError, match=r"^kernel\[1\]: int 5 cannot be set where 3 is held"):
        load_state(model, {**state, "kernel": (3, 5), "scale": 9.0})
    with pytest.raises(ValueError, match=r"^static\.size: int 3 cannot be set where 2 is held"):
        load_state(model, {**state, "static": Static(torch.ones(2), 3)})
    assert model.scale == 2.0  # nothing written
    load_state(model, {**state, "static": Static(torch.ones(2), 2)})
    assert model.static.tokens.tolist() == [1.0, 1.0]  # a frozen dataclass's tensor copied into
    with pytest.raises(ValueError, match=r"^block_size: int 32 cannot be set where 16 is held"):
        load_state(Settings(), {"block_size": 32})


class Runner:
    """A serving engine's runner, no module: its model and the host-side state of its batch."""

    def __init__(self) -> None:
        self.model = nn.Linear(1, 1)
        self.seq_lens = [5, 7]
        self.step = 0
        self.state = types.SimpleNamespace(positions=[0, 1])
        self.name = "runner"
        self._private = [1]

    def __call__(self) -> None:
        self.step += 1
        self.seq_lens[1] += 1
        self.state.positions.append(2)


def test_a_runner_that_is_no_module_is_walked_like_one() -> None:
    eager, graphed = Runner(), Runner()
    assert state_kinds(eager) == {
        "model.weight": "parameter",
        "model.bias": "parameter",
        "model.training": "mode",
        "model.in_features": "number",
        "model.out_features": "number",
        "seq_lens": "container",
        "step": "number",
        "state": "container",
    }
    graphed.model.load_state_dict(eager.model.state_dict())
    graphed()
    found = [
        mismatch.path for mismatch in state_differences(state_view(eager), state_view(graphed))
    ]
    assert found == ["state['seq_lens'][1]", "state['step']", "state['state'].positions"]
    seq_lens = eager.seq_lens
    load_state(eager, module_state(graphed))
    assert eager.seq_lens is seq_lens and seq_lens == [5, 8] and eager.step == 1
    assert "1.step" in state_kinds((eager, graphed))


def test_namespaces_and_numbers_given_as_roots_are_state() -> None:
    root = types.SimpleNamespace(model=nn.Linear(1, 1), lengths=[1, 2], name="x")
    assert sorted(state_kinds(root)) == [
        "lengths",
        "model.bias",
        "model.in_features",
        "model.out_features",
        "model.training",
        "model.weight",
    ]
    held = {"lengths": [1, 2], "step": 3, "cache": [torch.zeros(1)]}
    assert state_kinds(held) == {"lengths": "container", "step": "number", "cache.0": "tensor"}
    load_state(held, {"lengths": [4], "step": 5, "cache.0": torch.ones(1)})
    assert held["lengths"] == [4] and held["step"] == 5 and held["cache"][0].item() == 1.0
    with pytest.raises(ValueError, match=r"^1: int 4 cannot be set where 3 is held"):
        load_state((root, 3), {**module_state((root, 3)), "1": 4})


def test_a_parameter_is_a_parameter_wherever_it_is_held() -> None:
    held = types.SimpleNamespace(w=nn.Parameter(torch.ones(1)), t=torch.ones(1))
    assert state_kinds(held) == {"w": "parameter", "t": "tensor"}
    assert state_kinds(nn.Parameter(torch.ones(1))) == {"tensor": "parameter"}


def test_a_roots_container_holding_a_module_is_walked_and_its_numbers_are_pieces() -> None:
    root = {"parts": [nn.Linear(1, 1), 3]}
    assert state_kinds(root)["parts.1"] == "number"
    assert state_kinds(root)["parts.0.weight"] == "parameter"


def test_a_value_state_cannot_compare_or_copy_is_named_never_skipped() -> None:
    module = nn.Module()
    module.kv = [torch.zeros(1), threading.Lock()]
    with pytest.raises(TypeError, match=r"^kv\[1\]: a _thread\.lock in state cannot be compared"):
        module_state(module)
    sampler = types.SimpleNamespace(seed=0, generator=torch.Generator())
    with pytest.raises(TypeError, match=r"^sampler\.generator: a torch\._C\.Generator in state"):
        state_view(types.SimpleNamespace(sampler=sampler))
    module.kv = [torch.zeros(1), range(3)]  # a container state cannot write into
    with pytest.raises(TypeError, match=r"^kv\[1\]: a builtins\.range in state"):
        state_kinds(module)


def test_numpy_arrays_are_state_copied_into_in_place() -> None:
    numpy = pytest.importorskip("numpy")
    eager, graphed = nn.Module(), nn.Module()
    for side in (eager, graphed):
        side.table = numpy.zeros(3, dtype=numpy.int64)
        side.rows = [numpy.zeros(2)]
        side.words = numpy.array(["a"])  # not numbers: not state
    graphed.table[1] = 4
    graphed.rows[0][0] = 0.5
    assert state_kinds(eager) == {"training": "mode", "table": "array", "rows": "container"}
    saved = module_state(graphed)
    graphed.table[2] = 9  # after the copy: not in it
    assert saved["table"].tolist() == [0, 4, 0]
    found = state_differences(state_view(eager), saved)
    assert [mismatch.path for mismatch in found] == ["state['table']", "state['rows'][0]"]
    assert found[0].first_index == (1,)
    table, row = eager.table, eager.rows[0]
    load_state(eager, saved)
    assert eager.table is table and table.tolist() == [0, 4, 0] and eager.rows[0] is row
    assert row.tolist() == [0.5, 0.0]
    wrong = {**saved, "table": numpy.zeros(4, dtype=numpy.int64)}
    with pytest.raises(ValueError, match=r"^table: a int64 array of shape \(4,\) does not fit"):
        load_state(eager, wrong)
    with pytest.raises(ValueError, match=r"^table: a int32 array of shape \(3,\) does not fit"):
        load_state(eager, {**saved, "table": numpy.zeros(3, dtype=numpy.int32)})
    assert sorted(module_state(numpy.zeros(2))) == ["array"]
    eager.rows.append(numpy.array([object()]))
    with pytest.raises(TypeError, match=r"^rows\[1\]: an array of dtype object is not compared"):
        module_state(eager)


def test_an_arrays_identity_is_its_memory_so_a_view_of_it_is_the_state_itself() -> None:
    numpy = pytest.importorskip("numpy")
    table = numpy.zeros(4)
    first, again = state_identity({"t": table[:]}), state_identity({"t": table[:]})
    assert first == again
    assert state_identity({"t": table.copy()}) != first
    with pytest.raises(ValueError, match=r"^t: a list of 1 does not fit a float64 array"):
        load_state({"t": table}, {"t": [0.0]})


def test_load_state_writes_only_the_paths_given_and_refuses_unknown_ones_first() -> None:
    source, target = Counting().train(), Counting()
    with torch.no_grad():
        source(torch.randn(4, 3))
        source.norm.weight.fill_(2.0)  # a parameter a caller does not copy
    state = module_state(source)
    load_state(target, state, paths=["calls", "norm.running_mean"])
    assert target.calls == 1
    assert torch.equal(target.norm.running_mean, source.norm.running_mean)
    assert not torch.equal(target.norm.running_var, source.norm.running_var)
    assert torch.equal(target.norm.weight, torch.ones(3))
    with pytest.raises(ValueError, match=r"\['extra'\] not the root's, \[\] not in the state"):
        load_state(target, {**state, "calls": 7, "extra": 1}, paths=["calls", "extra"])
    with pytest.raises(ValueError, match=r"\[\] not the root's, \['scale'\] not in the state"):
        load_state(target, {"calls": 7}, paths=["calls", "scale"])
    assert target.calls == 1  # nothing written
    load_state(target, {"calls": 7}, paths=["calls"])
    assert target.calls == 7
    with pytest.raises(TypeError, match="a collection of paths, got the string 'calls'"):
        load_state(target, state, paths="calls")


def test_written_paths_are_those_a_call_changed_nan_equal_to_nan() -> None:
    model = HostSide()
    model.register_buffer("unset", torch.full((2,), float("nan")))
    model.ratio = float("nan")
    before = module_state(model)
    model(torch.ones(2))
    after = module_state(model)
    assert written_paths(before, after) == {"cache", "lengths", "ns", "positions"}
    assert written_paths(before, before) == set()
    nudged = {**before, "cache": torch.tensor([0.0, 1e-30])}
    assert written_paths(before, nudged) == {"cache"}
    assert written_paths(before, {**before, "new": 1}) == {"new"}
    assert written_paths({**before, "gone": 1}, before) == {"gone"}


def test_state_identity_tells_the_state_itself_from_a_copy() -> None:
    runner = Runner()
    first, again = state_identity(runner), state_identity(runner)
    assert first == again and len(first) == state_size(runner) == 8
    copied = copy.deepcopy(runner)
    moved = {path for path, place in state_identity(copied).items() if place != first[path]}
    assert moved == set(first)
    itself = {"model": runner.model, "seq_lens": runner.seq_lens, "cache": runner.model.weight}
    partly = {**itself, "seq_lens": list(runner.seq_lens), "cache": runner.model.weight.clone()}
    mine, theirs = state_identity(itself), state_identity(partly)
    assert {path for path in mine if mine[path] != theirs[path]} == {"seq_lens", "cache"}
    assert (
        state_size(types.SimpleNamespace(name="nothing")) == 0 == state_size(object.__new__(Runner))
    )


def deep(levels: int) -> list[object]:
    """``levels`` lists, each in the one above, the innermost holding a number."""
    value: list[object] = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


def looped() -> list[object]:
    value: list[object] = [1]
    value.append(value)
    return value


READS: dict[str, Callable[[object], object]] = {
    "module_state": module_state,
    "state_view": state_view,
    "state_kinds": state_kinds,
    "state_identity": state_identity,
    "tensor_addresses": tensor_addresses,
    "shared_state first": lambda root: shared_state(root, nn.Module()),
    "shared_state second": lambda root: shared_state(nn.Module(), root),
    "load_state": lambda root: load_state(root, {}),
}


@pytest.mark.parametrize("read", list(READS), ids=list(READS))
def test_state_a_walk_cannot_finish_is_a_value_error_naming_the_path_and_the_rule(
    read: str,
) -> None:
    """Each used to be a raw RecursionError."""
    module = nn.Module()
    module.history = looped()
    with pytest.raises(ValueError, match=r"^history\[1\]: holds itself \(it is history again\)"):
        READS[read](module)
    module.history = deep(5000)
    rule = r"^history(\[0\]){100}: nested deeper than 100 containers \(trees\.MAX_DEPTH\)"
    with pytest.raises(ValueError, match=rule):
        READS[read](module)
    runner = Runner()
    runner.state.positions = looped()
    with pytest.raises(ValueError, match=r"^state\.positions\[1\]: holds itself"):
        READS[read](runner)
    space = argparse.Namespace(step=1)
    space.me = space
    with pytest.raises(ValueError, match=r"^state\['space'\]\.me: holds itself"):
        READS[read]({"space": space})
    sides = [nn.Linear(1, 1)]
    for _ in range(5000):
        sides = [sides]
    with pytest.raises(ValueError, match=r"^state(\[0\]){100}: nested deeper than 100"):
        READS[read](sides)
    looped_sides: list[object] = [nn.Linear(1, 1)]
    looped_sides.append(looped_sides)
    with pytest.raises(ValueError, match=r"^state\[1\]: holds itself \(it is state again\)"):
        READS[read](looped_sides)


@pytest.mark.parametrize("compare", [state_differences, written_paths])
def test_states_given_to_compare_are_bounded_too(compare: Callable[..., object]) -> None:
    with pytest.raises(ValueError, match=r"^state\['h'\](\[0\]){99}: nested deeper than 100"):
        compare({"h": deep(5000)}, {"h": deep(5000)})


def test_state_nested_as_deep_as_a_walk_goes_is_read_written_and_compared() -> None:
    """A piece is compared inside the state's dict: one level of the walk's bound is that."""
    eager, graphed = nn.Module(), nn.Module()
    eager.history, graphed.history = deep(trees.MAX_DEPTH - 1), deep(trees.MAX_DEPTH - 1)
    graphed.history[0][0].append(2)
    assert len(state_differences(module_state(eager), state_view(graphed))) == 1
    assert written_paths(module_state(eager), module_state(graphed)) == {"history"}
    load_state(eager, module_state(graphed))
    assert state_differences(state_view(eager), state_view(graphed)) == []
    eager.history = [eager.history]
    with pytest.raises(ValueError, match="nested deeper than 100"):
        state_differences(state_view(eager), state_view(graphed))


def test_two_sides_holding_one_list_namespace_or_runner_share_state() -> None:
    eager = Runner()
    assert shared_state(eager, Runner()) == []
    graphed = Runner()
    graphed.seq_lens = eager.seq_lens
    assert shared_state(eager, graphed) == ["state['seq_lens'] and state['seq_lens'] are one list"]
    graphed = Runner()
    graphed.state = eager.state
    assert shared_state(eager, graphed) == [
        "state['state'] and state['state'] are one SimpleNamespace",
        "state['state'].positions and state['state'].positions are one list",
    ]
    graphed = Runner()
    graphed.model = eager.model
    assert shared_state(eager, graphed) == [
        "the module at 'model.(root)' is the one at 'model.(root)'"
    ]
    assert shared_state(eager, eager)[1] == "the Runner at '(root)' is the one at '(root)'"
    assert shared_state({"step": 3}, {"step": 3}) == []  # equal numbers are no place
    pair = (nn.Linear(1, 1), 3)  # the tuple holds no place to write, its module does
    assert shared_state(pair, pair) == ["the module at '0.(root)' is the one at '0.(root)'"]
    graphed = Runner()
    graphed.shape = eager.shape = (2, 2)
    assert shared_state(eager, graphed) == []
    held = {"step": 3}
    assert shared_state(held, held) == ["the dict at '(root)' is the one at '(root)'"]
    graphed = Runner()
    graphed.step = eager.step = 12345
    graphed.model.weight = eager.model.weight  # weights shared: read, not written
    assert shared_state(eager, graphed) == []


def test_two_sides_holding_one_arrays_memory_share_state() -> None:
    numpy = pytest.importorskip("numpy")
    table = numpy.zeros(4)
    assert shared_state({"t": table}, {"t": table[2:]}) == [
        "state['t'] and state['t'] share memory"
    ]
    assert shared_state({"t": table}, {"t": table.copy()}) == []


def test_an_empty_container_one_side_has_where_the_other_has_no_state_is_no_difference() -> None:
    """A runner's ``graphs = {}``: empty it looks like state, filled with graphs it is not."""

    class Runner:
        def __init__(self) -> None:
            self.graphs: dict[int, object] = {}
            self.kv = torch.zeros(2)

    eager, graphed = Runner(), Runner()
    graphed.graphs[1] = object()
    assert state_differences(state_view(eager), state_view(graphed)) == []
    assert written_paths(state_view(eager), state_view(graphed)) == set()
    graphed.kv += 1
    assert [m.path for m in state_differences(state_view(eager), state_view(graphed))] == [
        "state['kv']"
    ]
    eager.history = [torch.ones(1)]  # type: ignore[attr-defined]
    graphed.history = []  # type: ignore[attr-defined]
    assert state_differences(state_view(eager), state_view(graphed))  # both state: they differ
