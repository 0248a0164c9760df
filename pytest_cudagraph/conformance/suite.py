"""The conformance suite's pytest plugin (entry point ``pytest_cudagraph_conformance``): the
session's target, chosen once, the ``conformance_target`` fixture, and the conformance table.

The table has one row per check with its verdict, the seconds its body took and the figure
behind it (cases, max |diff|, MiB), or why it skipped or failed. Rows are built from test
reports, so under xdist they are built in the controller from what the workers sent: the
suite's conftest labels each check (``CHECK_PROPERTY``) and a check records its figure with
``results.record(item, "conformance", text)``; both travel in the report's ``user_properties``.
Like the core plugin, this one runs in every session and imports torch only when the suite's
target is built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_cudagraph import results, settings
from pytest_cudagraph.conformance import target

if TYPE_CHECKING:
    from pytest_cudagraph.conformance.target import CudaGraphTarget

CHECK_PROPERTY = results.RECORD_PREFIX + "check"  # the check's name, on each of its reports
FIGURE_PROPERTY = results.RECORD_PREFIX + "conformance"
FAILED = ("FAILED", "ERROR")
TARGET_SPEC = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    if settings.SNAPSHOT not in config.stash:  # the core plugin is disabled (-p no:...)
        return
    chosen = settings.snapshot(config).value(settings.TARGET)
    spec = None if chosen is None else str(chosen)
    if spec is not None:  # loaded now, so that a bad one is a usage error before the run
        target.load_factory(spec, search_paths=(config.rootpath, config.invocation_params.dir))
    config.stash[TARGET_SPEC] = spec
    table = ConformanceTable(spec)
    config.pluginmanager.register(table, "cudagraph-conformance-table")
    results.add_section(config, results.Section("conformance", table.data, table.lines))


def chosen_target_spec(config: pytest.Config) -> str | None:
    """The target the session chose (``--cudagraph-target`` and its kin), or None for the
    default; resolved once, when the session was configured."""
    return config.stash[TARGET_SPEC]


@pytest.fixture(scope="session")
def conformance_target(request: pytest.FixtureRequest) -> CudaGraphTarget:
    """The conformance suite's target (``--cudagraph-target``), built once per session on
    ``cuda_device``, or on the CPU without CUDA (for the checks that need no GPU)."""
    return target.session_target(request, chosen_target_spec(request.config))


@dataclass
class CheckRow:
    check: str
    verdict: str = "not run"
    seconds: float | None = None
    figure: str = ""
    reason: str = ""


class ConformanceTable:
    """Collects the rows from reports (a pytest plugin object) and gives the table's data."""

    def __init__(self, target_spec: str | None) -> None:
        self.target_spec = target_spec
        self.rows: dict[str, CheckRow] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        name = properties.get(CHECK_PROPERTY)
        if name is None:
            return
        row = self.rows.setdefault(f"{report.location[0]}::{name}", CheckRow(str(name)))
        if FIGURE_PROPERTY in properties:
            row.figure = str(properties[FIGURE_PROPERTY])
        if report.when == "call":
            row.seconds = report.duration
        if report.failed:
            if row.verdict not in FAILED:  # the first failure is the one to show
                row.verdict = "FAILED" if report.when == "call" else "ERROR"
                row.reason = _failure_line(report)
        elif report.skipped:
            row.verdict = "skipped"
            row.reason = results.skip_reason(report) or str(report.longrepr)
        elif report.when == "call":
            row.verdict = "passed"

    def target_name(self) -> str:
        """The target's name or spec, as the table and the JSON results show it."""
        return target.describe_spec(self.target_spec)

    def data(self, records: object = None) -> dict[str, object] | None:
        """The table as plain data (None when no check ran in this session)."""
        if not self.rows:
            return None
        rows = [asdict(self.rows[key]) for key in sorted(self.rows)]
        return {"target": self.target_name(), "rows": rows}

    def lines(self, data: object) -> list[str]:
        if data is None:
            return []
        rows = [CheckRow(**row) for row in data["rows"]]
        counts = Counter("failed" if row.verdict in FAILED else row.verdict for row in rows)
        tally = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
        return [f"conformance of {data['target']} ({tally}):", *format_table(rows)]


def format_table(rows: Sequence[CheckRow]) -> list[str]:
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
