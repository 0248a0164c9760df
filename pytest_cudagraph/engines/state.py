"""The state code keeps between calls, by path: read it, write it back in place, compare two.

State lives in modules: every parameter and buffer, every tensor attribute that is neither
(``self.cache = torch.zeros(...)``), every number attribute (``training``, a Python-side
counter ``self.steps += 1``) and every list, tuple or dict attribute holding tensors
(``self.kv = [k, v]``, ``self.history.append(...)``), of the module and each submodule; or in
tensors given themselves. A root is one of those, or a mapping or sequence of them (paths then
start at their keys). ``module_state(root)`` copies it and ``state_view(root)`` reads it as it
is; ``load_state(root, state)`` writes a copy back in place (tensors copied into, so that their
storage stays; numbers set where they differ; a list or dict given the copy's length, the one
change not made in place); ``state_differences`` lists how two differ; ``tensor_addresses``
says where each tensor's storage lies; ``shared_state`` names what two roots hold in common.
torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.compare import Mismatch, compare_outputs

if TYPE_CHECKING:
    import torch

NUMBERS = (bool, int, float)
CONTAINERS = (list, tuple, dict)


@dataclass(frozen=True)
class _Slot:
    """One piece of state: the attribute ``name`` of a module (a tensor, a number, or a
    container of tensors), or a tensor given as a root itself (``owner`` None)."""

    owner: torch.nn.Module | None
    name: str
    root: torch.Tensor | None = None

    def read(self) -> object:
        return self.root if self.owner is None else getattr(self.owner, self.name)


def module_state(root: object) -> dict[str, object]:
    """path -> a copy of each piece of state under ``root``."""
    return {path: _copied(slot.read()) for path, slot in _slots(root)}


def state_view(root: object) -> dict[str, object]:
    """path -> each piece of state under ``root`` as it is (no copy: later writes show)."""
    return {path: slot.read() for path, slot in _slots(root)}


def load_state(root: object, state: Mapping[str, object]) -> None:
    """Write ``state`` (a ``module_state`` of roots alike) into ``root`` in place. ValueError,
    before anything is written, when the paths or a tensor's shape or dtype differ (a list or
    a dict may differ in length: it is given the state's)."""
    import torch

    slots = dict(_slots(root))
    if slots.keys() != state.keys():
        missing, extra = sorted(slots.keys() - state.keys()), sorted(state.keys() - slots.keys())
        raise ValueError(
            f"the state does not fit the modules: paths {missing} missing, {extra} not theirs"
        )
    for path, slot in slots.items():
        _check_fits(slot.read(), state[path], path)
    with torch.no_grad():
        for path, slot in slots.items():
            there = slot.read()
            if isinstance(there, torch.Tensor):
                there.copy_(state[path])  # type: ignore[arg-type]
            elif isinstance(there, CONTAINERS):
                _write_into(there, state[path])
            elif slot.owner is not None and there != state[path]:
                # Set only when it differs: compiled code guards on a module's attributes, and
                # setting one, even to its own value, can make it compile again.
                setattr(slot.owner, slot.name, state[path])


def state_differences(
    expected: Mapping[str, object],
    actual: Mapping[str, object],
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    sides: tuple[str, str] = ("eager", "graphed"),
) -> list[Mismatch]:
    """Every difference between two states (``module_state`` or ``state_view``), each named by
    its path (and the index where a tensor of it differs)."""
    return compare_outputs(
        dict(expected), dict(actual), atol=atol, rtol=rtol, path="state", sides=sides
    )


def tensor_addresses(root: object) -> dict[str, int]:
    """path -> where the storage of each tensor of the state lies (containers' items too)."""
    return {
        path: tensor.untyped_storage().data_ptr()
        for path, tensor in trees.tensors(state_view(root), "state")
    }


def shared_state(first: object, second: object) -> list[str]:
    """What two roots hold in common, each named by its path under both: the same module, or a
    tensor's storage (a parameter aside: weights two sides share are read, not written)."""
    import torch

    modules = {id(module): path for path, module in _modules(first)}
    found = [
        f"the module at {modules[id(module)]!r} is the one at {path!r}"
        for path, module in _modules(second)
        if id(module) in modules
    ]
    written = {
        tensor.untyped_storage().data_ptr(): path
        for path, tensor in trees.tensors(state_view(first), "state")
        if tensor.untyped_storage().nbytes() and not isinstance(tensor, torch.nn.Parameter)
    }
    found += [
        f"{written[address]} and {path} share storage"
        for path, tensor in trees.tensors(state_view(second), "state")
        if (address := tensor.untyped_storage().data_ptr()) in written
        and tensor.untyped_storage().nbytes()
        and not isinstance(tensor, torch.nn.Parameter)
    ]
    return found


def _slots(root: object, at: str = "") -> Iterator[tuple[str, _Slot]]:
    """(path, slot) of every piece of state under ``root``, in a fixed order."""
    import torch

    if isinstance(root, torch.nn.Module):
        yield from _module_slots(root, f"{at}." if at else "")
    elif isinstance(root, torch.Tensor):
        yield at or "tensor", _Slot(None, "", root)
    elif isinstance(root, Mapping):
        for key, item in root.items():
            yield from _slots(_holder(item, f"[{key!r}]"), f"{at}.{key}" if at else str(key))
    elif isinstance(root, Sequence) and not isinstance(root, (str, bytes)):
        for index, item in enumerate(root):
            yield from _slots(_holder(item, f"[{index}]"), f"{at}.{index}" if at else str(index))
    else:
        raise TypeError(
            "state lives in a torch.nn.Module or a tensor, or a mapping or sequence of them; "
            f"got {type(root).__name__}"
        )


def _holder(value: object, where: str) -> object:
    import torch

    if not isinstance(value, (torch.nn.Module, torch.Tensor, Mapping, list, tuple)):
        raise TypeError(
            f"{where} must be a torch.nn.Module or a tensor, got {type(value).__name__}"
        )
    return value


def _modules(root: object) -> Iterator[tuple[str, object]]:
    """(path, module) of every module under ``root``."""
    import torch

    if isinstance(root, torch.nn.Module):
        yield from ((name or "(root)", module) for name, module in root.named_modules())
    elif isinstance(root, Mapping):
        for key, item in root.items():
            yield from ((f"{key}.{path}", module) for path, module in _modules(item))
    elif isinstance(root, (list, tuple)):
        for index, item in enumerate(root):
            yield from ((f"{index}.{path}", module) for path, module in _modules(item))


def _module_slots(root: torch.nn.Module, prefix: str) -> Iterator[tuple[str, _Slot]]:
    import torch

    for name, module in root.named_modules():
        at = f"{prefix}{name}." if name else prefix
        for attribute, _ in module.named_parameters(recurse=False):
            yield f"{at}{attribute}", _Slot(module, attribute)
        for attribute, _ in module.named_buffers(recurse=False):
            yield f"{at}{attribute}", _Slot(module, attribute)
        for attribute, value in vars(module).items():
            if attribute.startswith("_"):
                continue
            if isinstance(value, torch.Tensor):
                yield f"{at}{attribute}", _Slot(module, attribute)
            elif isinstance(value, NUMBERS):
                yield f"{at}{attribute}", _Slot(module, attribute)
            elif _holds_tensors(value):
                yield f"{at}{attribute}", _Slot(module, attribute)


def _holds_tensors(value: object) -> bool:
    """Whether ``value`` is a list, tuple or dict of tensors (numbers and such containers
    beside them allowed) with at least one tensor, or an empty list or dict (a history yet to
    be appended to)."""
    import torch

    if not isinstance(value, CONTAINERS):
        return False
    items = list(value.values()) if isinstance(value, dict) else list(value)
    leaves_fit = all(
        isinstance(item, (torch.Tensor, *NUMBERS)) or _holds_tensors(item) for item in items
    )
    if not items:
        return not isinstance(value, tuple)
    return leaves_fit and any(not isinstance(item, NUMBERS) for item in items)


def _copied(value: object) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_copied(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _check_fits(there: object, value: object, path: str) -> None:
    """ValueError naming ``path`` when ``value`` cannot be written into ``there`` in place."""
    import torch

    if isinstance(there, torch.Tensor):
        if (
            not isinstance(value, torch.Tensor)
            or value.shape != there.shape
            or value.dtype != there.dtype
        ):
            raise ValueError(f"{path}: {_describe(value)} does not fit {_describe(there)}")
    elif isinstance(there, CONTAINERS):
        if type(value) is not type(there):
            raise ValueError(f"{path}: {_describe(value)} does not fit {_describe(there)}")
        mine, given = _entries(there), _entries(value)
        if isinstance(there, tuple) and len(given) != len(mine):
            raise ValueError(f"{path}: a tuple of {len(given)} does not fit one of {len(mine)}")
        for key in mine.keys() & given.keys():
            item, new = mine[key], given[key]
            if isinstance(there, tuple) and isinstance(item, NUMBERS) and item != new:
                raise ValueError(f"{path}[{key!r}]: a number in a tuple cannot be set")
            _check_fits(item, new, f"{path}[{key!r}]")
    elif not isinstance(value, NUMBERS):
        raise ValueError(f"{path}: {_describe(value)} is not a number")


def _write_into(there: object, value: object) -> None:
    """Write a copied container into the container ``there`` in place: tensors copied into,
    numbers set in a list or dict, a list or dict given the copy's length (new items copies)."""
    import torch

    given = _entries(value)
    for key, item in _entries(there).items():
        if key not in given:
            continue
        if isinstance(item, torch.Tensor):
            item.copy_(given[key])  # type: ignore[arg-type]
        elif isinstance(item, CONTAINERS):
            _write_into(item, given[key])
        elif item != given[key]:  # a list's or a dict's: a tuple's were checked equal
            _set(there, key, given[key])
    if isinstance(there, list) and isinstance(value, list):
        del there[len(value) :]
        there.extend(_copied(item) for item in value[len(there) :])
    elif isinstance(there, dict) and isinstance(value, dict):
        for key in [key for key in there if key not in value]:
            del there[key]
        there.update({key: _copied(item) for key, item in value.items() if key not in there})


def _entries(container: object) -> dict[object, object]:
    """A list's or tuple's items by index, a dict's by key (nothing for anything else)."""
    if isinstance(container, dict):
        return dict(container)
    if isinstance(container, (list, tuple)):
        return dict(enumerate(container))
    return {}


def _set(container: object, key: object, value: object) -> None:
    if isinstance(container, dict):
        container[key] = value
    elif isinstance(container, list) and isinstance(key, int):
        container[key] = value


def _describe(value: object) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {getattr(value, 'dtype', '')} tensor of shape {tuple(shape)}"
    if isinstance(value, CONTAINERS):
        return f"a {type(value).__name__} of {len(_entries(value))}"
    return f"{type(value).__name__} {value!r}"
