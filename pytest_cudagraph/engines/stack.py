"""pinned_stack: run a test only on the software stack a project pins.

A pinned stack maps each component (python, torch, and torch's CUDA) to a PEP 440
specifier set. It is written as entries like ``torch~=2.7.0``: the component's name
followed directly by its specifiers (quote an entry that contains spaces).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

COMPONENTS = ("python", "torch", "cuda")

# Nothing: which stack a project pins is the project's to say (ini cudagraph_pinned_stack).
DEFAULT_PINNED_STACK: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunningStack:
    """Versions of the running stack; ``cuda`` is None on a CPU build of torch."""

    python: str
    torch: str
    cuda: str | None


def running_stack() -> RunningStack:
    """The stack this process runs, with torch's local suffix dropped (2.7.1+cu126 is 2.7.1)."""
    import torch

    return RunningStack(
        python=platform.python_version(),
        torch=Version(torch.__version__).public,
        cuda=torch.version.cuda,
    )


def parse_specifiers(component: str, text: str) -> SpecifierSet:
    """One component's specifiers; ValueError for an unknown component or bad specifiers."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}, expected one of {COMPONENTS}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{component} needs PEP 440 specifiers such as '~=1.2', got {text!r}")
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"{component}: {text!r} is not a PEP 440 specifier set") from None


def parse_pinned_stack(entries: Iterable[str]) -> dict[str, SpecifierSet]:
    """Parse entries like ``python~=3.10.0``; components not named are not pinned, and a
    component named twice is an error (which one should win is not the parser's guess)."""
    pinned: dict[str, SpecifierSet] = {}
    for entry in entries:
        match = re.fullmatch(r"\s*([a-z]+)\s*(.*)", entry)
        if match is None:
            raise ValueError(
                f"cannot read pinned-stack entry {entry!r}, expected e.g. torch~=2.7.0"
            )
        component, text = match.groups()
        if component in pinned:
            raise ValueError(
                f"component {component!r} is pinned twice ({component}{pinned[component]} and "
                f"{entry.strip()}); give each component once"
            )
        pinned[component] = parse_specifiers(component, text)
    return pinned


def mismatches(pinned: Mapping[str, SpecifierSet], running: RunningStack) -> list[str]:
    """One line per pinned component the running stack does not satisfy. A pre-release
    satisfies a pin its release would (NGC ships torch as 2.x.0a0+<commit>, before 2.x.0)."""
    found = []
    for component, specifiers in pinned.items():
        version = getattr(running, component)
        if version is None or not _satisfies(specifiers, Version(version)):
            found.append(f"{component} {version or 'none'} not {specifiers}")
    return found


def _satisfies(specifiers: SpecifierSet, version: Version) -> bool:
    return specifiers.contains(version, prereleases=True) or specifiers.contains(
        Version(version.base_version)
    )


def skip_reason(found: list[str]) -> str:
    return "pinned stack not running: " + "; ".join(found)
