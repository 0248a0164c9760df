"""The one walker: which containers it looks into, the paths it names, its copies, and the
leaves it refuses."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import types

import pytest
import torch

from pytest_cudagraph.engines import trees


@dataclasses.dataclass
class Step:
    logits: torch.Tensor
    cache: list[torch.Tensor]
    length: int = 3


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenStep:
    logits: torch.Tensor


Pair = collections.namedtuple("Pair", ["tokens", "memory"])


class Mode(enum.Enum):
    GRAPHED = 1


def paths(value: object, path: str = "output") -> list[str]:
    return [found for found, _ in trees.tensors(value, path)]


def test_every_container_is_walked_and_each_tensor_named() -> None:
    x = torch.zeros(1)
    value = {
        "step": Step(x, [x, x]),
        "pair": Pair(x, (x,)),
        "space": types.SimpleNamespace(kv=x),
        "frozen": FrozenStep(x),
    }
    assert paths(value) == [
        "output['step'].logits",
        "output['step'].cache[0]",
        "output['step'].cache[1]",
        "output['pair'].tokens",
        "output['pair'].memory[0]",
        "output['space'].kv",
        "output['frozen'].logits",
    ]


def test_an_argparse_namespace_is_a_namespace_walked_copied_and_bounded() -> None:
    x = torch.ones(1)
    value = {"args": argparse.Namespace(kv=x, steps=[x])}
    assert paths(value) == ["output['args'].kv", "output['args'].steps[0]"]
    copied = trees.snapshot(value)
    x.zero_()
    assert isinstance(copied["args"], argparse.Namespace) and copied["args"].kv.item() == 1.0
    looped = argparse.Namespace(x=x)
    looped.me = looped
    with pytest.raises(ValueError, match=r"^output\.me: holds itself \(it is output again\)"):
        trees.check_bounds(looped, "output")


def test_walk_yields_each_container_before_what_it_holds() -> None:
    x = torch.zeros(1)
    found = list(trees.walk({"a": [x, 2], "b": types.SimpleNamespace(c="c")}, "v"))
    assert [path for path, _ in found] == [
        "v",
        "v['a']",
        "v['a'][0]",
        "v['a'][1]",
        "v['b']",
        "v['b'].c",
    ]
    assert found[2][1] is x
    with pytest.raises(ValueError, match=r"nested deeper than 100 containers"):
        next(trees.walk(nested(trees.MAX_DEPTH), "v"))
    assert len(list(trees.walk(nested(trees.MAX_DEPTH - 1)))) == trees.MAX_DEPTH + 1


def test_root_paths_read_as_call_arguments() -> None:
    x = torch.zeros(1)
    assert paths(x, "") == ["input"]
    assert paths((x, x), "") == ["args[0]", "args[1]"]
    assert paths({"tokens": x}, "") == ["tokens"]
    assert paths(Pair(x, x), "") == ["tokens", "memory"]


def test_strings_and_arbitrary_objects_are_leaves() -> None:
    class Holder:
        tensor = torch.zeros(1)

    assert trees.node("abc") is None and trees.node(b"ab") is None
    assert trees.node(Holder()) is None and trees.node(Step) is None  # a class is a leaf
    assert paths(["abc", Holder()]) == []


def test_a_snapshot_cannot_be_reached_by_later_writes_and_keeps_its_structure() -> None:
    x = torch.ones(2, requires_grad=True)
    value = (Step(x * 1, [x * 2]), Pair(x * 3, 4), types.SimpleNamespace(a=x * 4), [x * 5])
    copied = trees.snapshot(value)
    with torch.no_grad():
        for _, tensor in trees.tensors(value):
            tensor.zero_()
    assert isinstance(copied, tuple)
    step, pair, space, listed = copied
    assert isinstance(step, Step) and step.length == 3 and isinstance(step.cache, list)
    assert isinstance(pair, Pair) and pair.memory == 4
    assert isinstance(space, types.SimpleNamespace) and isinstance(listed, list)
    assert [float(tensor[0]) for _, tensor in trees.tensors(copied)] == [1, 2, 3, 4, 5]
    assert not any(tensor.requires_grad for _, tensor in trees.tensors(copied))


def test_a_frozen_dataclass_with_slots_is_copied_too() -> None:
    original = FrozenStep(torch.ones(2))
    copied = trees.snapshot(original)
    original.logits.zero_()
    assert isinstance(copied, FrozenStep) and copied.logits.tolist() == [1.0, 1.0]


def test_cloned_keeps_autograd_and_every_leaf() -> None:
    x = torch.ones(2, requires_grad=True)
    holder = object()
    copied = trees.cloned({"y": x * 2, "holder": holder})
    assert copied["y"].requires_grad and copied["holder"] is holder


def test_tensor_elements_are_compared_and_numbers_beside_them_are_not() -> None:
    """A step count or a length beside the tensors comes out alike whether a graph ran or
    not: it used to make an output of empty tensors count as compared."""
    assert trees.compared_elements((torch.zeros(2, 3), 1, "a", None)) == 6
    assert (
        trees.compared_elements([torch.empty(0), {}, (), None, Step(torch.empty(0, 4), [], 0)]) == 0
    )
    assert trees.compared_elements({"logits": torch.empty(0, 5), "step": 3, "done": True}) == 0


def test_numbers_are_compared_where_no_tensor_is() -> None:
    """A number an output holds with no tensor beside it is a computed value (a loss read
    with .item(), sampled tokens as a list)."""
    assert trees.compared_elements(2.5) == 1
    assert trees.compared_elements({"tokens": [17, 5, 3], "done": True, "score": 1j}) == 5
    assert trees.compared_elements(Pair(4, [0.5])) == 2


@pytest.mark.parametrize(
    "value",
    [None, "text", b"bytes", Mode.GRAPHED, torch.float16, torch.device("cpu"), [], (), {}],
)
def test_labels_and_empty_containers_are_not_compared_elements(value: object) -> None:
    assert trees.compared_elements([value, {"name": value}]) == 0


def nested(depth: int) -> list[object]:
    value: list[object] = [torch.zeros(1)]
    for _ in range(depth):
        value = [value]
    return value


def self_holding() -> dict[str, object]:
    looped: dict[str, object] = {"x": torch.zeros(1)}
    looped["again"] = [Step(torch.zeros(1), [looped])]
    return looped


def doubling(levels: int) -> list[object]:
    value: list[object] = [torch.zeros(1)]
    for _ in range(levels):
        value = [value, value]  # one list in two places: 2**levels paths down
    return value


WALKS = {
    "tensors": lambda value: list(trees.tensors(value, "output")),
    "snapshot": lambda value: trees.snapshot(value, "output"),
    "cloned": trees.cloned,
    "compared_elements": lambda value: trees.compared_elements(value, "output"),
}


@pytest.mark.parametrize("walk", list(WALKS), ids=list(WALKS))
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (nested(3000), r"(\[0\]){100}: nested deeper than 100 containers \(trees\.MAX_DEPTH\)"),
        (
            self_holding(),
            r"again'?\]?\[0\]\.cache\[0\]: holds itself \(it is (output|the value) again\)",
        ),
        (doubling(40), r"\]: more than 10,000 entries in all \(trees\.MAX_ENTRIES\)"),
        (
            range(10**12),
            r"^(output|the value): a range of 1000000000000 entries, more than a walk visits",
        ),
    ],
    ids=["3000 deep", "holds itself", "one list in 2**40 places", "a long range"],
)
def test_every_walk_is_bounded_and_names_where_and_the_bound(
    walk: str, value: object, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each used to be a raw RecursionError, or a walk without end."""
    monkeypatch.setattr(trees, "MAX_ENTRIES", 10_000)  # the rule, without a million entries
    with pytest.raises(ValueError, match=message):
        WALKS[walk](value)


def test_one_container_in_two_places_is_walked_twice() -> None:
    shared = [torch.ones(1)]
    assert paths({"a": shared, "b": shared}) == ["output['a'][0]", "output['b'][0]"]
    assert trees.compared_elements(doubling(10)) == 2**10


def test_the_bounds_themselves_are_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    trees.check_bounds(nested(trees.MAX_DEPTH - 1))
    monkeypatch.setattr(trees, "MAX_ENTRIES", 100)
    trees.check_bounds([list(range(50)), list(range(48))])  # 2 + 50 + 48 entries
    with pytest.raises(ValueError, match=r"^output\[1\]: more than 100 entries"):
        trees.check_bounds([list(range(50)), list(range(49))], "output")


@pytest.mark.parametrize(
    "value",
    [None, True, 3, 2.5, 1j, "text", b"bytes", Mode.GRAPHED, torch.float16, torch.device("cpu")],
)
def test_plain_leaves_are_supported(value: object) -> None:
    assert trees.unsupported(value) == ""
    assert trees.snapshot([value]) == [value]


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (Opaque(), r"a test_trees\.Opaque is not compared: a compared value may hold tensors"),
        ({1, 2}, r"a builtins\.set is not compared"),
        (torch.zeros(3).to_sparse(), r"a torch\.sparse_coo tensor is not compared: .*to_dense"),
        (torch.empty(2, device="meta"), r"a meta tensor holds no values"),
        (
            torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged),
            r"a nested tensor is not compared: unbind it",
        ),
    ],
    ids=["object", "set", "sparse", "meta", "nested"],
)
def test_an_unsupported_leaf_is_refused_with_its_full_path(value: object, rule: str) -> None:
    with pytest.raises(TypeError, match=rf"^output\['a'\]\.cache\[1\]: {rule}"):
        trees.snapshot({"a": Step(torch.zeros(1), [torch.zeros(1), value])}, "output")


def test_a_numpy_array_is_refused() -> None:
    numpy = pytest.importorskip("numpy", reason="numpy is not installed here")
    with pytest.raises(TypeError, match=r"^value\[0\]: a numpy\.ndarray is not compared"):
        trees.snapshot([numpy.zeros(2)])


def test_with_tensor_swaps_one_tensor_nested_or_not_and_keeps_every_other_leaf() -> None:
    first, second, new = torch.zeros(1), torch.ones(1), torch.full((1,), 7.0)
    inputs = {"x": first, "extra": [second, 3], "rows": 2}
    swapped = trees.with_tensor(inputs, "extra[0]", new)
    assert swapped["extra"][0] is new and swapped["x"] is first and swapped["rows"] == 2
    assert inputs["extra"][0] is second  # the value given is not changed
    assert trees.with_tensor(first, "input", new) is new
    with pytest.raises(KeyError, match=r"no tensor at 'extra\[1\]'"):
        trees.with_tensor(inputs, "extra[1]", new)
