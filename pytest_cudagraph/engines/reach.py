"""The tensors a callable holds, by path, and which of them changed storage between two looks.

A CUDA graph reads and writes the addresses it was captured on, so a tensor the code replaces
(``self.cache = torch.zeros(...)``) instead of copying into leaves the graph on the old
memory. ``reachable_tensors(root, name)`` walks what ``root`` holds: a function's closure and
the module globals its code names, a bound method's object, ``functools.partial``'s parts, an
object's attributes (its ``__dict__`` and slots), a module's parameters, buffers and
submodules, mappings, lists, tuples, deques and sets, the results an ``lru_cache`` keeps and
each thread's attributes of a ``threading.local``; it stops at torch's and the standard
library's other objects (graphs, streams, locks, compiled code), at classes and at Python
modules. ``storages`` takes where each tensor's storage lies; ``rebound(before, after)`` lists
the paths whose storage moved. ``Alive`` holds the tensors alive at a moment (a capture's end).
torch is imported when used.
"""

from __future__ import annotations

import collections
import functools
import gc
import inspect
import sys
import threading
import types
import weakref
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


def reachable_generators(root: object, name: str) -> dict[str, torch.Generator]:
    """Every ``torch.Generator`` ``root`` holds (a sampler's own), by its first path from
    ``name``: what code draws random numbers from besides torch's default generators."""
    import torch

    walk = _Walk(None, kind=torch.Generator)
    walk.visit(root, name, 0)
    return walk.found  # type: ignore[return-value]


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


class Alive:
    """The tensor objects alive at the moments ``record`` was called (weakly held: a tensor
    freed since is not mistaken for a new one at its address)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self._tensors: dict[int, weakref.ref[torch.Tensor]] = {}

    def __len__(self) -> int:
        return sum(ref() is not None for ref in self._tensors.values())

    def record(self) -> None:
        """Add every tensor alive now (on ``device`` when given), found by the garbage
        collector: those no walk from the code reaches yet included (a capture's locals)."""
        import torch

        for value in gc.get_objects():
            # By type alone: isinstance would read ``__class__``, which some objects compute.
            if issubclass(type(value), torch.Tensor) and (
                self.device is None or value.device == self.device
            ):
                self._tensors[id(value)] = weakref.ref(value)

    def __contains__(self, tensor: object) -> bool:
        ref = self._tensors.get(id(tensor))
        return ref is not None and ref() is tensor


class _Walk:
    """One walk: the tensors found, the objects entered (by id: each once)."""

    def __init__(self, device: torch.device | None, kind: type | None = None) -> None:
        self.device = device
        self.kind = kind  # what it looks for: tensors by default
        self.found: dict[str, torch.Tensor] = {}
        self.seen: set[int] = set()

    def visit(self, value: object, path: str, depth: int) -> None:
        import torch

        if self.kind is not None and isinstance(value, self.kind):
            self.found.setdefault(path, value)  # type: ignore[arg-type]
            return
        if isinstance(value, torch.Tensor):
            if self.kind is None and (self.device is None or value.device == self.device):
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
    elif isinstance(value, (list, tuple, collections.deque)):
        yield from ((f"{path}[{index}]", item) for index, item in enumerate(list(value)))
    elif isinstance(value, (set, frozenset)):
        yield from ((f"{path}{{{index}}}", item) for index, item in enumerate(list(value)))
    elif isinstance(value, functools.partial):
        yield f"{path}.func", value.func
        yield from ((f"{path}.args[{index}]", item) for index, item in enumerate(value.args))
        yield from ((f"{path}.keywords[{key!r}]", item) for key, item in value.keywords.items())
    elif isinstance(value, types.MethodType):
        yield path, value.__self__  # a bound method's attributes read as its own
        yield from _globals_named(value.__func__)
    elif isinstance(value, types.FunctionType):
        if _foreign(value.__module__):
            return
        cells = value.__closure__ or ()
        for variable, cell in zip(value.__code__.co_freevars, cells, strict=True):
            try:
                yield f"{path}.{variable}", cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
        yield from _globals_named(value)
    elif _is_lru_cache(value):
        yield f"{path}.__wrapped__", getattr(value, "__wrapped__", None)
        yield from ((f"{path}(cached {index})", item) for index, item in _cached(value))
    elif isinstance(value, threading.local):
        for index, attributes in enumerate(_per_thread(value)):
            yield from ((f"{path}[thread {index}].{a}", item) for a, item in attributes.items())
    elif isinstance(value, torch.nn.Module):
        for attribute, tensor in value.named_parameters(recurse=False):
            yield f"{path}.{attribute}", tensor
        for attribute, buffer in value.named_buffers(recurse=False):
            yield f"{path}.{attribute}", buffer
        for attribute, module in value.named_children():
            yield f"{path}.{attribute}", module
        if not _foreign(type(value).__module__):  # a user's module: its own attributes too
            yield from _attributes(value, path, skip=_module_internals())
            yield from _globals_named(type(value).forward)
    elif isinstance(value, (type, types.ModuleType)) or _foreign(type(value).__module__):
        return
    else:
        yield from _attributes(value, path, skip=frozenset())
        yield from _globals_named(inspect.getattr_static(type(value), "__call__", None))


def _globals_named(function: object) -> Iterator[tuple[str, object]]:
    """The module globals ``function``'s code names (nested code included), each by its
    module-qualified name; none for torch's or the standard library's code, or what is not a
    Python function."""
    if not isinstance(function, types.FunctionType) or _foreign(function.__module__):
        return
    names: set[str] = set()
    codes = [function.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    found = function.__globals__
    for name in sorted(names & found.keys()):
        yield f"{function.__module__}.{name}", found[name]


def _is_lru_cache(value: object) -> bool:
    """Whether ``value`` is a user's function wrapped by ``functools.lru_cache`` (or
    ``cache``)."""
    wrapped = getattr(value, "__wrapped__", None)
    return callable(getattr(value, "cache_info", None)) and not _foreign(
        getattr(wrapped, "__module__", None)
    )


def _cached(wrapper: object) -> Iterator[tuple[int, object]]:
    """The results (and arguments) an ``lru_cache`` keeps, which it shows only to the garbage
    collector: an unbounded cache's dict, a bounded cache's entries."""
    own = getattr(wrapper, "__dict__", None)
    found: list[object] = []
    for referent in gc.get_referents(wrapper):
        if referent is own or isinstance(referent, (type, types.FunctionType)):
            continue
        found += list(referent.values()) if isinstance(referent, dict) else [referent]
    yield from enumerate(found)


def _per_thread(local: threading.local) -> list[dict[str, object]]:
    """Each thread's attributes of a ``threading.local`` (``vars`` shows only this thread's):
    the dicts it keeps per thread, keyed by a weak reference, which it shows only to the
    garbage collector."""
    for referent in gc.get_referents(local):
        if (
            isinstance(referent, dict)
            and referent
            and all(isinstance(key, weakref.ref) for key in referent)
        ):
            return [attributes for attributes in referent.values() if isinstance(attributes, dict)]
    return [vars(local)]


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
