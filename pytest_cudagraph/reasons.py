"""What a test report says, as the results, the summary and the tables show it: its outcome in
pytest's words and why it is not a plain pass, whole or in one line.

Every reader of reports takes these from here, so that the JSON results, the terminal's
summary, the conformance table and the Markdown report never word one report two ways.
"""

from __future__ import annotations

import pytest


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
