"""One walker over nested outputs and inputs: the containers every engine and check looks into.

What counts as a container is decided here once (``node``): mappings, sequences (tuples, named
tuples, lists), dataclass instances and ``SimpleNamespace``. ``tensors`` yields each tensor with
its path, ``snapshot`` copies a value so that later in-place writes cannot reach the copy,
``cloned`` does the same keeping autograd, ``with_tensor`` swaps one tensor for another,
``element_count`` says how much a comparison of the value compares, and ``unsupported`` names
a leaf that cannot be compared. torch is imported
when used.
"""

from __future__ import annotations

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
    "tuples, lists, dicts, dataclasses and SimpleNamespaces"
)
_TEXT = (str, bytes, bytearray, memoryview)


@dataclasses.dataclass(frozen=True)
class Node:
    """A container: its kind (MAPPING, SEQUENCE or ATTRIBUTES) and its (key, child) pairs, the
    key being a mapping key, an index or an attribute name."""

    kind: str
    items: tuple[tuple[Any, Any], ...]


def node(value: Any) -> Node | None:
    """``value`` as a container; None for a leaf (a tensor, a number, any other object)."""
    import torch

    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, Mapping):
        return Node(MAPPING, tuple(value.items()))
    if _is_named_tuple(value):
        return Node(SEQUENCE, tuple(zip(value._fields, value, strict=True)))
    if isinstance(value, Sequence) and not isinstance(value, _TEXT):
        return Node(SEQUENCE, tuple(enumerate(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return Node(ATTRIBUTES, tuple((field.name, getattr(value, field.name)) for field in fields))
    if isinstance(value, types.SimpleNamespace):
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


def tensors(value: object, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for each tensor in a value. With an empty path, names read as call
    arguments: "input" for a lone tensor, "args[0]" positionally, the keyword otherwise."""
    import torch

    if isinstance(value, torch.Tensor):
        yield path or "input", value
        return
    container = node(value)
    if container is not None:
        for key, item in container.items:
            yield from tensors(item, child_path(path, container, key))


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
    same structure; TypeError naming the path of a leaf that cannot be compared."""
    return _rebuild(value, path, lambda _, tensor: tensor.detach().clone(), refuse=True)


def cloned(value: Any) -> Any:
    """``value`` with every tensor cloned (autograd kept), in the same structure; other leaves
    are kept as they are."""
    return _rebuild(value, "", lambda _, tensor: tensor.clone(), refuse=False)


def with_tensor(value: Any, path: str, tensor: torch.Tensor) -> Any:
    """``value`` in the same structure, the tensor at ``path`` (as ``tensors`` names it)
    replaced by ``tensor``, every other leaf kept as it is; KeyError for a path it lacks."""
    if path not in {found for found, _ in tensors(value)}:
        raise KeyError(f"no tensor at {path!r}")
    return _rebuild(value, "", lambda at, old: tensor if at == path else old, refuse=False)


def element_count(value: object) -> int:
    """How many values a comparison of ``value`` compares: every tensor's elements, and each
    leaf that is not None."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel()
    container = node(value)
    if container is None:
        return int(value is not None)
    return sum(element_count(item) for _, item in container.items)


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
