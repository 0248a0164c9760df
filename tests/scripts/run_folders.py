"""A folder of conformance runs as scripts/suite_runs.py leaves them, for the tests of the
reports read from it: NAME.json (results in the shape the plugin writes them) and NAME.exit."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_cudagraph import results
from pytest_cudagraph.results import Section, results_document

COMPLETE = results.session_end(pytest.ExitCode.OK, None)
# How an interrupted session ends: partial results.
INTERRUPTED = results.session_end(pytest.ExitCode.INTERRUPTED, "KeyboardInterrupt")


def write_run(
    folder: Path,
    name: str,
    verdicts: Mapping[str, str],
    exit_code: int | None = None,
    session: results.SessionEnd | None = COMPLETE,
) -> None:
    """A run whose table gives ``verdicts`` (check -> verdict) and that exited ``exit_code``
    (by default what the verdicts give: 1 when one failed, else 0)."""
    rows = [
        {
            "check": check,
            "verdict": verdict,
            "seconds": 1.0,
            "figure": "",
            "reason": "",
            "values": {},
        }
        for check, verdict in verdicts.items()
    ]
    table = {"target": name, "rows": rows}
    document = results_document(
        [Section("conformance", lambda records: table)], [], None, session=session
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(document))
    if exit_code is None:
        exit_code = int(any(verdict in ("FAILED", "ERROR") for verdict in verdicts.values()))
    (folder / f"{name}.exit").write_text(f"{exit_code}\n")
