"""The conformance table at the end of the run: one row per check with its verdict, the seconds
its body took and the figure behind it (cases, max |diff|, MiB), or why it skipped or failed.

Rows are built from test reports, so under xdist they are built in the controller from what
the workers sent: a check records its figure with ``record_for_summary(item, "conformance",
text)``, which travels in the report's ``user_properties``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from pytest_cudagraph import report as reports
from pytest_cudagraph.target import describe_spec

PACKAGE_PATH = "pytest_cudagraph/conformance/"
FIGURE_PROPERTY = reports.RECORD_PREFIX + "conformance"
FAILED = ("FAILED", "ERROR")


@dataclass
class CheckRow:
    check: str
    verdict: str = "not run"
    seconds: float | None = None
    figure: str = ""
    reason: str = ""


def check_name(location: tuple[str, int | None, str]) -> str | None:
    """A report's location ``(path, line, "test_parity")`` -> ``"parity"`` when the path is a
    module of the conformance package; None otherwise. (Node ids cannot tell: a package
    outside the rootdir gets ids relative to the package itself.)"""
    path, _, function = location
    if PACKAGE_PATH not in path.replace("\\", "/") or not function.startswith("test_"):
        return None
    return function.removeprefix("test_").replace("_", " ")


def register(config: pytest.Config, target_spec: str | None) -> None:
    """Collect conformance rows in this process and add the table to the "cudagraph" summary.
    ``target_spec`` None: the default target, looked up only if the table is shown."""
    summary = ConformanceSummary(target_spec)
    config.pluginmanager.register(summary, "cudagraph-conformance-summary")
    reports.add_summary_renderer(config, summary.lines)


class ConformanceSummary:
    """Collects the rows from reports (a pytest plugin object) and renders the table."""

    def __init__(self, target_spec: str | None) -> None:
        self.target_spec = target_spec
        self.rows: dict[str, CheckRow] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = check_name(report.location)
        if name is None:
            return
        row = self.rows.setdefault(report.location[0] + "::" + name, CheckRow(name))
        for key, value in report.user_properties:
            if key == FIGURE_PROPERTY:
                row.figure = str(value)
        if report.when == "call":
            row.seconds = report.duration
        if report.failed:
            if row.verdict not in FAILED:  # the first failure is the one to show
                row.verdict = "FAILED" if report.when == "call" else "ERROR"
                row.reason = _failure_line(report)
        elif report.skipped:
            row.verdict = "skipped"
            row.reason = reports.skip_reason(report) or str(report.longrepr)
        elif report.when == "call":
            row.verdict = "passed"

    def target_name(self) -> str:
        """The target's name or spec, as the table and the JSON results show it."""
        return describe_spec(self.target_spec)

    def lines(self, records: object = None) -> list[str]:
        """The table (a summary renderer: the plugin's records are not needed)."""
        if not self.rows:
            return []
        rows = [self.rows[key] for key in sorted(self.rows)]
        counts = Counter("failed" if row.verdict in FAILED else row.verdict for row in rows)
        tally = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
        title = f"conformance of {self.target_name()} ({tally}):"
        return [title, *format_table(rows)]


def format_table(rows: list[CheckRow]) -> list[str]:
    """Aligned columns: check, verdict, seconds, then the figure or the reason."""
    width = max(len("check"), *(len(row.check) for row in rows))
    lines = [f"  {'check':<{width}}  {'verdict':<7}  {'seconds':>7}  figure"]
    for row in rows:
        seconds = f"{row.seconds:7.1f}" if row.seconds is not None else f"{'-':>7}"
        detail = "; ".join(text for text in (row.figure, row.reason) if text)
        lines.append(f"  {row.check:<{width}}  {row.verdict:<7}  {seconds}  {detail}")
    return lines


def _failure_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr)
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first[:200]
