"""The plugin's settings and the one place that resolves them.

Every setting can be given four ways; the first one present wins:

    marker argument  >  command line  >  environment  >  ini file  >  built-in default

Command-line options default to ``None`` so that an absent flag never hides an ini or
environment value (pytest-memray's bug #135 is a CLI default of False that does).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from pytest_cudagraph.devices import parse_device


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    return value


def _positive_number(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive number, got {text}")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting: ``--cudagraph-NAME``, env ``PYTEST_CUDAGRAPH_NAME``, ini ``cudagraph_NAME``."""

    name: str
    help: str
    default: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], object] = str

    @property
    def option(self) -> str:
        return "--cudagraph-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "cudagraph_" + self.name

    @property
    def ini(self) -> str:
        return "cudagraph_" + self.name

    @property
    def env(self) -> str:
        return "PYTEST_CUDAGRAPH_" + self.name.upper()


DEVICE = Setting(
    "device",
    "CUDA device this test process is bound to, as cuda:N or N (default: under xdist "
    "worker gwN the N-th visible GPU, else cuda:0)",
    parse=parse_device,
)
STACK = Setting(
    "stack",
    "pinned: pinned_stack tests skip unless the running stack matches the pinned one; "
    "any: run them anyway",
    default="pinned",
    choices=("pinned", "any"),
)
STRAY_CONTEXTS = Setting(
    "stray_contexts",
    "what to do when NVML shows this process on a GPU other than its own at session end",
    default="report",
    choices=("report", "fail"),
)
SEED = Setting(
    "seed",
    "seed of the RNG under which cuda_graph_parity runs both sides",
    default="0",
    parse=_non_negative_int,
)
MEMORY_BOUND_MIB = Setting(
    "memory_bound_mib",
    "bound in MiB for graph_memory_bound markers given without one",
    parse=_positive_number,
)

SETTINGS: tuple[Setting, ...] = (DEVICE, STACK, STRAY_CONTEXTS, SEED, MEMORY_BOUND_MIB)


@dataclass(frozen=True)
class Resolved:
    """A setting's value and where it came from (for messages and the report header)."""

    value: object
    source: str


def add_to_parser(parser: pytest.Parser, setting: Setting) -> None:
    """Declare ``setting`` as a command-line option (default None) and an ini key."""
    help_text = setting.help + (f" (default: {setting.default})" if setting.default else "")
    parser.getgroup("cudagraph").addoption(
        setting.option,
        dest=setting.dest,
        default=None,
        choices=setting.choices,
        help=f"{help_text}; env {setting.env}, ini {setting.ini}",
    )
    parser.addini(setting.ini, help=help_text, default=None)


def resolve(config: pytest.Config, setting: Setting, marker_value: object = None) -> Resolved:
    """The value of ``setting`` by the precedence marker > command line > environment > ini.

    Raises ``pytest.UsageError`` naming the source when a given value is invalid.
    """
    if marker_value is not None:
        return Resolved(marker_value, "marker")
    candidates = (
        (config.getoption(setting.dest, None), setting.option),
        (os.environ.get(setting.env) or None, setting.env),
        (config.getini(setting.ini) or None, f"ini {setting.ini}"),
    )
    for text, source in candidates:
        if text is not None:
            return Resolved(_parse(setting, str(text), source), source)
    if setting.default is None:
        return Resolved(None, "default")
    return Resolved(_parse(setting, setting.default, "default"), "default")


def _parse(setting: Setting, text: str, source: str) -> object:
    if setting.choices is not None and text not in setting.choices:
        raise pytest.UsageError(f"{source}={text!r}: choose one of {', '.join(setting.choices)}")
    try:
        return setting.parse(text)
    except ValueError as error:
        raise pytest.UsageError(f"{source}={text!r}: {error}") from None
