"""From a target spec to a validated target: an installed name or ``module:factory``, the factory
loaded, called with a device, and what it returned checked before any check runs.

Installed names come from the entry-point group ``pytest_cudagraph.targets``; with none chosen,
the one installed target is the default. The module of a ``module:factory`` imports as a test
module would: from ``sys.path``, else from the rootdir or the invocation folder. Every problem is
a ``TargetError`` naming the spec.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagraph.conformance import legacy
from pytest_cudagraph.conformance.protocol import CudaGraphTarget

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "pytest_cudagraph.targets"

Factory = Callable[["torch.device"], CudaGraphTarget]


class TargetError(Exception):
    """A conformance target that cannot be loaded or does not follow the protocol (a usage
    error where the session chooses the target)."""

    def __init__(self, spec: str | None, problem: str) -> None:
        subject = f"conformance target {spec!r}" if spec else "conformance target"
        super().__init__(f"{subject}: {problem}")


# Choosing the target


def installed_targets() -> dict[str, str]:
    """Installed target name -> its ``module:factory`` (entry-point group
    ``pytest_cudagraph.targets``)."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {entry.name: entry.value for entry in sorted(found, key=lambda entry: entry.name)}


def installed_lines() -> list[str]:
    """The installed targets as ``pytest-cudagraph targets`` lists them, one per line."""
    installed = installed_targets()
    if not installed:
        return [f"no conformance targets installed (entry-point group {ENTRY_POINT_GROUP})"]
    return [f"{name}  {value}" for name, value in installed.items()]


def resolve_spec(spec: str | None) -> str:
    """``spec`` itself, or with none chosen the name of the one installed target."""
    if spec is not None:
        return spec
    names = sorted(installed_targets())
    if len(names) == 1:
        return names[0]
    if not names:
        raise TargetError(
            None,
            "none chosen and none installed; give --cudagraph-target module:factory",
        )
    raise TargetError(
        None,
        f"none chosen and {len(names)} installed ({', '.join(names)}); "
        "choose one with --cudagraph-target NAME",
    )


def describe_spec(spec: str | None) -> str:
    """The target for titles: the spec, or the default it stands for (without failing)."""
    try:
        return resolve_spec(spec)
    except TargetError:
        return "no target chosen"


# Loading


def load_factory(spec: str, search_paths: Sequence[Path] = ()) -> Factory:
    """The factory an installed name or a ``module:factory`` spec names (the factory may be a
    dotted attribute). A module not found on sys.path is looked for in ``search_paths`` (the
    rootdir, the invocation folder), which then join sys.path as they do for test modules."""
    if ":" not in spec:
        installed = installed_targets()
        if spec not in installed:
            names = ", ".join(installed) or "none"
            raise TargetError(
                spec,
                f"no installed target of that name (installed: {names}); "
                "or give module:factory, e.g. 'mypkg.graphs:make_target'",
            )
        return load_factory(installed[spec], search_paths)
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise TargetError(
            spec, "must be a name or 'module:factory', e.g. 'mypkg.graphs:make_target'"
        )
    found: object = _import(spec, module_name, search_paths)
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise TargetError(spec, f"{module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise TargetError(spec, f"{attribute} is a {type(found).__name__}, not a callable factory")
    return found


def _import(spec: str, module_name: str, search_paths: Sequence[Path]) -> object:
    top = module_name.partition(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        holders = [path for path in search_paths if _holds_module(path, top)]
        sys.path.extend(str(path) for path in holders if str(path) not in sys.path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise TargetError(spec, f"cannot import module {module_name!r}: {error}") from error
    except (Exception, SystemExit) as error:  # whatever the module raises while it runs
        raise TargetError(
            spec, f"importing {module_name!r} failed: {type(error).__name__}: {_first_line(error)}"
        ) from error


def _holds_module(folder: Path, name: str) -> bool:
    return (folder / name).is_dir() or (folder / f"{name}.py").is_file()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def build_target(
    spec: str | None, device: torch.device, factory: Factory | None = None
) -> CudaGraphTarget:
    """The target ``factory`` (None: the one ``spec`` names, loaded now; ``spec`` None: the
    one installed) builds for ``device``, validated."""
    spec = resolve_spec(spec)
    if factory is None:
        factory = load_factory(spec)
    try:
        target = factory(device)
    except (Exception, SystemExit) as error:  # SystemExit too: a factory may call sys.exit
        raise TargetError(
            spec, f"the factory raised {type(error).__name__}: {_first_line(error)}"
        ) from error
    validate_target(spec, target, device)
    return target


# Validation


def validate_target(spec: str, target: object, device: torch.device) -> None:
    """A ``CudaGraphTarget`` made for ``device`` (its fields checked themselves when it was
    made), whose case 0 draws and keys: a ``draw`` or ``key_of`` that fails every call is named
    here, before any check. A ``draw(generator, key)`` of the release before 0.3.0 is wrapped,
    with a DeprecationWarning."""
    import torch

    if not isinstance(target, CudaGraphTarget):
        raise TargetError(
            spec,
            f"the factory returned {type(target).__name__}; expected a "
            "pytest_cudagraph.conformance.CudaGraphTarget",
        )
    if target.device != device:
        raise TargetError(spec, f"device is {target.device!r}; the factory was asked for {device}")
    generator = torch.Generator(device).manual_seed(0)
    try:
        target.draw, inputs = legacy.first_draw(target.draw, generator, target.case(0))
    except legacy.DrawSpellingError as error:
        raise TargetError(spec, f"draw: {error}") from error
    except Exception as error:
        raise TargetError(spec, f"draw(generator, case 0) raised {_described(error)}") from error
    if not isinstance(inputs, dict) or not all(isinstance(name, str) for name in inputs):
        raise TargetError(
            spec,
            f"draw(generator, case 0) returned {type(inputs).__name__}; it must return a dict "
            "of input name -> value",
        )
    try:
        key = target.key_of(inputs)
    except Exception as error:
        raise TargetError(spec, f"key_of(case 0's inputs) raised {_described(error)}") from error
    try:
        hash(key)
    except TypeError:
        raise TargetError(
            spec, f"key_of(case 0's inputs) returned an unhashable {type(key).__name__}: {key!r}"
        ) from None


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {_first_line(error)}"
