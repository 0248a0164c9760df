"""The tensors a callable holds, by path, and which of them changed storage between two looks.

A CUDA graph reads and writes the addresses it was captured on, so a tensor the code replaces
(``self.cache = torch.zeros(...)``) instead of copying into leaves the graph on the old
memory. ``reachable_tensors(root, name)`` walks what ``root`` holds: a function's closure, a
bound method's object, ``functools.partial``'s parts, an object's attributes (its ``__dict__``
and slots), a module's parameters, buffers and submodules, and mappings, lists and tuples; it
stops at torch's and the standard library's own objects (graphs, streams, locks, compiled
code), at classes and at Python modules. ``storages`` takes where each tensor's storage lies;
``rebound(before, after)`` lists the paths whose storage moved. torch is imported when used.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_DEPTH = 24
MAX_OBJECTS = 100_000  # a walk past this many objects stops (``Reach.truncated``)
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, range)
_FOREIGN = ("torch", "builtins", *sys.stdlib_module_names)


@dataclass(frozen=True)
class Reach:
    """What a walk found: path -> tensor, and whether it stopped at ``MAX_OBJECTS``."""

    tensors: dict[str, torch.Tensor]
    truncated: bool = False


@dataclass(frozen=True)
class Rebinding:
    """A path whose tensor lies in other memory than it did."""

    path: str
    before: int
    after: int

    def describe(self) -> str:
        return (
            f"{self.path} was rebound: its storage moved from {self.before:#x} to "
            f"{self.after:#x} (a graph captured on the old storage keeps reading it)"
        )


def reachable_tensors(root: object, name: str, *, device: torch.device | None = None) -> Reach:
    """Every tensor ``root`` holds (on ``device`` when given), by its first path from
    ``name``."""
    walk = _Walk(device)
    walk.visit(root, name, 0)
    return Reach(walk.found, truncated=len(walk.seen) > MAX_OBJECTS)


def storages(tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """path -> the address of its tensor's storage (tensors without storage left out)."""
    return {
        path: tensor.untyped_storage().data_ptr()
        for path, tensor in tensors.items()
        if tensor.layout == _strided() and tensor.untyped_storage().nbytes() > 0
    }


def rebound(before: Mapping[str, int], after: Mapping[str, int]) -> list[Rebinding]:
    """Each path in both looks whose storage lies elsewhere in the second."""
    return [
        Rebinding(path, address, after[path])
        for path, address in before.items()
        if path in after and after[path] != address
    ]


class _Walk:
    """One walk: the tensors found, the objects entered (by id: each once)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.found: dict[str, torch.Tensor] = {}
        self.seen: set[int] = set()

    def visit(self, value: object, path: str, depth: int) -> None:
        import torch

        if isinstance(value, torch.Tensor):
            if self.device is None or value.device == self.device:
                self.found.setdefault(path, value)
            return
        if isinstance(value, _LEAVES) or depth > MAX_DEPTH or id(value) in self.seen:
            return
        if len(self.seen) > MAX_OBJECTS:
            return
        self.seen.add(id(value))
        for child_path, child in _children(value, path):
            self.visit(child, child_path, depth + 1)


def _children(value: object, path: str) -> Iterator[tuple[str, object]]:
    """(path, child) of what ``value`` holds; nothing for what the walk does not enter."""
    import torch

    if isinstance(value, Mapping):
        yield from ((f"{path}[{key!r}]", item) for key, item in list(value.items()))
    elif isinstance(value, (list, tuple)):
        yield from ((f"{path}[{index}]", item) for index, item in enumerate(list(value)))
    elif isinstance(value, functools.partial):
        yield f"{path}.func", value.func
        yield from ((f"{path}.args[{index}]", item) for index, item in enumerate(value.args))
        yield from ((f"{path}.keywords[{key!r}]", item) for key, item in value.keywords.items())
    elif isinstance(value, types.MethodType):
        yield path, value.__self__  # a bound method's attributes read as its own
    elif isinstance(value, types.FunctionType):
        if _foreign(value.__module__):
            return
        cells = value.__closure__ or ()
        for variable, cell in zip(value.__code__.co_freevars, cells, strict=True):
            try:
                yield f"{path}.{variable}", cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
    elif isinstance(value, torch.nn.Module):
        for attribute, tensor in value.named_parameters(recurse=False):
            yield f"{path}.{attribute}", tensor
        for attribute, buffer in value.named_buffers(recurse=False):
            yield f"{path}.{attribute}", buffer
        for attribute, module in value.named_children():
            yield f"{path}.{attribute}", module
        if not _foreign(type(value).__module__):  # a user's module: its own attributes too
            yield from _attributes(value, path, skip=_module_internals())
    elif isinstance(value, (type, types.ModuleType)) or _foreign(type(value).__module__):
        return
    else:
        yield from _attributes(value, path, skip=frozenset())


def _attributes(value: object, path: str, *, skip: frozenset[str]) -> Iterator[tuple[str, object]]:
    """An object's attributes (its ``__dict__`` and slots) but those named in ``skip``."""
    names = list(getattr(value, "__dict__", {}))
    for klass in type(value).__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    for attribute in dict.fromkeys(names):
        if attribute in ("__dict__", "__weakref__") or attribute in skip:
            continue
        try:
            yield f"{path}.{attribute}", object.__getattribute__(value, attribute)
        except AttributeError:  # an empty slot
            continue


def _foreign(module: str | None) -> bool:
    """Whether code of this module is torch's or the standard library's (not walked)."""
    return (module or "builtins").partition(".")[0] in _FOREIGN


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes every torch.nn.Module has (its parameter, buffer and hook tables), walked
    by name (parameters, buffers, children) rather than as attributes."""
    import torch

    return frozenset(vars(torch.nn.Module()))


def _strided() -> torch.layout:
    import torch

    return torch.strided
