"""The state code keeps in its modules, by path: read it, write it back, compare two of them.

A module's state is every parameter and buffer, every tensor attribute that is neither
(``self.cache = torch.zeros(...)``) and every number attribute (``training``, a Python-side
counter ``self.steps += 1``), of the module and each submodule. ``module_state(root)`` copies it
(``root`` a module, or a mapping or sequence of modules, paths starting at their keys);
``load_state(root, state)`` writes such a copy back in place (tensors copied into the tensors
there, so that their storage stays; numbers set where they differ); ``state_differences`` lists how two copies
differ. The module-state check compares the eager and the graphed side with them. torch is
imported when used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_cudagraph.engines.compare import Mismatch, compare_outputs

if TYPE_CHECKING:
    import torch

NUMBERS = (bool, int, float)


@dataclass(frozen=True)
class _Slot:
    """One piece of state: the module holding it, its attribute name, and whether it is a
    tensor (copied into) or a number (set)."""

    owner: torch.nn.Module
    name: str
    tensor: bool


def module_state(root: object) -> dict[str, object]:
    """path -> a copy of each piece of state under ``root``."""
    copied: dict[str, object] = {}
    for path, slot in _slots(root):
        value = getattr(slot.owner, slot.name)
        copied[path] = value.detach().clone() if slot.tensor else value
    return copied


def load_state(root: object, state: Mapping[str, object]) -> None:
    """Write ``state`` (a ``module_state`` of modules alike) into ``root`` in place. ValueError,
    before anything is written, when the paths or a tensor's shape or dtype differ."""
    import torch

    slots = dict(_slots(root))
    if slots.keys() != state.keys():
        missing, extra = sorted(slots.keys() - state.keys()), sorted(state.keys() - slots.keys())
        raise ValueError(
            f"the state does not fit the modules: paths {missing} missing, {extra} not theirs"
        )
    for path, slot in slots.items():
        value, there = state[path], getattr(slot.owner, slot.name)
        if slot.tensor and (
            not isinstance(value, torch.Tensor)
            or value.shape != there.shape
            or value.dtype != there.dtype
        ):
            raise ValueError(f"{path}: {_describe(value)} does not fit {_describe(there)}")
        if not slot.tensor and not isinstance(value, NUMBERS):
            raise ValueError(f"{path}: {_describe(value)} is not a number")
    with torch.no_grad():
        for path, slot in slots.items():
            if slot.tensor:
                getattr(slot.owner, slot.name).copy_(state[path])
            elif getattr(slot.owner, slot.name) != state[path]:
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
    """Every difference between two states (``module_state``), each named by its path."""
    return compare_outputs(
        dict(expected), dict(actual), atol=atol, rtol=rtol, path="state", sides=sides
    )


def _slots(root: object) -> Iterator[tuple[str, _Slot]]:
    """(path, slot) of every piece of state under ``root``, in a fixed order."""
    import torch

    if isinstance(root, torch.nn.Module):
        yield from _module_slots(root, "")
    elif isinstance(root, Mapping):
        for key, module in root.items():
            yield from _module_slots(_module(module, f"[{key!r}]"), f"{key}.")
    elif isinstance(root, Sequence) and not isinstance(root, (str, bytes)):
        for index, module in enumerate(root):
            yield from _module_slots(_module(module, f"[{index}]"), f"{index}.")
    else:
        raise TypeError(
            f"state lives in a torch.nn.Module, or a mapping or sequence of them; got "
            f"{type(root).__name__}"
        )


def _module(value: object, where: str) -> torch.nn.Module:
    import torch

    if not isinstance(value, torch.nn.Module):
        raise TypeError(f"{where} must be a torch.nn.Module, got {type(value).__name__}")
    return value


def _module_slots(root: torch.nn.Module, prefix: str) -> Iterator[tuple[str, _Slot]]:
    import torch

    for name, module in root.named_modules():
        at = f"{prefix}{name}." if name else prefix
        for attribute, _ in module.named_parameters(recurse=False):
            yield f"{at}{attribute}", _Slot(module, attribute, True)
        for attribute, _ in module.named_buffers(recurse=False):
            yield f"{at}{attribute}", _Slot(module, attribute, True)
        for attribute, value in vars(module).items():
            if attribute.startswith("_"):
                continue
            if isinstance(value, torch.Tensor):
                yield f"{at}{attribute}", _Slot(module, attribute, True)
            elif isinstance(value, NUMBERS):
                yield f"{at}{attribute}", _Slot(module, attribute, False)


def _describe(value: object) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {getattr(value, 'dtype', '')} tensor of shape {tuple(shape)}"
    return f"{type(value).__name__} {value!r}"
