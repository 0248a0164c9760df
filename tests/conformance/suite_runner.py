"""Helpers of the tests that run the conformance suite as a user would, in a fresh process."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# One row of the conformance table: check name, then verdict (a * after it: judged on emulated
# graphs).
ROW = re.compile(
    r"^  (?P<check>[a-z][a-z ]*?)\s{2,}(?P<verdict>passed|FAILED|ERROR|skipped|flaky|not run)\*?\s"
)


def plugin_arguments() -> list[str]:
    """``-p pytest_cudagraph.plugin`` where the package is not installed (its pytest11 entry
    point then is missing, e.g. when the tests run from the source tree)."""
    installed = any(
        entry.name == "pytest_cudagraph"
        for entry in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "pytest_cudagraph.plugin"]


def table_verdicts(result: pytest.RunResult) -> dict[str, str]:
    """check name -> verdict, read from the conformance table at the end of the output."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("conformance of "))
    verdicts = {}
    for line in lines[start + 2 :]:
        match = ROW.match(line)
        if match is None:
            break
        verdicts[match["check"]] = match["verdict"]
    return verdicts
