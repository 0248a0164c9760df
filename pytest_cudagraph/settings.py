"""The plugin's settings: one table, resolved once per session into a frozen snapshot.

Every setting can be given four ways; the first one present wins:

    marker argument  >  command line  >  environment  >  ini file  >  built-in default

Command-line options default to ``None`` so that an absent flag never hides an ini or
environment value (pytest-memray's bug #135 is a CLI default of False that does). Ini values
may be strings or, in pytest 9.2's native ``[tool.pytest]`` TOML table, numbers and lists.
This module imports neither torch nor NVML: it runs in every pytest session.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, TypeVar

import pytest
from packaging.version import Version

from pytest_cudagraph import results
from pytest_cudagraph.engines import devices, rng, stack

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from typing_extensions import TypeForm

    # What pytest's addini takes as an ini key's type: a tag, or (pytest 9.2) a type.
    IniType: TypeAlias = Literal["args"] | TypeForm[bool | int | float | str]

T = TypeVar("T")

# pytest 9.2 takes type expressions (``int``, ``float | str``) for ini keys, so that a native
# TOML number or list is accepted; older versions read every key here as a string.
TYPED_INI = Version(pytest.__version__).release >= (9, 2)

# Case k runs under torch.manual_seed(seed + k): half of torch's seed range is left for k.
MAX_SEED = rng.MAX_SEED // 2
UNITS = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}
# No setting's number has more digits (2**64 has 20): more are refused before being read.
MAX_DIGITS = 20
MAX_SHOWN_BITS = 256  # a larger integer is shown by its size in a message, not its digits
# Runs of each conformance check at most (--cudagraph-repeat): each one is a whole check.
MAX_REPEAT = 100


def check_seed(value: object) -> int:
    """An int in [0, MAX_SEED]: case k runs under torch.manual_seed(seed + k), which takes
    at most rng.MAX_SEED. TypeError for a value that is not an integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"seed must be an integer, got {value!r}")
    if not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"seed must be in [0, 2**{MAX_SEED.bit_length()} - 1] (case k runs under "
            f"torch.manual_seed(seed + k)), got {shown_integer(value)}"
        )
    return value


def shown_integer(value: int) -> str:
    """``value`` as a message shows it: its digits, or its size where there are too many to
    print (Python refuses to print more than 4300)."""
    if value.bit_length() <= MAX_SHOWN_BITS:
        return str(value)
    return f"an integer of {value.bit_length()} bits"


def parse_seed(value: object) -> int:
    """A seed given as an int or as a string of an integer."""
    return check_seed(_integer(value, "seed"))


def parse_case(value: object) -> int:
    """A case number (>= 0) given as an int or as a string of an integer."""
    case = _integer(value, "case")
    if case < 0:
        raise ValueError(f"case must be a case number >= 0, got {case}")
    return case


def _integer(value: object, name: str) -> int:
    """An int, or the int a string spells (signs allowed, so that -1 is out of range rather
    than not a number), of at most ``MAX_DIGITS`` digits; ValueError for anything else."""
    spelt = re.fullmatch(r"\s*([+-]?)0*([0-9]+)\s*", value) if isinstance(value, str) else None
    if spelt is not None:
        sign, digits = spelt.groups()
        if len(digits) > MAX_DIGITS:
            raise ValueError(
                f"{name} must be an integer of at most {MAX_DIGITS} digits, got one of "
                f"{len(digits)} digits"
            )
        return int(sign + digits)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def parse_repeat(value: object) -> int:
    """A number of runs of each conformance check, in [1, MAX_REPEAT], given as an int or as a
    string of an integer."""
    repeat = _integer(value, "repeat")
    if not 1 <= repeat <= MAX_REPEAT:
        raise ValueError(
            f"repeat must be a number of runs of each conformance check in [1, {MAX_REPEAT}], "
            f"got {shown_integer(repeat)}"
        )
    return repeat


def parse_mib(value: object) -> float:
    """A positive size in MiB: a number (MiB) or a string with a binary unit, as in "512MiB",
    "1.5GiB", "256KiB". Decimal units (MB, GB) are refused: NVML and torch count in binary."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if match is None or match.group(2) not in ("", *UNITS):
            raise ValueError(
                f"must be a number of MiB or a size with a unit KiB, MiB or GiB "
                f"(e.g. 512MiB, 1.5GiB), got {value!r}"
            )
        value = float(match.group(1)) * UNITS.get(match.group(2) or "MiB", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"must be a number of MiB or a size string such as '512MiB', got {value!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive size, got {value!r}")
    return float(value)


def as_text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def as_words(value: object) -> tuple[str, ...]:
    """A list (native TOML, ini ``args``) or a shell-like string of words."""
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, (list, tuple)) and all(isinstance(word, str) for word in value):
        return tuple(value)
    raise ValueError(f"must be a list of strings or a string of words, got {value!r}")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: ``--cudagraph-NAME``, env ``PYTEST_CUDAGRAPH_NAME``, ini ``cudagraph_NAME``.

    ``parse`` turns a given value (a string, or a native TOML value) into the setting's value
    of type ``T`` and raises ValueError for a bad one. ``default`` is written as a user would
    give it and parsed the same way; a setting without one is None unless given, so its ``T``
    includes None. ``ini_type`` is the ini key's type where pytest supports typed keys.
    """

    name: str
    help: str
    parse: Callable[[object], T]
    default: str | None = None
    choices: tuple[str, ...] | None = None
    ini_type: IniType = str
    metavar: str | None = None

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


def _device_index(value: object) -> int:
    """``cuda:N`` or ``N`` -> N, with N a device index torch holds."""
    match = re.fullmatch(r"(?:cuda:)?([0-9]+)", as_text(value).strip())
    if match is None:
        raise ValueError("expected cuda:N or N")
    index = _integer(match.group(1), "the device index N")
    if index > devices.MAX_DEVICE_INDEX:
        raise ValueError(
            f"expected cuda:N or N with N at most {devices.MAX_DEVICE_INDEX}, the largest "
            f"device index torch holds; got {index}"
        )
    return index


DEVICE: Setting[int | None] = Setting(
    "device",
    "CUDA device this test process is bound to, as cuda:N or N (default: under xdist "
    "worker gwN the N-th visible GPU, else cuda:0)",
    parse=_device_index,
    ini_type=int | str if TYPED_INI else str,
)
STACK = Setting(
    "stack",
    "pinned: pinned_stack tests skip unless the running stack matches the pinned one; "
    "any: run them anyway",
    parse=as_text,
    default="pinned",
    choices=("pinned", "any"),
)


def parse_pinned_stack(value: object) -> dict[str, SpecifierSet]:
    """Words such as python~=3.10.0 torch~=2.7.0, as a list or one string."""
    return stack.parse_pinned_stack(as_words(value))


PINNED_STACK = Setting(
    "pinned_stack",
    "the stack pinned_stack tests need, as words like python~=3.10.0 torch~=2.7.0 cuda~=11.8 "
    "(a component name followed by PEP 440 specifiers; quote a word with spaces)",
    parse=parse_pinned_stack,
    default=" ".join(stack.DEFAULT_PINNED_STACK),
    ini_type="args",
)
STRAY_CONTEXTS = Setting(
    "stray_contexts",
    "what to do when NVML shows this process on a GPU other than its own at session end",
    parse=as_text,
    default="report",
    choices=("report", "fail"),
)
SEED = Setting(
    "seed",
    "seed of the RNG under which cuda_graph_parity runs both sides, in "
    f"[0, 2**{MAX_SEED.bit_length()} - 1]",
    parse=parse_seed,
    default="0",
    ini_type=int | str if TYPED_INI else str,
)
CASE: Setting[int | None] = Setting(
    "case",
    "run only case K of each graph_parity.check (under seed + K), as a failure's rerun "
    "command does",
    parse=parse_case,
    ini_type=int | str if TYPED_INI else str,
    metavar="K",
)
MEMORY_BOUND: Setting[float | None] = Setting(
    "memory_bound",
    "bound for graph_memory_bound markers given without one: MiB, or a size such as 512MiB "
    "or 1.5GiB",
    parse=parse_mib,
    ini_type=float | str if TYPED_INI else str,
    metavar="SIZE",
)


def parse_results_path(value: object) -> Path:
    """A file the results can be written to: a path that is not empty (``~`` expanded), free
    or holding an earlier results file (``results.check_replaceable``: never a file of the
    user's, a folder, a link or a FIFO), not under a file, and whose nearest existing folder
    this process can create a file in (tried, so that permissions, read-only mounts and root
    all answer truly)."""
    text = as_text(value)
    if not text.strip():
        raise ValueError("must be a file path, got an empty one")
    try:
        path = Path(text).expanduser()
    except RuntimeError as error:  # a ~user that names no user
        raise ValueError(f"cannot expand ~ in it: {error}") from None
    try:
        folder = next(parent for parent in path.absolute().parents if parent.exists())
        if not folder.is_dir():
            raise ValueError(f"is under {folder}, which is a file, not a folder")
        results.check_replaceable(path)
    except OSError as error:  # a name too long, a folder that may not be searched
        raise ValueError(
            f"cannot be looked at: {error.strerror or error}; give another path"
        ) from None
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".cudagraph-probe-")
    except OSError as error:
        raise ValueError(f"cannot create a file in {folder}: {error.strerror or error}") from None
    os.close(handle)
    os.unlink(probe)
    return path


JSON: Setting[Path | None] = Setting(
    "json",
    "write the session's cudagraph results (each test's outcome, parity, memory, conformance, "
    "stack, skips) to this JSON file (~ expanded); only the results file of an earlier run "
    "may be there, and it is removed when the session starts",
    parse=parse_results_path,
    metavar="PATH",
)
EMULATE = Setting(
    "emulate",
    "CUDA graphs emulated on the CPU: on (for every test using cuda_device, which is then the "
    "CPU, and for the conformance suite), off, or auto (the conformance suite's runs without "
    "CUDA, and tests whose cuda_device is the CPU, run their graphs emulated)",
    parse=as_text,
    default="auto",
    choices=("auto", "on", "off"),
)
TARGET: Setting[str | None] = Setting(
    "target",
    "conformance target: an installed name (pytest-cudagraph targets lists them) or "
    "module:factory (default: the one installed target)",
    parse=as_text,
)
REPEAT = Setting(
    "repeat",
    f"run each conformance check N times in the session (N in [1, {MAX_REPEAT}]); a check whose "
    "runs disagree, one passing and another failing, is reported flaky in the conformance table",
    parse=parse_repeat,
    default="1",
    ini_type=int | str if TYPED_INI else str,
    metavar="N",
)

SETTINGS: tuple[Setting[Any], ...] = (
    DEVICE,
    STACK,
    PINNED_STACK,
    STRAY_CONTEXTS,
    SEED,
    CASE,
    MEMORY_BOUND,
    JSON,
    EMULATE,
    TARGET,
    REPEAT,
)


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A setting's value and where it came from (for messages and the report header)."""

    value: T
    source: str

    @property
    def given(self) -> bool:
        """Whether the user gave it (any source but the built-in default)."""
        return self.source != "default"


def add_to_parser(parser: pytest.Parser, setting: Setting[Any]) -> None:
    """Declare ``setting`` as a command-line option (default None) and an ini key."""
    help_text = setting.help + (f" (default: {setting.default})" if setting.default else "")
    parser.getgroup("cudagraph").addoption(
        setting.option,
        dest=setting.dest,
        default=None,
        choices=setting.choices,
        metavar=setting.metavar,
        help=f"{help_text}; env {setting.env}, ini {setting.ini}",
    )
    ini_type = setting.ini_type if TYPED_INI or setting.ini_type == "args" else None
    parser.addini(setting.ini, help=help_text, type=ini_type, default=None)


def _resolve(config: pytest.Config, setting: Setting[T]) -> Resolved[T | None]:
    """The value of ``setting`` by the precedence command line > environment > ini > default
    (a marker's value, where one is given, comes first: ``Snapshot.value``).

    Raises ``pytest.UsageError`` naming the source when a given value is invalid.
    """
    candidates = (
        (config.getoption(setting.dest, None), setting.option),
        (os.environ.get(setting.env) or None, setting.env),
        (_ini_value(config, setting), f"ini {setting.ini}"),
    )
    for given, source in candidates:
        if given is not None:
            return Resolved(_parse(setting, given, source), source)
    if setting.default is None:
        return Resolved(None, "default")
    return Resolved(_parse(setting, setting.default, "default"), "default")


def _ini_value(config: pytest.Config, setting: Setting[Any]) -> object:
    value = config.getini(setting.ini)
    return None if value in (None, "", []) else value


def _parse(setting: Setting[T], given: object, source: str) -> T:
    if setting.choices is not None and given not in setting.choices:
        raise pytest.UsageError(f"{source}={given!r}: choose one of {', '.join(setting.choices)}")
    try:
        return setting.parse(given)
    except ValueError as error:
        raise pytest.UsageError(f"{source}={given!r}: {error}") from None


@dataclass(frozen=True)
class Snapshot:
    """Every setting resolved once, at configure time (``snapshot(config)`` reads it back)."""

    resolved: Mapping[str, Resolved[Any]] = field(default_factory=dict)

    def __getitem__(self, setting: Setting[T]) -> Resolved[T]:
        return self.resolved[setting.name]

    def value(self, setting: Setting[T], marker_value: T | None = None) -> T:
        """The marker's value where the marker gave one, else the session's."""
        return self[setting].value if marker_value is None else marker_value

    def given(self) -> list[str]:
        """The options the user gave, as they were given (for "is the plugin used?")."""
        return [resolved.source for resolved in self.resolved.values() if resolved.given]


SNAPSHOT = pytest.StashKey[Snapshot]()


def take_snapshot(config: pytest.Config) -> Snapshot:
    """Resolve every setting (a bad value is a usage error now, not mid-run) and stash them."""
    resolved = {setting.name: _resolve(config, setting) for setting in SETTINGS}
    snapshot = config.stash[SNAPSHOT] = Snapshot(MappingProxyType(resolved))
    return snapshot


def snapshot(config: pytest.Config) -> Snapshot:
    return config.stash[SNAPSHOT]
