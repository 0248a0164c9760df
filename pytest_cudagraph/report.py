"""The report header and the "cudagraph" terminal summary, as pure functions of data.

Summary data travels as records: a test appends ``("cudagraph_<kind>", value)`` to its
``user_properties`` (``record_for_summary``), which xdist carries to the controller with
the report; the controller gathers them (``records_from``) and renderers turn them into
lines. Other modules add a section by recording their own kind and registering a
renderer with ``add_summary_renderer(config, renderer)``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pytest

from pytest_cudagraph.devices import DeviceBinding, GpuInfo, NvmlStatus, StrayCheck
from pytest_cudagraph.stack import RunningStack

GiB = 1024**3
RECORD_PREFIX = "cudagraph_"


@dataclass(frozen=True)
class Environment:
    """What the header reports."""

    torch_version: str
    running: RunningStack
    nvml: NvmlStatus
    gpus: list[GpuInfo]
    stack_mismatches: list[str]
    binding: DeviceBinding


def header_lines(env: Environment) -> list[str]:
    driver = env.nvml.detail if env.nvml.available else "n/a"
    gpus = ", ".join(
        f"{gpu.device} {gpu.name} ({gpu.total_bytes / GiB:.1f} GiB)" for gpu in env.gpus
    )
    nvml = "ok" if env.nvml.available else f"unavailable ({env.nvml.detail})"
    pinned = "no (" + "; ".join(env.stack_mismatches) + ")" if env.stack_mismatches else "yes"
    return [
        f"cudagraph: python {env.running.python}, torch {env.torch_version}, "
        f"torch CUDA {env.running.cuda or 'none'}, driver {driver}",
        f"cudagraph: GPUs: {gpus or 'none (torch.cuda.is_available() is False)'}",
        f"cudagraph: NVML: {nvml}; pinned stack: {pinned}",
        f"cudagraph: device {env.binding.device} ({env.binding.how})",
    ]


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


def records_from(report: pytest.TestReport, marker_names: Iterable[str]) -> list[SummaryRecord]:
    """The records in one test report; a skip of a test carrying one of our markers is one too."""
    records = []
    if report.when == "call":
        for name, value in report.user_properties:
            if name.startswith(RECORD_PREFIX):
                records.append(
                    SummaryRecord(name.removeprefix(RECORD_PREFIX), report.nodeid, value)
                )
    reason = skip_reason(report)
    if reason is not None and any(name in report.keywords for name in marker_names):
        records.append(SummaryRecord("skip", report.nodeid, reason))
    return records


def skip_reason(report: pytest.TestReport) -> str | None:
    """Why a test skipped; None when it did not (or xfailed: an xfail's longrepr is a
    traceback, a skip's is (path, line, reason))."""
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return None
    return str(report.longrepr[2]).removeprefix("Skipped: ")


def parity_lines(records: Sequence[SummaryRecord]) -> list[str]:
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for record in records:
        if record.kind == "parity":
            counts = totals[record.nodeid, record.value["form"]]
            counts[0] += record.value["checked"]
            counts[1] += record.value["passed"]
    if not totals:
        return []
    checked = sum(counts[0] for counts in totals.values())
    passed = sum(counts[1] for counts in totals.values())
    lines = [f"parity: {passed} of {checked} checked cases match"]
    for (nodeid, form), (test_checked, test_passed) in totals.items():
        unit = "cases" if form == "cases" else "toggled run pairs"
        lines.append(f"  {nodeid}: {test_passed} of {test_checked} {unit} match")
    return lines


def memory_lines(records: Sequence[SummaryRecord]) -> list[str]:
    lines = []
    for record in records:
        if record.kind == "memory":
            figures = record.value
            verdict = "ok" if figures["passed"] else "OVER"
            lines.append(
                f"  {record.nodeid} on {figures['device']}: {figures['growth_mib']:+.1f} MiB "
                f"of {figures['bound_mib']:g} MiB bound {verdict}; "
                f"peak {figures['peak_growth_mib']:+.1f} MiB; "
                f"torch reserved {figures['torch_reserved_growth_mib']:+.1f} MiB, "
                f"outside torch {figures['outside_torch_growth_mib']:+.1f} MiB"
            )
    return ["memory growth across the test body (NVML, this process):", *lines] if lines else []


def skip_lines(records: Sequence[SummaryRecord]) -> list[str]:
    reasons = Counter(record.value for record in records if record.kind == "skip")
    if not reasons:
        return []
    return [
        "skips by reason:",
        *(f"  {count} x {reason}" for reason, count in reasons.most_common()),
    ]


BUILTIN_RENDERERS: tuple[SummaryRenderer, ...] = (parity_lines, memory_lines, skip_lines)


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
    for renderer in (*BUILTIN_RENDERERS, *renderers):
        lines += renderer(records)
    return lines + stray_lines(stray_checks, stray_mode)
