"""The state code keeps between calls, by path: read it, write it back in place, compare two.

A root is a torch.nn.Module, a tensor, a numpy array, a namespace (SimpleNamespace,
argparse.Namespace, a dataclass) or an object holding state (a runner), or a dict, list or
tuple of them (paths then start at their keys). Its pieces, each of a kind (``KINDS``): a
module's parameters, buffers and ``training``; every public attribute of a module or object
that is a tensor, an array, a number, or a list, tuple, dict or namespace holding any of them
(serving engines keep positions in Python lists); numbers and such containers in a root's
dict or list. Any other attribute (a string, a function, a config, a lock) is not state; but
inside state a value that cannot be compared or copied is a TypeError, and one a walk cannot
finish (``trees.check_bounds``) a ValueError, each naming its path. ``module_state`` copies,
``state_view`` reads, ``load_state`` writes in place (tensors and arrays copied into, numbers
set, containers written into); ``state_differences`` and ``written_paths`` compare;
``state_identity``, ``tensor_addresses`` and ``shared_state`` say where state lives.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.compare import (
    Mismatch,
    compare_outputs,
    pending_comparison,
    settle_comparisons,
)

if TYPE_CHECKING:
    import torch

Kind = Literal["parameter", "buffer", "mode", "flag", "number", "tensor", "array", "container"]
# parameter: an nn.Parameter; buffer: a registered buffer; mode: a module's ``training``; flag:
# any other bool; number; tensor: any other tensor; array: a numpy array; container: a list,
# tuple, dict or namespace holding state.
KINDS: tuple[Kind, ...] = (
    "parameter",
    "buffer",
    "mode",
    "flag",
    "number",
    "tensor",
    "array",
    "container",
)
NUMBERS = (bool, int, float, complex)
NAMESPACES = (types.SimpleNamespace, argparse.Namespace)  # dataclass instances besides
STATE_VALUES = (
    "tensors, numeric numpy arrays and numbers, with strings, bytes, None, enums, torch dtypes "
    "and devices beside them, in lists, tuples, dicts, namespaces and dataclasses"
)


@dataclass(frozen=True)
class _Slot:
    """One piece of state: ``owner``'s attribute ``name`` (a module's, a namespace's, an
    object's) or its entry ``name`` (a dict, list or tuple given as a root), or, without an
    owner, ``root`` itself (a tensor or an array given as a root). ``at`` names the owner."""

    kind: Kind
    owner: Any
    name: Any = None
    root: object = None
    at: str = ""

    def read(self) -> object:
        if self.owner is None:
            return self.root
        if _keyed(self.owner):
            return self.owner[self.name]
        return getattr(self.owner, self.name)

    def write(self, value: object) -> None:
        if _keyed(self.owner):
            self.owner[self.name] = value
        else:
            setattr(self.owner, self.name, value)


def module_state(root: object) -> dict[str, object]:
    """path -> a copy of each piece of state under ``root``."""
    return {path: _copied(slot.read()) for path, slot in _slots(root)}


def state_view(root: object) -> dict[str, object]:
    """path -> each piece of state under ``root`` as it is (no copy: later writes show)."""
    return {path: slot.read() for path, slot in _slots(root)}


def state_kinds(root: object) -> dict[str, Kind]:
    """path -> the kind of each piece of state under ``root`` (see ``KINDS``), in walk order."""
    return {path: slot.kind for path, slot in _slots(root)}


def state_size(root: object) -> int:
    """How many pieces of state ``root`` holds (0: nothing to keep in step)."""
    return len(_slots(root))


def state_identity(root: object) -> dict[str, int]:
    """path -> where each piece lives: a tensor's storage address, an array's memory address,
    a container's id, for a number the id of what holds it. Two reads of the same state agree
    on every path; a path that differs between two reads means one of them is a copy. Hold
    both reads while comparing: a freed object's address or id is given out again."""
    return {path: _identity(slot) for path, slot in _slots(root)}


def load_state(
    root: object, state: Mapping[str, object], paths: Iterable[str] | None = None
) -> None:
    """Write ``state`` (a ``module_state`` of roots alike) into ``root`` in place: every path,
    or only ``paths``. ValueError, before anything is written, when a path is missing (the
    state's paths must be the root's when ``paths`` is None; each of ``paths`` must be both's)
    or a tensor's or array's shape or dtype differs (a list, dict or namespace may differ in
    length: it is given the state's)."""
    import torch

    slots = dict(_slots(root))
    chosen = _chosen(slots, state, paths)
    for path in chosen:
        slot = slots[path]
        _check_fits(slot.read(), state[path], path, _settable(slot.owner))
    with torch.no_grad():
        for path in chosen:
            slot = slots[path]
            _write(slot.read(), state[path], slot.write)


def state_differences(
    expected: Mapping[str, object],
    actual: Mapping[str, object],
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    sides: tuple[str, str] = ("eager", "graphed"),
) -> list[Mismatch]:
    """Every difference between two states (``module_state`` or ``state_view``), each named by
    its path (and the index where a tensor or array of it differs). An empty list or dict one
    state has where the other has nothing is no difference: empty, it looked like state (a
    history yet to be appended to), while the other side's filled with what is not (a
    runner's ``graphs = {}``, holding its graphs)."""
    expected, actual = _without_one_sided_empties(expected, actual)
    return compare_outputs(
        _comparable_state(expected),
        _comparable_state(actual),
        atol=atol,
        rtol=rtol,
        path="state",
        sides=sides,
    )


def written_paths(before: Mapping[str, object], after: Mapping[str, object]) -> set[str]:
    """The paths whose value differs between two ``module_state`` snapshots taken around a
    call (exactly, NaN equal to NaN), and those only one of them has: what the call wrote."""
    before, after = _without_one_sided_empties(before, after)
    first, second = _comparable_state(before), _comparable_state(after)
    common = [path for path in first if path in second]
    pending = [pending_comparison(first[path], second[path], path=path) for path in common]
    settled = settle_comparisons(pending)
    changed = {path for path, found in zip(common, settled, strict=True) if found}
    return changed | (before.keys() ^ after.keys())


def tensor_addresses(root: object) -> dict[str, int]:
    """path -> where the storage of each tensor of the state lies (containers' items too)."""
    return {
        path: tensor.untyped_storage().data_ptr()
        for path, tensor in trees.tensors(state_view(root), "state")
    }


def shared_state(first: object, second: object, *, objects: bool = True) -> list[str]:
    """What two roots hold in common, each named by its path under both: the same module or
    object holding state, a tensor's storage or an array's memory, and with ``objects`` the
    same list, dict or namespace (``shared_objects``). Parameters and numbers aside: weights
    two sides share are read, not written, and equal numbers are values, not places."""
    owners = {id(owner): at for at, owner in _owners(first)}
    found = [
        f"the {_noun(owner)} at {owners[id(owner)]!r} is the one at {at!r}"
        for at, owner in _owners(second)
        if id(owner) in owners and (objects or isinstance(owner, _module_type()))
    ]
    held = {place: path for path, place, _ in _places(first)}
    found += [
        f"{held[place]} and {path} {verb}"
        for path, place, verb in _places(second)
        if place in held and (objects or place[0] != "object")
    ]
    return found


def shared_objects(first: object, second: object) -> list[tuple[str, str]]:
    """(its path under ``first``, under ``second``) of each list, dict, namespace or object
    holding state the two roots hold in common: shared state where a call writes it, a shared
    read-only configuration where none does."""
    held = {place: path for path, place, _ in _places(first) if place[0] == "object"}
    return [(held[place], path) for path, place, _ in _places(second) if place in held]


def _module_type() -> type:
    import torch

    return torch.nn.Module


def _slots(root: object) -> list[tuple[str, _Slot]]:
    """(path, slot) of every piece of state under ``root``, in a fixed order."""
    trees.check_bounds(root, "state")
    return list(_root_slots(root, ""))


def _root_slots(root: object, at: str) -> Iterator[tuple[str, _Slot]]:
    import torch

    if isinstance(root, torch.nn.Module):
        yield from _module_slots(root, at)
    elif isinstance(root, torch.Tensor) or _is_array(root):
        kind = _piece_kind(root, at)
        if kind is None:
            raise TypeError(f"{at or 'the root'}: {_describe(root)} is not state")
        yield at or ("array" if kind == "array" else "tensor"), _Slot(kind, None, root=root)
    elif isinstance(root, (Mapping, list, tuple)):
        yield from _entry_slots(root, at)
    elif _holds_attributes(root):
        yield from _attribute_slots(root, at)
    else:
        raise TypeError(
            "state lives in a torch.nn.Module, a tensor, an array, a namespace or an object "
            f"holding state, or a dict, list or tuple of them; got {type(root).__name__}"
        )


def _entry_slots(root: object, at: str) -> Iterator[tuple[str, _Slot]]:
    """A root's dict, list or tuple: each entry a root again, or a piece it holds."""
    for key, item in _entries(root).items():
        path = f"{at}.{key}" if at else str(key)
        if _is_root(item):
            yield from _root_slots(item, path)
        elif kind := _piece_kind(item, path):
            yield path, _Slot(kind, root, key, at=at or "(root)")
        else:
            raise TypeError(
                f"{path} must be a torch.nn.Module, a tensor, an array, a namespace, an object "
                f"holding state, a number or a container of them, got {type(item).__name__}"
            )


def _attribute_slots(holder: object, at: str) -> Iterator[tuple[str, _Slot]]:
    """A namespace's or an object's public attributes: modules walked, pieces kept."""
    import torch

    prefix = f"{at}." if at else ""
    for name, value in _attributes(holder):
        if isinstance(value, torch.nn.Module):
            yield from _module_slots(value, prefix + name)
        elif kind := _piece_kind(value, prefix + name):
            yield prefix + name, _Slot(kind, holder, name, at=at or "(root)")


def _module_slots(root: torch.nn.Module, at: str) -> Iterator[tuple[str, _Slot]]:
    for name, module in root.named_modules():
        path = f"{at}.{name}" if at and name else at or name
        prefix = f"{path}." if path else ""
        where = f"{at}.{name or '(root)'}" if at else name or "(root)"
        for attribute, _ in module.named_parameters(recurse=False):
            yield prefix + attribute, _Slot("parameter", module, attribute, at=where)
        for attribute, _ in module.named_buffers(recurse=False):
            yield prefix + attribute, _Slot("buffer", module, attribute, at=where)
        for attribute, value in vars(module).items():
            if attribute.startswith("_"):
                continue
            kind = "mode" if attribute == "training" else _piece_kind(value, prefix + attribute)
            if kind is not None:
                yield prefix + attribute, _Slot(kind, module, attribute, at=where)


def _piece_kind(value: object, path: str) -> Kind | None:
    """The kind of ``value`` as an attribute or entry at ``path``; None where it is not state.
    TypeError where it is, but holds something that cannot be compared or copied."""
    import torch

    if isinstance(value, torch.nn.Parameter):
        return "parameter"
    if isinstance(value, torch.Tensor):
        return "tensor"
    if _is_array(value):
        return "array" if _numeric(value) else None
    if isinstance(value, bool):
        return "flag"
    if _is_number(value):
        return "number"
    return "container" if _is_state_container(value, path) else None


def _is_state_container(value: object, path: str) -> bool:
    """Whether ``value`` is a container of state: a list, tuple, dict or namespace holding a
    tensor, an array or a number (a frozen dataclass only a tensor or an array: one of numbers
    is a configuration), or an empty list, dict or namespace (yet to be filled)."""
    if not _is_container(value):
        return False
    found = list(trees.walk(value, path))
    leaves = [item for _, item in found if _is_state_leaf(item)]
    if not leaves:
        return _resizable(value) and not _entries(value)
    if _is_frozen(value) and all(_is_number(leaf) for leaf in leaves):
        return False
    for where, item in found:
        why = _refusal(item)
        if why:
            raise TypeError(f"{where}: {why}")
    return True


def _refusal(value: object) -> str:
    """Why state cannot hold ``value`` ("" when it can)."""
    import torch

    if isinstance(value, torch.Tensor):
        return trees.unsupported(value)
    if _is_array(value):
        return "" if _numeric(value) else f"an array of dtype {value.dtype} is not compared"
    if _is_container(value) or _is_number(value) or _is_label(value):
        return ""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return f"a {kind} in state cannot be compared or copied: state may hold {STATE_VALUES}"


def _is_root(value: object) -> bool:
    """Whether an entry of a root's container is a root itself: a module, tensor, array,
    namespace or object, or a container holding one (an empty one too)."""
    import torch

    if isinstance(value, (torch.nn.Module, torch.Tensor)) or _is_array(value):
        return True
    if isinstance(value, (Mapping, list, tuple)):
        entries = _entries(value).values()
        return not entries or any(_is_root(entry) for entry in entries)
    return _holds_attributes(value)


def _holds_attributes(value: object) -> bool:
    """A namespace, a dataclass instance or an object with attributes of its own (not a
    class, function or module)."""
    if isinstance(value, type) or inspect.isroutine(value) or inspect.ismodule(value):
        return False
    return hasattr(value, "__dict__") or dataclasses.is_dataclass(value)


def _attributes(holder: object) -> list[tuple[str, object]]:
    container = trees.node(holder)  # a dataclass's fields, a namespace's attributes
    items = container.items if container is not None else tuple(vars(holder).items())
    return [(name, value) for name, value in items if not name.startswith("_")]


def _is_array(value: object) -> TypeGuard[Any]:
    numpy = sys.modules.get("numpy")  # an array exists only once numpy is imported
    return numpy is not None and isinstance(value, numpy.ndarray)


def _numeric(array: Any) -> bool:
    return array.dtype.kind in "biufc"


def _is_number(value: object) -> bool:
    return isinstance(value, NUMBERS) and not isinstance(value, enum.Enum)


def _is_label(value: object) -> bool:
    """A value state holds beside its numbers, compared with ``==`` (a name, a dtype)."""
    import torch

    return isinstance(value, (str, bytes, type(None), enum.Enum, torch.dtype, torch.device))


def _is_state_leaf(value: object) -> bool:
    import torch

    return isinstance(value, torch.Tensor) or _is_array(value) or _is_number(value)


def _is_container(value: object) -> bool:
    """A container state may be: a list, tuple, dict, namespace or dataclass instance."""
    if isinstance(value, (dict, list, tuple, *NAMESPACES)):
        return True
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _is_frozen(value: object) -> bool:
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(getattr(params, "frozen", False))


def _mutable(value: object) -> bool:
    """A container whose entries can be set: any but a tuple or a frozen dataclass."""
    return _is_container(value) and not isinstance(value, tuple) and not _is_frozen(value)


def _resizable(container: object) -> bool:
    """Whether entries can be added and removed: a list, dict or namespace."""
    return isinstance(container, (dict, list, *NAMESPACES))


def _settable(owner: object) -> bool:
    """Whether ``owner``'s entries or attributes can be set (no owner: a root written in
    place)."""
    if owner is None:
        return True
    if _keyed(owner):
        return isinstance(owner, (dict, list))
    return not _is_frozen(owner)


def _keyed(owner: object) -> bool:
    return isinstance(owner, (Mapping, list, tuple))


def _entries(container: object) -> dict[Any, Any]:
    """A list's or tuple's items by index, a dict's by key, a namespace's or dataclass's
    attributes by name (nothing for anything else)."""
    if isinstance(container, Mapping):
        return dict(container)
    if isinstance(container, (list, tuple)):
        return dict(enumerate(container))
    found = trees.node(container) if _is_container(container) else None
    return dict(found.items) if found is not None else {}


def _entry_path(path: str, container: object, key: object) -> str:
    return f"{path}[{key!r}]" if _keyed(container) else f"{path}.{key}"


def _rebuilt(value: Any, each: Callable[[Any], Any]) -> Any:
    """``value`` as a new container of the same kind, ``each`` applied to every entry; a leaf
    as it is."""
    container = trees.node(value)
    if container is None:
        return value
    items = {key: each(item) for key, item in container.items}
    if isinstance(value, Mapping):
        return items
    if _is_named_tuple(value):
        return type(value)(*items.values())
    if isinstance(value, tuple):
        return tuple(items.values())
    if container.kind == trees.SEQUENCE:
        return list(items.values())
    rebuilt = copy.copy(value)  # a namespace or a dataclass: its attributes replaced
    for name, item in items.items():
        object.__setattr__(rebuilt, name, item)
    return rebuilt


def _is_named_tuple(value: object) -> bool:
    return isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple)


def _copied_type(container: object) -> type:
    """The type a copy of ``container`` has (``_rebuilt``): a dict, a list, a tuple, or its own
    (a named tuple, a namespace, a dataclass)."""
    for kept in (dict, list):
        if isinstance(container, kept):
            return kept
    if isinstance(container, tuple) and not _is_named_tuple(container):
        return tuple
    return type(container)


def _copied(value: object) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if _is_array(value):
        return value.copy()
    return _rebuilt(value, _copied)


def _comparable(value: object) -> object:
    """``value`` with each numeric array as a tensor (the comparison knows tensors)."""
    import torch

    if _is_array(value) and _numeric(value):
        return torch.tensor(value)
    return _rebuilt(value, _comparable)


def _without_one_sided_empties(
    first: Mapping[str, object], second: Mapping[str, object]
) -> tuple[dict[str, object], dict[str, object]]:
    """Both states without the paths only one has where its value is an empty container."""

    def empty(value: object) -> bool:
        return _is_container(value) and not _entries(value)

    one_sided = first.keys() ^ second.keys()
    dropped = {path for path in one_sided if empty(first.get(path, second.get(path)))}
    return (
        {path: value for path, value in first.items() if path not in dropped},
        {path: value for path, value in second.items() if path not in dropped},
    )


def _comparable_state(state: Mapping[str, object]) -> dict[str, object]:
    trees.check_bounds(dict(state), "state")  # _comparable recurses
    return {path: _comparable(value) for path, value in state.items()}


def _chosen(
    slots: Mapping[str, _Slot], state: Mapping[str, object], paths: Iterable[str] | None
) -> list[str]:
    """The paths ``load_state`` writes; ValueError naming those it cannot."""
    if paths is None:
        if slots.keys() != state.keys():
            missing = sorted(slots.keys() - state.keys())
            extra = sorted(state.keys() - slots.keys())
            raise ValueError(
                f"the state does not fit the modules: paths {missing} missing, {extra} not theirs"
            )
        return list(slots)
    if isinstance(paths, str):
        raise TypeError(f"paths must be a collection of paths, got the string {paths!r}")
    chosen = list(dict.fromkeys(paths))
    not_root = [path for path in chosen if path not in slots]
    not_state = [path for path in chosen if path not in state]
    if not_root or not_state:
        raise ValueError(
            f"paths to write must be the root's and the state's: {not_root} not the root's, "
            f"{not_state} not in the state"
        )
    return chosen


def _check_fits(there: object, value: object, path: str, settable: bool) -> None:
    """ValueError naming ``path`` when ``value`` cannot be written into ``there`` in place
    (``settable``: whether what holds ``there`` can take a new number or label)."""
    import torch

    if isinstance(there, torch.Tensor) or _is_array(there):
        if not _alike(there, value):
            raise ValueError(f"{path}: {_describe(value)} does not fit {_describe(there)}")
    elif _is_container(there):
        _check_container_fits(there, value, path)
    elif _is_number(there) and not _is_number(value):
        raise ValueError(f"{path}: {_describe(value)} is not a number")
    elif not (_is_number(value) or _is_label(value)):
        raise ValueError(f"{path}: {_describe(value)} does not fit {_describe(there)}")
    elif not settable and not _same_leaf(there, value):
        raise ValueError(f"{path}: {_describe(value)} cannot be set where {there!r} is held")


def _alike(there: Any, value: Any) -> bool:
    """Whether ``value`` is a tensor (an array) of the shape and dtype of the tensor (the array)
    ``there``."""
    import torch

    if isinstance(value, torch.Tensor) != isinstance(there, torch.Tensor):
        return False
    if _is_array(value) != _is_array(there):
        return False
    return bool((value.shape, value.dtype) == (there.shape, there.dtype))


def _check_container_fits(there: object, value: object, path: str) -> None:
    if _copied_type(value) is not _copied_type(there):
        raise ValueError(f"{path}: {_describe(value)} does not fit {_describe(there)}")
    mine, given = _entries(there), _entries(value)
    if isinstance(there, tuple) and len(given) != len(mine):
        raise ValueError(f"{path}: a tuple of {len(given)} does not fit one of {len(mine)}")
    for key in mine.keys() & given.keys():
        where = _entry_path(path, there, key)
        _check_fits(mine[key], given[key], where, _mutable(there))


def _write(there: object, value: object, put: Callable[[object], None]) -> None:
    """Write ``value`` into ``there`` in place; ``put`` sets a number or label that differs.
    Set only where it differs: compiled code guards on a module's attributes, and setting one,
    even to its own value, can make it compile again."""
    import torch

    if isinstance(there, torch.Tensor):
        there.copy_(value)  # type: ignore[arg-type]
    elif _is_array(there):
        there[...] = value
    elif _is_container(there):
        _write_into(there, value)
    elif not _same_leaf(there, value):
        put(value)


def _write_into(there: object, value: object) -> None:
    """Write a copied container into the container ``there`` in place, entry by entry; a list,
    dict or namespace given the copy's length (new entries copies)."""
    mine, given = _entries(there), _entries(value)
    for key, item in mine.items():
        if key in given:
            _write(item, given[key], partial(_set, there, key))
    if isinstance(there, list):
        del there[len(given) :]
        there.extend(_copied(item) for item in list(given.values())[len(mine) :])
    elif _resizable(there):
        for key in [key for key in mine if key not in given]:
            _remove(there, key)
        for key in [key for key in given if key not in mine]:
            _set(there, key, _copied(given[key]))


def _set(container: object, key: Any, value: object) -> None:
    if isinstance(container, (dict, list)):
        container[key] = value
    else:
        setattr(container, key, value)


def _remove(container: object, key: Any) -> None:
    if isinstance(container, dict):
        del container[key]
    else:
        delattr(container, key)


def _same_leaf(first: object, second: object) -> bool:
    """Equal numbers or labels of one type, NaN equal to NaN."""
    if type(first) is not type(second):
        return False
    return bool(first == second) or (first != first and second != second)


def _identity(slot: _Slot) -> int:
    import torch

    value = slot.read()
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().data_ptr()
    if _is_array(value):
        return _address(value)
    return id(value) if slot.kind == "container" else id(slot.owner)


def _address(array: Any) -> int:
    """Where the memory of ``array`` (of the array it views, if any) begins."""
    while _is_array(array.base):
        array = array.base
    return int(array.__array_interface__["data"][0])


def _owners(root: object) -> Iterator[tuple[str, object]]:
    """(path, owner) of each module or object holding state under ``root``, and each root's
    dict or list holding numbers, once each (a tuple holds no place to write)."""
    seen: set[int] = set()
    for _, slot in _slots(root):
        owner = slot.owner
        if owner is not None and _settable(owner) and id(owner) not in seen:
            seen.add(id(owner))
            yield slot.at, owner


def _places(root: object) -> Iterator[tuple[str, tuple[str, int], str]]:
    """(path, place, how two sharing it are said to) of what state holds under ``root`` that
    a write can reach: each tensor's storage (parameters aside), array's memory, list's,
    dict's or namespace's object."""
    import torch

    for path, value in trees.walk(state_view(root), "state"):
        if path == "state":
            continue  # the view: a dict of its own
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.nbytes() and not isinstance(value, torch.nn.Parameter):
                yield path, ("storage", storage.data_ptr()), "share storage"
        elif _is_array(value):
            if value.nbytes:
                yield path, ("memory", _address(value)), "share memory"
        elif _mutable(value):
            yield path, ("object", id(value)), f"are one {type(value).__name__}"


def _noun(owner: object) -> str:
    import torch

    return "module" if isinstance(owner, torch.nn.Module) else type(owner).__name__


def _describe(value: object) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        what = "array" if _is_array(value) else "tensor"
        return f"a {getattr(value, 'dtype', '')} {what} of shape {tuple(shape)}"
    if _is_container(value):
        return f"a {type(value).__name__} of {len(_entries(value))}"
    return f"{type(value).__name__} {value!r}"
