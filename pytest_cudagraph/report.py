"""What the plugin reports: the header, the "cudagraph" terminal summary and the JSON results.

Summary data travels as records: a test appends ``("cudagraph_<kind>", value)`` to its
``user_properties`` (``record_for_summary``), which xdist carries to the controller with
the report; the controller gathers them (``records_from``), renderers turn them into
lines and ``results_document`` into the ``--cudagraph-json`` file. Other modules add a
section by recording their own kind and registering a renderer with
``add_summary_renderer(config, renderer)``. torch is imported only by ``stack_facts``.
"""

from __future__ import annotations

import datetime
import json
import platform
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from pytest_cudagraph import devices
from pytest_cudagraph.devices import DeviceBinding, StrayCheck

GiB = 1024**3
RECORD_PREFIX = "cudagraph_"
JSON_FORMAT = 1


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
class SummaryRecord:
    kind: str
    nodeid: str
    value: object


SummaryRenderer = Callable[[Sequence[SummaryRecord]], list[str]]
SUMMARY_RECORDS = pytest.StashKey[list[SummaryRecord]]()
SUMMARY_RENDERERS = pytest.StashKey[list[SummaryRenderer]]()


def record_for_summary(item: pytest.Item, kind: str, value: object) -> None:
    """Record ``value`` (plain data: it may travel from an xdist worker) for the summary."""
    item.user_properties.append((RECORD_PREFIX + kind, value))


def add_summary_renderer(config: pytest.Config, renderer: SummaryRenderer) -> None:
    """Add lines to the "cudagraph" summary, rendered from all records after the built-in ones."""
    config.stash.setdefault(SUMMARY_RENDERERS, []).append(renderer)


def records_from(report: pytest.TestReport | pytest.CollectReport) -> list[SummaryRecord]:
    """The records in one report; every skip is one too (so the summary counts what pytest
    counts)."""
    records = []
    if getattr(report, "when", None) == "call":
        for name, value in report.user_properties:
            if name.startswith(RECORD_PREFIX):
                records.append(
                    SummaryRecord(name.removeprefix(RECORD_PREFIX), report.nodeid, value)
                )
    reason = skip_reason(report)
    if reason is not None:
        records.append(SummaryRecord("skip", report.nodeid, reason))
    return records


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """Why a test skipped; None when it did not (or xfailed: an xfail's longrepr is a
    traceback, a skip's is (path, line, reason))."""
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return None
    return str(report.longrepr[2]).removeprefix("Skipped: ")


def skip_lines(records: Sequence[SummaryRecord]) -> list[str]:
    reasons = Counter(record.value for record in records if record.kind == "skip")
    if not reasons:
        return []
    return [
        "skips by reason:",
        *(f"  {count} x {reason}" for reason, count in reasons.most_common()),
    ]


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


def summary_lines(
    records: Sequence[SummaryRecord],
    renderers: Sequence[SummaryRenderer],
    stray_checks: Sequence[StrayCheck],
    stray_mode: str,
) -> list[str]:
    lines = []
    for renderer in renderers:
        lines += renderer(records)
    return lines + skip_lines(records) + stray_lines(stray_checks, stray_mode)


def results_document(
    records: Sequence[SummaryRecord],
    facts: StackFacts | None,
    pinned_stack: Mapping[str, object] | None,
    conformance: Mapping[str, object] | None,
    stray_checks: Sequence[StrayCheck],
) -> dict[str, object]:
    """The session's results as plain data (``--cudagraph-json``); see docs/plugin.md."""
    by_kind: dict[str, list[dict[str, object]]] = {}
    for record in records:
        if record.kind != "skip":
            by_kind.setdefault(record.kind, []).append(
                {"nodeid": record.nodeid, "value": record.value}
            )
    skips = Counter(record.value for record in records if record.kind == "skip")
    return {
        "format": JSON_FORMAT,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "stack": asdict(facts) if facts is not None else None,
        "pinned_stack": pinned_stack,
        "parity": by_kind.pop("parity", []),
        "memory": by_kind.pop("memory", []),
        "conformance": conformance,
        "skips": {
            "total": sum(skips.values()),
            "by_reason": [{"reason": reason, "count": n} for reason, n in skips.most_common()],
        },
        "stray_contexts": [asdict(check) for check in stray_checks],
        "other_records": by_kind,
    }


def write_json(path: Path, document: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
