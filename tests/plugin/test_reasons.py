"""What a report says: its failure whole, and a reason in one line that names a problem."""

from __future__ import annotations

import types

import pytest
from made_reports import make_report, records_of

from pytest_cudagraph import reasons, sections

DRY_RUN_FAILURE = (
    "AssertionError: 2 of 2 dry calls failed:\n"
    "  case 0: eager on key (1, 64): KeyError: 'hidden'\n"
    "  case 1: eager on key (2, 64): KeyError: 'hidden'\n"
    'assert not ["case 0: ..."]'
)


def test_a_failure_reason_keeps_every_line() -> None:
    """It used to be cut to its first line, "AssertionError: 2 of 2 dry calls failed:", which
    names no case and no error."""
    crash = types.SimpleNamespace(reprcrash=types.SimpleNamespace(message=DRY_RUN_FAILURE))
    report = make_report("t.py::a", "call", "failed", crash)
    assert reasons.failure_reason(report) == reasons.reason_of(report) == DRY_RUN_FAILURE
    assert sections.tests_data(records_of(report))[0]["reason"] == DRY_RUN_FAILURE


@pytest.mark.parametrize(
    ("reason", "line"),
    [
        (
            DRY_RUN_FAILURE,
            "AssertionError: 2 of 2 dry calls failed: case 0: eager on key (1, "
            "64): KeyError: 'hidden'",
        ),
        ("AssertionError: lock held\nmore", "AssertionError: lock held"),
        (
            "needs CUDA: torch.cuda.is_available() is False",
            "needs CUDA: torch.cuda.is_available() is False",
        ),
        ("\n  \nValueError: late\n", "ValueError: late"),
        ("", ""),
    ],
    ids=["a header and its problems", "a message and more", "one line", "blank lines", "none"],
)
def test_one_line_of_a_reason_names_its_first_problem(reason: str, line: str) -> None:
    assert reasons.one_line(reason) == line
