"""The one route of the plugin's results: records, sections, the terminal summary and the JSON.

A test records plain data with ``record(item, kind, value)``: it travels, in an envelope whose
run token tells it from a user's own ``record_property``, in the report's ``user_properties``
(xdist carries it to the controller), where ``records_from`` gathers it together with one
``phase`` record per report (outcome, duration, whole reason, the user's properties as JSON
holds them). A ``Section`` turns the session's records into data once (``Section.data``); the
"cudagraph" terminal summary renders that data (``Section.lines``), ``--cudagraph-json``
writes it under the section's name, over nothing but an earlier results file, and the
Markdown report (pytest_cudagraph.report_markdown) renders it again from the file, so every
reader reads fields, never text. The document's shape is ``results.schema.json`` beside this
module. torch is imported only by ``stack_facts``.
"""

from __future__ import annotations

import datetime
import importlib.resources
import json
import math
import os
import platform
import re
import secrets
import stat
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.devices import DeviceBinding, StrayCheck
from pytest_cudagraph.engines.units import GiB

RECORD_PREFIX = "cudagraph_"
ENVELOPE = "pytest_cudagraph"  # the key of a recorded value in its envelope
TOKEN = "run"  # the key of the run token in an envelope
# How deep plain data nests: a user's property past it is cut (``plain``), a record refused.
MAX_NESTING = 64
PLAIN_DATA = "dicts with string keys, lists, tuples, strings, numbers, bools and None"
NOT_JSON = "not JSON: "  # how the description of a value JSON cannot hold opens
JSON_FORMAT = 2
SCHEMA_FILE = "results.schema.json"
PHASE = "phase"  # the kind of the record every report gives (not recordable by hand)
# The document's own keys, and the sections plugin.py always adds last: names no other
# section may take.
DOCUMENT_KEYS = frozenset(("format", "plugin_version", "date", "commit", "session", "stack"))
STRAY_CONTEXTS = "stray_contexts"
# Set on a report of a test that uses the plugin (its markers, fixtures or conformance
# checks); a plain attribute, so it travels from xdist workers.
USES_PLUGIN = "cudagraph_uses_plugin"
GIT_SECONDS = 10
# Every results file this plugin writes, of any format, opens with these keys in this order:
# how an earlier results file is told from a file of the user's at the same path.
OPENING = re.compile(
    rb'\s*\{\s*"format"\s*:\s*[0-9]+\s*,\s*"plugin_version"\s*:\s*"[^"]*"\s*,\s*"date"\s*:'
)
OPENING_BYTES = 512  # read to tell a results file by its opening: far more than it needs
REPLACED = "only the results file of an earlier run is ever replaced"


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


# Records


@dataclass(frozen=True)
class Record:
    """One piece of plain data a test recorded (``kind`` names the section that reads it)."""

    kind: str
    nodeid: str
    value: Any  # JSON-shaped, as it came through the report; its kind's section knows the shape


# This process's run token: every envelope carries it, so that a value a user gives
# record_property in the envelope's shape is never read as the plugin's. An xdist worker takes
# its controller's (``join_run``), so that the controller reads the workers' envelopes.
_run = {"token": secrets.token_hex(16)}


def run_token() -> str:
    """The token the envelopes of this run carry (an xdist controller hands it to workers)."""
    return _run["token"]


def join_run(token: str) -> None:
    """Carry ``token``, the controller's, in this xdist worker's envelopes."""
    if not isinstance(token, str) or not token:
        raise TypeError(f"a run token is a non-empty string, got {token!r}")
    _run["token"] = token


def envelope(kind: str, value: object) -> tuple[str, dict[str, object]]:
    """The ``user_properties`` entry that carries a record (what ``record`` appends)."""
    if not isinstance(kind, str):
        raise TypeError(f"a record's kind must be a string, got {kind!r}")
    if not kind or kind == PHASE:
        raise ValueError(f"a record's kind must be a non-empty name other than {PHASE!r}")
    return (RECORD_PREFIX + kind, {ENVELOPE: value, TOKEN: run_token()})


def record(item: pytest.Item, kind: str, value: object) -> None:
    """Record ``value`` for the sections: plain data (JSON's types, ``check_plain``), as it
    may travel from an xdist worker and goes into the results file."""
    check_plain(value, f"record {kind!r}")
    item.user_properties.append(envelope(kind, value))


def check_plain(value: object, path: str, ancestors: tuple[int, ...] = ()) -> None:
    """TypeError naming the part of ``value`` that is not plain data: dicts with string keys,
    lists and tuples, strings, numbers, bools and None, nested at most ``MAX_NESTING`` deep
    and holding no container that holds it."""
    if value is None or isinstance(value, (str, int, float)):
        return
    if not isinstance(value, (dict, list, tuple)):
        raise TypeError(
            f"{path}: a value of type {_type_name(value)} is not plain data ({PLAIN_DATA})"
        )
    if id(value) in ancestors or len(ancestors) == MAX_NESTING:
        why = "holds itself" if id(value) in ancestors else f"is deeper than {MAX_NESTING} levels"
        raise TypeError(f"{path}: {why} ({PLAIN_DATA})")
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(value, dict) and not isinstance(key, str):
            raise TypeError(f"{path}: the key {key!r} is not a string ({PLAIN_DATA})")
        check_plain(item, f"{path}[{key!r}]", (*ancestors, id(value)))


def plugin_values(properties: Iterable[object]) -> list[tuple[str, object]]:
    """(kind, value) of each entry of ``properties`` that ``record`` wrote, in order."""
    found = []
    for entry in properties:
        name, value = _pair(entry)
        if _is_envelope(name, value):
            assert isinstance(name, str) and isinstance(value, dict)
            found.append((name.removeprefix(RECORD_PREFIX), value[ENVELOPE]))
    return found


def foreign_properties(properties: Iterable[object]) -> list[list[object]]:
    """The user's own properties (``record_property``): every entry ``record`` did not write,
    as [name, value]; a value of our prefix that is not ours is kept here, never read as ours."""
    pairs = (_pair(entry) for entry in properties)
    return [[name, value] for name, value in pairs if not _is_envelope(name, value)]


def _pair(entry: object) -> tuple[object, object]:
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return entry[0], entry[1]
    return None, entry


def _is_envelope(name: object, value: object) -> bool:
    return (
        isinstance(name, str)
        and name.startswith(RECORD_PREFIX)
        and name != RECORD_PREFIX + PHASE  # never recorded by hand (``envelope`` refuses it)
        and isinstance(value, dict)
        and value.keys() == {ENVELOPE, TOKEN}
        and value[TOKEN] == run_token()
    )


def records_from(report: pytest.TestReport | pytest.CollectReport) -> list[Record]:
    """The records in one report: what its test recorded (from the call's report, which holds
    everything recorded up to then), then the report's own ``phase`` record. Collection gives
    a phase record only where it failed or skipped."""
    found = []
    if report.when == "call":
        found += [Record(kind, report.nodeid, v) for kind, v in plugin_values(_properties(report))]
    if report.when != "collect" or not report.passed:
        found.append(Record(PHASE, report.nodeid, phase_of(report)))
    return found


def _properties(report: pytest.TestReport | pytest.CollectReport) -> list[object]:
    return list(getattr(report, "user_properties", ()))


def phase_of(report: pytest.TestReport | pytest.CollectReport) -> dict[str, object]:
    """One report as plain data: its phase, outcome (as pytest counts it), seconds, whole
    reason, whether its test uses the plugin (a marker or fixture of it, or a record for it,
    as each conformance check holds from collection on), and the user's own properties."""
    recorded = bool(plugin_values(_properties(report)))
    return {
        "when": report.when,
        "outcome": outcome_of(report),
        "duration": float(getattr(report, "duration", 0.0)),
        "reason": reason_of(report),
        "uses_plugin": recorded or bool(getattr(report, USES_PLUGIN, False)),
        "worker": getattr(report, "worker_id", None),
        "properties": [
            [plain(name), plain(value)] for name, value in foreign_properties(_properties(report))
        ],
    }


def outcome_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """passed, failed, skipped, error (a failure outside the call), xfailed, xpassed, or what
    another plugin names (pytest-rerunfailures' rerun)."""
    if hasattr(report, "wasxfail"):
        if report.skipped:
            return "xfailed"
        if report.passed:
            return "xpassed"
    if report.failed and report.when != "call":
        return "error"
    return report.outcome


def reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """Why the report is not a plain pass, whole ("" for a pass): the failure's message, the
    skip's or the xfail's reason (``one_line`` gives it in one line)."""
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail).strip()
    if report.passed:
        return ""
    skip = skip_reason(report)
    return skip.strip() if skip is not None else failure_reason(report)


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """Why a test skipped; None when it did not (or xfailed: an xfail's longrepr is a
    traceback, a skip's is (path, line, reason))."""
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return None
    return str(report.longrepr[2]).removeprefix("Skipped: ")


def failure_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """What failed, every line of it: the exception's message, else the report's text."""
    crash = getattr(report.longrepr, "reprcrash", None)
    return (crash.message if crash is not None else str(report.longrepr or "")).strip()


def one_line(reason: str) -> str:
    """A reason in one line, for a table row or a summary line: its first line, and where that
    line only introduces what follows ("1 of 2 dry calls failed:"), the first thing it
    introduces, so that the line names a problem."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


# Sections


@dataclass(frozen=True)
class Section:
    """One part of the results: ``data(records)`` gives its plain data, ``lines(data)`` the
    terminal summary's lines of that data (none when there is nothing to say). ``name`` is its
    key in the JSON."""

    name: str
    data: Callable[[Sequence[Record]], object | None]
    lines: Callable[[Any], list[str]] = lambda data: []  # takes what ``data`` gave

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a section's name must be a non-empty string, got {self.name!r}")
        for part in ("data", "lines"):
            if not callable(getattr(self, part)):
                raise TypeError(f"section {self.name!r}: {part} must be callable")

    def data_of(self, records: Sequence[Record]) -> object:
        """``data(records)``; a ValueError naming the section where it raises."""
        try:
            return self.data(records)
        except Exception as error:
            raise ValueError(
                f"the {self.name!r} section's data failed: {_failure(error)}"
            ) from error

    def summary(self, records: Sequence[Record]) -> list[str]:
        """The section's summary lines; one that fails, or gives anything but a list of
        strings, says so in a line rather than ending the run's summary."""
        try:
            lines = self.lines(self.data(records))
        except Exception as error:
            return [f"the {self.name!r} section's summary failed: {_failure(error)}"]
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            return [f"the {self.name!r} section's lines must be a list of strings"]
        return lines


SECTIONS = pytest.StashKey[list[Section]]()


def add_section(config: pytest.Config, section: Section) -> None:
    """Add ``section`` to the session's results, after those added before it."""
    if not isinstance(section, Section):
        raise TypeError(f"add_section takes a results.Section, got {_type_name(section)}")
    sections = config.stash.setdefault(SECTIONS, [])
    if section.name in DOCUMENT_KEYS | {TESTS.name, SKIPS.name, STRAY_CONTEXTS}:
        raise ValueError(f"{section.name!r} is a name the results document keeps for itself")
    if any(known.name == section.name for known in sections):
        raise ValueError(f"a results section named {section.name!r} is already registered")
    sections.append(section)


def sections_of(config: pytest.Config) -> list[Section]:
    sections: list[Section] = config.stash.get(SECTIONS, [])
    return list(sections)


@dataclass
class Run:
    """One run of a test as the ``tests`` section gives it."""

    nodeid: str
    outcome: str = "unfinished"
    when: str = "setup"
    duration: float = 0.0
    reason: str = ""
    properties: list[list[object]] = field(default_factory=list)

    def take(self, phase: Mapping[str, Any]) -> None:
        """Fold in one phase: the first failure stands; a set-up or teardown that passed
        decides nothing."""
        self.duration += phase["duration"]
        self.properties = phase["properties"]
        if self.outcome in ("failed", "error"):
            return
        if phase["outcome"] == "passed" and phase["when"] != "call":
            return
        self.outcome, self.when, self.reason = phase["outcome"], phase["when"], phase["reason"]


def tests_data(records: Sequence[Record]) -> list[dict[str, object]]:
    """One entry per run of a test (a test run twice, by --keep-duplicates or a rerun plugin,
    has two), and one per collection error or skip: nodeid, outcome, the phase that decided
    it, seconds over its phases, the one-line reason, the user's own properties. A test whose
    phases stopped short (an interrupted run) is "unfinished"."""
    runs: list[Run] = []
    running: dict[tuple[str, object], Run] = {}  # by nodeid and xdist worker
    for nodeid, phase in phases(records):
        key = (nodeid, phase["worker"])
        run = running.get(key)
        if run is None or phase["when"] in ("setup", "collect"):
            run = running[key] = Run(nodeid)
            runs.append(run)
        run.take(phase)
    return [asdict(run) for run in runs]


def phases(records: Sequence[Record]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(nodeid, phase) of each ``phase`` record (see ``phase_of``), in order."""
    for record in records:
        if record.kind == PHASE:
            assert isinstance(record.value, Mapping)
            yield record.nodeid, record.value


def tests_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each of the user's properties that JSON could not hold whole (``plain``)."""
    described = [
        f"  {run['nodeid']}: {name!r}"
        for run in runs
        for name, value in run["properties"]
        if _holds_description(value)
    ]
    if not described:
        return []
    return ["record_property values JSON cannot hold, kept as descriptions:", *described]


def _holds_description(value: object) -> bool:
    if isinstance(value, str):
        return value.startswith(NOT_JSON)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return any(_holds_description(item) for item in items)


TESTS = Section("tests", tests_data, tests_lines)


def skips_data(records: Sequence[Record]) -> dict[str, object]:
    """The skips of tests that use the plugin, by reason (a user's other skips are theirs)."""
    reasons = Counter(
        str(phase["reason"])
        for _, phase in phases(records)
        if phase["outcome"] == "skipped" and phase["uses_plugin"]
    )
    return {
        "total": sum(reasons.values()),
        "by_reason": [{"reason": reason, "count": n} for reason, n in reasons.most_common()],
    }


def skips_lines(data: object) -> list[str]:
    assert isinstance(data, Mapping)
    if not data["total"]:
        return []
    return [
        "skips by reason:",
        *(f"  {entry['count']} x {one_line(entry['reason'])}" for entry in data["by_reason"]),
    ]


SKIPS = Section("skips", skips_data, skips_lines)


def stray_lines(checks: Sequence[StrayCheck], mode: str) -> list[str]:
    if not checks:
        return []
    strays = [f"  {check.process}: {stray}" for check in checks for stray in check.strays]
    notes = [f"  {check.process}: {check.note}" for check in checks if check.note]
    if strays:
        consequence = "fail the run" if mode == "fail" else "reported only"
        head = f"stray CUDA contexts (on a GPU other than the process's own; {consequence}):"
    else:
        head = f"stray CUDA contexts: none ({len(checks)} process(es) checked)"
    return [head, *strays, *notes]


def summary_lines(sections: Sequence[Section], records: Sequence[Record]) -> list[str]:
    """The "cudagraph" terminal summary: each section's lines, in order."""
    return [line for section in sections for line in section.summary(records)]


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


def plain(value: object, ancestors: tuple[int, ...] = ()) -> object:
    """``value`` as strict JSON holds it, never raising: a non-finite float becomes its name
    ("nan", "inf", "-inf"), a tuple a list, a mapping whose keys print alike (``{1: a, "1":
    b}``) a list of [key, value] pairs, any other object its ``str``. What JSON cannot hold is
    described, in text opening with ``NOT_JSON``: a container that holds itself or nests
    deeper than ``MAX_NESTING``, an int too long for JSON's decimal form (kept in hex), an
    object whose ``str`` raises."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _has_decimal_form(value) else f"{NOT_JSON}an int, in hex {value:#x}"
    if value is None or isinstance(value, (str, bool)):
        return value
    if not isinstance(value, (Mapping, list, tuple)):
        return _text(value)
    if id(value) in ancestors:
        return f"{NOT_JSON}a {_type_name(value)} that holds itself"
    if len(ancestors) == MAX_NESTING:
        return f"{NOT_JSON}a {_type_name(value)} nested deeper than {MAX_NESTING} levels"
    inner = (*ancestors, id(value))
    if not isinstance(value, Mapping):
        return [plain(item, inner) for item in value]
    items = [
        (key if isinstance(key, str) else _text(key), key, item) for key, item in value.items()
    ]
    if len({text for text, _, _ in items}) == len(items):
        return {text: plain(item, inner) for text, _, item in items}
    return [[plain(key, inner), plain(item, inner)] for _, key, item in items]


def _has_decimal_form(number: int) -> bool:
    try:
        int.__repr__(number)  # refused past sys.get_int_max_str_digits() (Python 3.11 on)
    except ValueError:
        return False
    return True


def _text(value: object) -> str:
    """``str(value)``, or a description where the user's ``__str__`` raises."""
    try:
        return str(value)
    except Exception as error:  # its error's own text may raise too: named by its type
        return f"{NOT_JSON}a {_type_name(value)} whose str() raised {_type_name(error)}"


def _failure(error: Exception) -> str:
    return f"{_type_name(error)}: {_text(error)}"


def _type_name(value: object) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


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
    """Write ``document`` to ``path`` atomically, as strict JSON readable by other users (a CI
    artifact step), where ``check_replaceable`` allows it: a reader never sees half a file,
    and a failed write leaves no file behind."""
    text = json.dumps(plain(document), indent=2, allow_nan=False) + "\n"
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A short name of its own, so that a long results name still has room; mode 0o666 less
    # the umask, as any new file (mkstemp's 0o600 would hide the file from other users).
    temporary = path.parent / f".cudagraph-results-{secrets.token_hex(8)}.tmp"
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
    return json.loads(text)


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
    return next((name for name, admits in JSON_TYPES.items() if admits(value)), _type_name(value))
