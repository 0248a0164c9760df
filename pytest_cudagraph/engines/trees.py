"""One walker over nested outputs and inputs: tensors inside tuples, lists and dicts.

Every engine and check that looks inside a structured value goes through here, so that what
counts as a container is decided once: ``tensors`` yields each tensor with its path, ``snapshot``
copies a value so that later in-place writes cannot reach the copy, ``cloned`` does the same
keeping tuples as tuples. torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def tensors(value: object, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for each tensor in a value. With an empty path, names read as call
    arguments: "input" for a lone tensor, "args[0]" positionally, the keyword otherwise."""
    import torch

    if isinstance(value, torch.Tensor):
        yield path or "input", value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from tensors(item, f"{path}[{key!r}]" if path else str(key))
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from tensors(item, f"{path or 'args'}[{index}]")


def snapshot(value: object) -> object:
    """A copy that later in-place updates (or graph replays) cannot change; sequences become
    lists."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [snapshot(item) for item in value]
    return value


def cloned(value: Any) -> Any:
    """``value`` with every tensor cloned, in the same structure (a tuple stays a tuple)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, Mapping):
        return {key: cloned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [cloned(item) for item in value]
    if isinstance(value, tuple):
        return tuple(cloned(item) for item in value)
    return value
