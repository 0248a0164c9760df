"""Test reports as pytest, or an xdist worker, makes them, and the records read from them."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_cudagraph import records


def make_report(
    nodeid: str,
    when: str,
    outcome: str,
    longrepr: object = None,
    *,
    properties: list[Any] | None = None,
    **extra: object,
) -> pytest.TestReport:
    """A test report as pytest (or an xdist worker, through ``extra``) makes it."""
    location = (nodeid.split("::")[0], 1, nodeid.split("::")[-1])
    return pytest.TestReport(
        nodeid, location, {}, outcome, longrepr, when, user_properties=properties or [], **extra
    )


def skip_report(nodeid: str, reason: str, uses_plugin: bool = True) -> pytest.TestReport:
    extra = {records.USES_PLUGIN: True} if uses_plugin else {}
    return make_report(nodeid, "setup", "skipped", ("t.py", 3, f"Skipped: {reason}"), **extra)


def records_of(*reports: pytest.TestReport) -> list[records.Record]:
    return [record for report in reports for record in records.records_from(report)]
