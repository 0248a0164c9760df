"""Sections: the parts of the results, each the session's records turned into data once.

A ``Section`` gives its plain data (``data(records)``), which the JSON file holds under its
name, and the "cudagraph" terminal summary's lines of that data; the Markdown report renders
the data again from the file, so every reader reads fields, never text. Here are the sections
the document always has (each test's runs, the skips, the stray-context check); the markers
and other plugins declare theirs through the ``pytest_cudagraph_results_sections`` hook.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_cudagraph.engines.devices import StrayCheck
from pytest_cudagraph.reasons import one_line
from pytest_cudagraph.records import NOT_JSON, PHASE, Record, text_of, type_name

STRAY_CONTEXTS = "stray_contexts"  # the stray-context check's section (plugin.py makes it)


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


def _failure(error: Exception) -> str:
    return f"{type_name(error)}: {text_of(error)}"


def summary_lines(sections: Sequence[Section], records: Sequence[Record]) -> list[str]:
    """The "cudagraph" terminal summary: each section's lines, in order."""
    return [line for section in sections for line in section.summary(records)]


# Each test's runs


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
    """(nodeid, phase) of each ``phase`` record (see ``records.phase_of``), in order."""
    for record in records:
        if record.kind == PHASE:
            assert isinstance(record.value, Mapping)
            yield record.nodeid, record.value


def tests_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each of the user's properties that JSON could not hold whole (its name or
    its value described, ``records.plain``)."""
    described = [
        f"  {run['nodeid']}: {name!r}"
        for run in runs
        for name, value in run["properties"]
        if _holds_description(name) or _holds_description(value)
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


# The skips


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
    """The stray-context check's summary lines (``mode``: the stray-contexts setting)."""
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
