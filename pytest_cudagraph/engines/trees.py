"""One walker over nested outputs and inputs: the containers every engine and check looks into.

What counts as a container is decided here once (``node``): mappings, sequences (tuples, named
tuples, lists), dataclass instances and namespaces (``SimpleNamespace``, ``argparse.Namespace``).
``walk`` yields everything in a value with its path, ``tensors`` each tensor, ``snapshot``
copies a value so that later in-place writes cannot reach the copy, ``cloned`` does the same
keeping autograd, ``with_tensor`` swaps one tensor for another, ``compared_elements`` says how
much a comparison of the value compares, and ``unsupported`` names a leaf that cannot be
compared. Every walk is bounded first (``check_bounds``): a value that holds itself, nests past
``MAX_DEPTH`` or holds more than ``MAX_ENTRIES`` entries is a ValueError naming where. torch is
imported when used.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAPPING, SEQUENCE, ATTRIBUTES = "mapping", "sequence", "attributes"
# What a value compared by walking may hold besides containers and tensors.
PLAIN_VALUES = (
    "tensors (strided), numbers, strings, bytes, None, enums, torch dtypes and devices, in "
    "tuples, lists, dicts, dataclasses and namespaces"
)
_TEXT = (str, bytes, bytearray, memoryview)
_SCALARS = frozenset((int, float, bool, complex, str, bytes, type(None)))
# Containers within containers a walk goes down, at most: real outputs nest a few levels, and
# the walks recurse, so a deeper value (a linked list, a loop) must be refused by name.
MAX_DEPTH = 100
# Entries a walk visits in all, at most (an entry shared by several containers counts each
# time): past it a value is a mistake (a tensor's values as Python numbers, a range).
MAX_ENTRIES = 1_000_000


@dataclasses.dataclass(frozen=True)
class Node:
    """A container: its kind (MAPPING, SEQUENCE or ATTRIBUTES) and its (key, child) pairs, the
    key being a mapping key, an index or an attribute name."""

    kind: str
    items: tuple[tuple[Any, Any], ...]


def node(value: Any) -> Node | None:
    """``value`` as a container; None for a leaf (a tensor, a number, any other object)."""
    if type(value) in _SCALARS:  # the commonest leaves, told apart at once
        return None
    import torch

    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, Mapping):
        return Node(MAPPING, tuple(value.items()))
    if _is_named_tuple(value):
        return Node(SEQUENCE, tuple(zip(value._fields, value, strict=True)))
    if isinstance(value, Sequence) and not isinstance(value, _TEXT):
        if len(value) > MAX_ENTRIES:  # read before the items: a range can be any length
            raise ValueError(
                f"a {type(value).__name__} of {len(value)} entries, more than a walk visits "
                f"(trees.MAX_ENTRIES, {MAX_ENTRIES:,}); hold many values in a tensor"
            )
        return Node(SEQUENCE, tuple(enumerate(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return Node(ATTRIBUTES, tuple((field.name, getattr(value, field.name)) for field in fields))
    if isinstance(value, (types.SimpleNamespace, argparse.Namespace)):
        return Node(ATTRIBUTES, tuple(vars(value).items()))
    return None


def child_path(path: str, container: Node, key: object) -> str:
    """The path of a child. At the root (an empty path) names read as call arguments:
    positions as "args[0]", keys, fields and attributes by name."""
    if container.kind == MAPPING:
        return f"{path}[{key!r}]" if path else str(key)
    if isinstance(key, str):  # an attribute, or a named tuple's field
        return f"{path}.{key}" if path else key
    return f"{path or 'args'}[{key}]"


def check_bounds(value: object, path: str = "") -> None:
    """ValueError naming the path and the bound where a walk of ``value`` would not end, or
    not soon: a container that holds itself, containers nested deeper than ``MAX_DEPTH``,
    more than ``MAX_ENTRIES`` entries in all. A container found twice side by side (one list
    in two places) is fine. Walks iteratively, so that the check itself is bounded too."""
    entries = 0
    on_path: dict[int, str] = {}  # the containers above the one in hand, with their paths
    # (value, its parent's path and node (None at the root), its key there, depth, leaving):
    # a path is made only for a container, as leaves are many.
    stack: list[tuple[object, str, Node | None, object, int, bool]] = [
        (value, path, None, None, 0, False)
    ]
    while stack:
        item, parent, parent_node, key, depth, leaving = stack.pop()
        if leaving:
            del on_path[id(item)]
            continue
        try:
            container = node(item)
        except ValueError as error:
            raise ValueError(f"{_path(parent, parent_node, key) or 'the value'}: {error}") from None
        if container is None:
            continue
        where = _path(parent, parent_node, key)
        if id(item) in on_path:
            raise ValueError(
                f"{where}: holds itself (it is {on_path[id(item)] or 'the value'} again); a "
                "walked value must be a tree of containers, not a loop"
            )
        if depth == MAX_DEPTH:
            raise ValueError(
                f"{where or 'the value'}: nested deeper than {MAX_DEPTH} containers "
                "(trees.MAX_DEPTH); a walked value nests a few levels"
            )
        entries += len(container.items)
        if entries > MAX_ENTRIES:
            raise ValueError(
                f"{where or 'the value'}: more than {MAX_ENTRIES:,} entries in all "
                "(trees.MAX_ENTRIES); hold many values in a tensor"
            )
        on_path[id(item)] = where
        stack.append((item, where, None, None, depth, True))
        stack += [
            (child, where, container, key, depth + 1, False)
            for key, child in reversed(container.items)
        ]


def _path(parent: str, parent_node: Node | None, key: object) -> str:
    return parent if parent_node is None else child_path(parent, parent_node, key)


def walk(value: object, path: str = "") -> Iterator[tuple[str, object]]:
    """(path, item) for ``value`` itself and each container and leaf in it, a container before
    what it holds, paths as ``child_path`` names them; bounded first (``check_bounds``)."""
    check_bounds(value, path)
    yield from _walk(value, path)


def _walk(value: object, path: str) -> Iterator[tuple[str, object]]:
    yield path, value
    container = node(value)
    if container is not None:
        for key, item in container.items:
            yield from _walk(item, child_path(path, container, key))


def tensors(value: object, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for each tensor in a value. With an empty path, names read as call
    arguments: "input" for a lone tensor, "args[0]" positionally, the keyword otherwise."""
    import torch

    check_bounds(value, path)
    for where, leaf in _leaves(value, path):
        if isinstance(leaf, torch.Tensor):
            yield where or "input", leaf


def _leaves(value: object, path: str) -> Iterator[tuple[str, object]]:
    container = node(value)
    if container is None:
        yield path, value
        return
    for key, item in container.items:
        yield from _leaves(item, child_path(path, container, key))


def unsupported(value: object) -> str:
    """Why a leaf cannot be compared ("" when it can): what the walk cannot see into, or a
    tensor whose values cannot be read as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return "a nested tensor is not compared: unbind it into a list of tensors"
        if value.layout != torch.strided:
            return f"a {value.layout} tensor is not compared: convert it with .to_dense()"
        if value.device.type == "meta":
            return "a meta tensor holds no values to compare"
        return ""
    if node(value) is not None or isinstance(value, _plain_types()):
        return ""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return f"a {kind} is not compared: a compared value may hold {PLAIN_VALUES}"


def snapshot(value: object, path: str = "value") -> object:
    """A detached copy that later in-place updates (or graph replays) cannot change, in the
    same structure; TypeError naming the path of a leaf that cannot be compared, ValueError
    where no walk can finish the value (``check_bounds``)."""
    check_bounds(value, path)
    return _rebuild(value, path, lambda _, tensor: tensor.detach().clone(), refuse=True)


def cloned(value: Any) -> Any:
    """``value`` with every tensor cloned (autograd kept), in the same structure; other leaves
    are kept as they are."""
    check_bounds(value)
    return _rebuild(value, "", lambda _, tensor: tensor.clone(), refuse=False)


def with_tensor(value: Any, path: str, tensor: torch.Tensor) -> Any:
    """``value`` in the same structure, the tensor at ``path`` (as ``tensors`` names it)
    replaced by ``tensor``, every other leaf kept as it is; KeyError for a path it lacks."""
    if path not in {found for found, _ in tensors(value)}:
        raise KeyError(f"no tensor at {path!r}")
    return _rebuild(value, "", lambda at, old: tensor if at == path else old, refuse=False)


def compared_elements(value: object, path: str = "value") -> int:
    """How many computed values a comparison of ``value`` compares: the elements of its
    tensors; in a value that holds no tensor, its numbers (ints, floats, complex numbers and
    bools, each compared by value: a ``.item()``, a list of sampled tokens). Never counted:
    strings, bytes, None, enums, dtypes and devices, which are labels compared with ``==``,
    nor numbers beside tensors, which are the host's bookkeeping (a step count, a length)
    that comes out alike whether or not a graph ran. 0 means nothing was compared."""
    import torch

    check_bounds(value, path)
    leaves = [leaf for _, leaf in _leaves(value, path)]
    counts = [leaf.numel() for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if counts:
        return sum(counts)
    numbers = (bool, int, float, complex)
    return sum(isinstance(leaf, numbers) and not isinstance(leaf, enum.Enum) for leaf in leaves)


def _rebuild(
    value: Any, path: str, copy_tensor: Callable[[str, torch.Tensor], torch.Tensor], refuse: bool
) -> Any:
    import torch

    if refuse and (why := unsupported(value)):
        raise TypeError(f"{path}: {why}")
    if isinstance(value, torch.Tensor):
        return copy_tensor(path or "input", value)
    container = node(value)
    if container is None:
        return value
    items = {
        key: _rebuild(item, child_path(path, container, key), copy_tensor, refuse)
        for key, item in container.items
    }
    if container.kind == MAPPING:
        return items
    if _is_named_tuple(value):
        return type(value)(*items.values())
    if container.kind == SEQUENCE:
        return tuple(items.values()) if isinstance(value, tuple) else list(items.values())
    if isinstance(value, types.SimpleNamespace):
        return types.SimpleNamespace(**items)
    rebuilt = copy.copy(value)  # a dataclass: fields replaced, frozen or with slots alike
    for name, item in items.items():
        object.__setattr__(rebuilt, name, item)
    return rebuilt


def _is_named_tuple(value: object) -> bool:
    return isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple)


def _plain_types() -> tuple[type, ...]:
    import torch

    return (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device)
