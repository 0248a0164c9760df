"""The results document: the session's sections as one JSON file, written and read back.

A plugin adds to the results through this module: ``record(item, kind, value)`` in a test,
and a ``Section`` returned from the ``pytest_cudagraph_results_sections`` hook
(pytest_cudagraph.hookspec), which ``declared_sections`` reads once per session. The
document holds the stack, how the session ended, the commit, then each section's data under
its name; ``--cudagraph-json`` writes it over nothing but an earlier results file, and the
Markdown report (pytest_cudagraph.report_markdown) renders it again from the file. Its shape
is ``results.schema.json`` beside this module. torch is imported only by ``stack_facts``.
"""

from __future__ import annotations

import datetime
import importlib.resources
import json
import os
import platform
import re
import secrets
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

# The names imported ``as`` themselves are what a plugin uses to record, to read its records
# back and to word a report, importable from this one module (docs/plugin.md, "Extending the
# plugin"); each is defined in its own module.
from pytest_cudagraph import hookspec
from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.devices import DeviceBinding
from pytest_cudagraph.engines.units import GiB
from pytest_cudagraph.reasons import failure_reason as failure_reason
from pytest_cudagraph.reasons import one_line as one_line
from pytest_cudagraph.reasons import reason_of as reason_of
from pytest_cudagraph.records import Record as Record
from pytest_cudagraph.records import envelope as envelope
from pytest_cudagraph.records import plain, type_name
from pytest_cudagraph.records import plugin_values as plugin_values
from pytest_cudagraph.records import record as record
from pytest_cudagraph.sections import SKIPS, STRAY_CONTEXTS, TESTS
from pytest_cudagraph.sections import Section as Section

JSON_FORMAT = 2
SCHEMA_FILE = "results.schema.json"
HOOK = hookspec.pytest_cudagraph_results_sections.__name__
# The document's own keys, before its sections (``results_document``).
DOCUMENT_KEYS = frozenset(("format", "plugin_version", "date", "commit", "session", "stack"))
# The names no declared section may take: the document's keys and the sections plugin.py
# always adds around the declared ones.
KEPT_NAMES = DOCUMENT_KEYS | {TESTS.name, SKIPS.name, STRAY_CONTEXTS}
GIT_SECONDS = 10
# Every results file this plugin writes, of any format, opens with these keys in this order:
# how an earlier results file is told from a file of the user's at the same path.
OPENING = re.compile(
    rb'\s*\{\s*"format"\s*:\s*[0-9]+\s*,\s*"plugin_version"\s*:\s*"[^"]*"\s*,\s*"date"\s*:'
)
OPENING_BYTES = 512  # read to tell a results file by its opening: far more than it needs
REPLACED = "only the results file of an earlier run is ever replaced"


# The running stack


@dataclass(frozen=True)
class StackFacts:
    """The running stack as the header and the JSON results report it."""

    python: str
    torch: str
    torch_cuda: str | None
    driver: str | None
    nvml: str
    gpus: list[devices.GpuInfo] = field(default_factory=list)


def stack_facts() -> StackFacts:
    """Python, torch, CUDA, driver and the visible GPUs (imports torch; no CUDA context)."""
    import torch

    nvml = devices.nvml_status()
    return StackFacts(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        driver=nvml.detail if nvml.available else None,
        nvml="ok" if nvml.available else f"unavailable ({nvml.detail})",
        gpus=devices.visible_gpus(),
    )


def header_lines(facts: StackFacts, binding: DeviceBinding) -> list[str]:
    """What the run uses, naming only devices that exist."""
    build = f"torch {facts.torch}" + (
        f" with CUDA {facts.torch_cuda}" if facts.torch_cuda else " (CPU build, no CUDA)"
    )
    lines = [f"cudagraph: python {facts.python}, {build}, NVIDIA driver {facts.driver or 'none'}"]
    if not facts.gpus:
        lines.append("cudagraph: no GPU visible to torch, so tests that need CUDA skip")
        return lines
    gpus = ", ".join(
        f"{gpu.device} {gpu.name} ({gpu.total_bytes / GiB:.1f} GiB)" for gpu in facts.gpus
    )
    lines.append(f"cudagraph: GPUs {gpus}; NVML {facts.nvml}")
    lines.append(f"cudagraph: tests use {binding.device} ({binding.how})")
    return lines


# The sections plugins declare


def declared_sections(config: pytest.Config) -> list[Section]:
    """Every section the plugins return from ``pytest_cudagraph_results_sections``, in the
    order the plugins were registered. TypeError naming the first return that is not a list
    of ``Section``; ValueError naming a section whose name the document keeps for itself or
    another section took."""
    declared: list[Section] = []
    # pluggy calls the plugin registered last first: reversed, the plugins' own order.
    for returned in reversed(config.hook.pytest_cudagraph_results_sections(config=config)):
        if not isinstance(returned, list):
            raise TypeError(
                f"{HOOK} returned {type_name(returned)}: it returns a list of "
                "pytest_cudagraph.sections.Section ([] for none)"
            )
        for section in returned:
            if not isinstance(section, Section):
                raise TypeError(
                    f"{HOOK} returned a {type_name(section)} in its list: each item is a "
                    "pytest_cudagraph.sections.Section"
                )
            if section.name in KEPT_NAMES:
                raise ValueError(
                    f"{HOOK}: {section.name!r} is a name the results document keeps for "
                    f"itself ({', '.join(sorted(KEPT_NAMES))}): name the section otherwise"
                )
            if any(known.name == section.name for known in declared):
                raise ValueError(
                    f"{HOOK}: two sections are named {section.name!r}: each section's name "
                    "is its key in the results, so give each its own"
                )
            declared.append(section)
    return declared


# The document


@dataclass(frozen=True)
class SessionEnd:
    """How the session ended: pytest's exit status (and its name), whether every collected
    test ran to its end (``complete``), and what stopped it early, if anything."""

    exit_status: int
    exit: str
    complete: bool
    stopped: str | None


# Statuses of a session that ran what it collected; any other means it stopped short.
FINISHED = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)


def session_end(exit_status: int, stopped: str | None) -> SessionEnd:
    try:
        name = pytest.ExitCode(exit_status).name
    except ValueError:  # a plugin's own status
        name = str(exit_status)
    complete = exit_status in FINISHED and stopped is None
    return SessionEnd(int(exit_status), name, complete, stopped)


def commit_of(folder: Path) -> dict[str, object] | None:
    """The git HEAD of ``folder`` and whether tracked files differ from it (untracked ones do
    not count); None where git or a repository is missing. Never raises."""
    # The folder's own repository, whatever repository the caller's environment points at.
    environment = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}

    def git(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(folder), *arguments],
            capture_output=True,
            text=True,
            timeout=GIT_SECONDS,
            env=environment,
            check=False,
        )

    try:
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"sha": head.stdout.strip(), "dirty": dirty}


def results_document(
    sections: Sequence[Section],
    records: Sequence[Record],
    facts: StackFacts | None,
    *,
    session: SessionEnd | None = None,
    commit: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The session's results as plain data (``--cudagraph-json``); the shape is
    ``results.schema.json``, described in docs/plugin.md."""
    from pytest_cudagraph import __version__

    document: dict[str, object] = {
        "format": JSON_FORMAT,
        "plugin_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": dict(commit) if commit is not None else None,
        "session": asdict(session) if session is not None else None,
        "stack": asdict(facts) if facts is not None else None,
    }
    for section in sections:
        document[section.name] = section.data_of(records)
    return document


def check_replaceable(path: Path) -> None:
    """ValueError naming the rule unless ``path`` is free or holds an earlier results file of
    this plugin, told by its opening (``OPENING``): a file of the user's, a folder, a symlink
    (never followed), a FIFO or another special file is never written over. OSError where the
    path cannot be looked at (a name too long, a folder that may not be read)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise ValueError(f"is a folder; give a file path such as {path / 'results.json'}")
    if stat.S_ISLNK(mode):
        raise ValueError(
            f"is a symlink, never written through nor replaced ({REPLACED}): give the path of "
            "a new file"
        )
    if not stat.S_ISREG(mode):
        kind = "FIFO" if stat.S_ISFIFO(mode) else "special file"
        raise ValueError(f"is a {kind} ({REPLACED}): give the path of a new file")
    # Not followed and not waited on, should the file have become a link or a FIFO since.
    handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(handle, "rb") as file:
        opening = file.read(OPENING_BYTES)
    if OPENING.match(opening) is None:
        raise ValueError(
            'holds a file that is not results of this plugin (those open with {"format": N, '
            f'"plugin_version": ..., "date": ...}}), and {REPLACED}: give the path of a new '
            "file, or move this one away"
        )


def remove_earlier_results(path: Path) -> None:
    """Remove the results file of an earlier run at ``path``, so that a run that dies leaves
    none rather than stale ones; ValueError (``check_replaceable``) where ``path`` holds
    anything else, which stays as it is."""
    check_replaceable(path)
    path.unlink(missing_ok=True)


def write_json(path: Path, document: Mapping[str, object]) -> None:
    """Write ``document`` to ``path`` as strict JSON (``write_atomically``), where
    ``check_replaceable`` allows it."""
    text = json.dumps(plain(document), indent=2, allow_nan=False) + "\n"
    check_replaceable(path)
    write_atomically(path, text)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by other users (a CI artifact step): a
    reader never sees half a file, and a failed write leaves no file behind. Parent folders
    are made; a symlink at ``path`` is replaced, not written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A short name of its own, so that a long name at ``path`` still has room; mode 0o666 less
    # the umask, as any new file (mkstemp's 0o600 would hide the file from other users).
    temporary = path.parent / f".cudagraph-{secrets.token_hex(8)}.tmp"
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_document(path: Path) -> dict[str, object]:
    """A results file of this plugin's format: a JSON object of format ``JSON_FORMAT``;
    ValueError naming the file otherwise (OSError where it cannot be read). Whether every
    section is there and of its type is ``check_document``'s."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read
        raise ValueError(f"{path}: not a regular file")
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested deeper than a JSON reader goes") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: a results document is a JSON object, got {type(document)}")
    if document.get("format") != JSON_FORMAT:
        raise ValueError(
            f"{path}: results of format {document.get('format')!r}; "
            f"this plugin reads format {JSON_FORMAT}"
        )
    return document


def check_document(document: Mapping[str, object], path: Path) -> None:
    """ValueError naming the file and the first part of ``document`` that is not as
    ``results.schema.json`` describes it (a section missing or of another type)."""
    problem = schema_problem(document, schema())
    if problem:
        raise ValueError(f"{path}: not results as {SCHEMA_FILE} describes them: {problem}")


def schema() -> dict[str, object]:
    """The JSON Schema of a results document (shipped beside this module)."""
    text = importlib.resources.files("pytest_cudagraph").joinpath(SCHEMA_FILE).read_text("utf-8")
    shipped: dict[str, object] = json.loads(text)
    return shipped


# What each JSON Schema type name admits (a bool is no number, as in JSON).
JSON_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "integer": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "number": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
}


def schema_problem(value: object, rule: Mapping[str, Any], path: str = "document") -> str:
    """The first way ``value`` breaks ``rule`` ("" when it keeps it), for the keywords
    ``results.schema.json`` uses; it descends only where the schema does, so a value's own
    depth does not matter."""
    if "oneOf" in rule:  # in results.schema.json, forms of different types: take its type's
        forms = [form for form in rule["oneOf"] if _typed(value, form)]
        if len(forms) != 1:
            names = [name for form in rule["oneOf"] for name in _type_names(form)]
            return f"{path}: must be {' or '.join(names)}, got {_json_type(value)}"
        rule = forms[0]
    if "const" in rule and value != rule["const"]:
        return f"{path}: must be {rule['const']!r}, got {value!r}"
    if "enum" in rule and value not in rule["enum"]:
        return f"{path}: must be one of {', '.join(map(repr, rule['enum']))}, got {value!r}"
    if "type" in rule and not _typed(value, rule):
        return f"{path}: must be {' or '.join(_type_names(rule))}, got {_json_type(value)}"
    if isinstance(value, str):
        if len(value) < rule.get("minLength", 0):
            return f"{path}: must not be empty"
        if "pattern" in rule and re.search(rule["pattern"], value) is None:
            return f"{path}: {value!r} does not match {rule['pattern']}"
    if JSON_TYPES["number"](value):
        if "minimum" in rule and value < rule["minimum"]:
            return f"{path}: must be at least {rule['minimum']}, got {value}"
        if "exclusiveMinimum" in rule and value <= rule["exclusiveMinimum"]:
            return f"{path}: must be more than {rule['exclusiveMinimum']}, got {value}"
    if isinstance(value, list):
        fewest, most = rule.get("minItems", 0), rule.get("maxItems", len(value))
        if not fewest <= len(value) <= most:
            return f"{path}: must hold {fewest} to {most} items, holds {len(value)}"
        for index, item in enumerate(value):
            problem = schema_problem(item, rule.get("items", {}), f"{path}[{index}]")
            if problem:
                return problem
    if isinstance(value, dict):
        missing = [key for key in rule.get("required", ()) if key not in value]
        if missing:
            return f"{path}: {missing[0]!r} is missing"
        known = rule.get("properties", {})
        others = rule.get("additionalProperties", {})
        for key, item in value.items():
            if key not in known and others is False:
                return f"{path}: {key!r} is not one of its keys ({', '.join(known)})"
            item_rule = known.get(key, others if isinstance(others, dict) else {})
            problem = schema_problem(item, item_rule, f"{path}[{key!r}]")
            if problem:
                return problem
    return ""


def _type_names(rule: Mapping[str, Any]) -> list[str]:
    names = rule.get("type", list(JSON_TYPES))
    return [names] if isinstance(names, str) else list(names)


def _typed(value: object, rule: Mapping[str, Any]) -> bool:
    return any(JSON_TYPES[name](value) for name in _type_names(rule))


def _json_type(value: object) -> str:
    return next((name for name, admits in JSON_TYPES.items() if admits(value)), type_name(value))
