"""The one route of the plugin's results: records, sections, the terminal summary and the JSON.

A test records plain data with ``record(item, kind, value)``: it travels in the report's
``user_properties`` (xdist carries it to the controller), where ``records_from`` gathers it.
A ``Section`` turns the session's records into data once (``Section.data``); the "cudagraph"
terminal summary renders that data (``Section.lines``) and ``--cudagraph-json`` writes it under
the section's name, so every reader, scripts included, reads fields, never text. The markers,
the conformance table, the skips and the stray-context check are sections; other plugins add
theirs with ``add_section(config, section)``. torch is imported only by ``stack_facts``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.devices import DeviceBinding, StrayCheck
from pytest_cudagraph.engines.units import GiB

RECORD_PREFIX = "cudagraph_"
JSON_FORMAT = 2


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


@dataclass(frozen=True)
class Record:
    """One piece of plain data a test recorded (``kind`` names the section that reads it)."""

    kind: str
    nodeid: str
    value: object


def record(item: pytest.Item, kind: str, value: object) -> None:
    """Record ``value`` (plain data: it may travel from an xdist worker) for the sections."""
    item.user_properties.append((RECORD_PREFIX + kind, value))


def records_from(report: pytest.TestReport | pytest.CollectReport) -> list[Record]:
    """The records in one report; every skip is one too (so the summary counts what pytest
    counts)."""
    found = []
    if getattr(report, "when", None) == "call":
        for name, value in report.user_properties:
            if name.startswith(RECORD_PREFIX):
                found.append(Record(name.removeprefix(RECORD_PREFIX), report.nodeid, value))
    reason = skip_reason(report)
    if reason is not None:
        found.append(Record("skip", report.nodeid, reason))
    return found


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """Why a test skipped; None when it did not (or xfailed: an xfail's longrepr is a
    traceback, a skip's is (path, line, reason))."""
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return None
    return str(report.longrepr[2]).removeprefix("Skipped: ")


@dataclass(frozen=True)
class Section:
    """One part of the results: ``data(records)`` gives its plain data, ``lines(data)`` the
    terminal summary's lines of that data (none when there is nothing to say). ``name`` is its
    key in the JSON."""

    name: str
    data: Callable[[Sequence[Record]], object | None]
    lines: Callable[[object], list[str]] = lambda data: []


SECTIONS = pytest.StashKey[list[Section]]()


def add_section(config: pytest.Config, section: Section) -> None:
    """Add ``section`` to the session's results, after those added before it."""
    sections = config.stash.setdefault(SECTIONS, [])
    if any(known.name == section.name for known in sections):
        raise ValueError(f"a results section named {section.name!r} is already registered")
    sections.append(section)


def sections_of(config: pytest.Config) -> list[Section]:
    return list(config.stash.get(SECTIONS, []))


def skips_data(records: Sequence[Record]) -> dict[str, object]:
    reasons = Counter(str(record.value) for record in records if record.kind == "skip")
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
        *(f"  {entry['count']} x {entry['reason']}" for entry in data["by_reason"]),
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
    return [line for section in sections for line in section.lines(section.data(records))]


def results_document(
    sections: Sequence[Section], records: Sequence[Record], facts: StackFacts | None
) -> dict[str, object]:
    """The session's results as plain data (``--cudagraph-json``); see docs/plugin.md."""
    from pytest_cudagraph import __version__

    document: dict[str, object] = {
        "format": JSON_FORMAT,
        "plugin_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "stack": asdict(facts) if facts is not None else None,
    }
    for section in sections:
        document[section.name] = section.data(records)
    return document


def write_json(path: Path, document: Mapping[str, object]) -> None:
    """Write ``document`` to ``path`` atomically: a reader never sees half a file, and a failed
    write leaves no file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2, default=str) + "\n"
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
