"""The account a run without CUDA ends with, in the results JSON: what the dry run records
(``_suite.record_account``: which of the user's code ran, which could not run without CUDA, what
each check lacks) is what results.schema.json accepts, and the schema holds each field to its
shape (the plugin's own reading of the schema too)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from results_schema import assert_valid_results

from pytest_cudagraph import results
from pytest_cudagraph.conformance import _suite


def document_with(account: object) -> dict[str, object]:
    """A results document whose conformance table (as the suite's table builds it, from the
    dry run's report) carries ``account``."""
    table = _suite.ConformanceTable("mine:make")
    properties = [
        results.envelope(_suite.CHECK, "dry run"),
        results.envelope(_suite.ACCOUNT, account),
    ]
    location = ("pytest_cudagraph/conformance/checks/test_00_target.py", 1, "test_dry_run")
    report = pytest.TestReport(
        "test_00_target.py::test_dry_run",
        location,
        {},
        "passed",
        None,
        "call",
        user_properties=properties,
    )
    table.pytest_runtest_logreport(report)
    data = {
        "tests": [],
        "parity": [],
        "memory": [],
        "conformance": table.data(),
        "skips": {"total": 0, "by_reason": []},
        "stray_contexts": [],
    }
    sections = [results.Section(name, lambda records, d=d: d) for name, d in data.items()]
    end = results.session_end(pytest.ExitCode.OK, None)
    document = results.results_document(sections, [], None, session=end)
    return json.loads(json.dumps(document))


def recorded(pytester: pytest.Pytester, *account: object) -> object:
    """The account ``record_account`` puts in a test's ``user_properties``."""
    item = pytester.getitem("def test_func(): pass")
    _suite.record_account(item, *account)
    [(kind, value)] = results.plugin_values(item.user_properties)
    assert kind == _suite.ACCOUNT
    return value


def test_the_account_the_dry_run_records_is_valid_results(pytester: pytest.Pytester) -> None:
    account = recorded(
        pytester, ["draw", "key_of", "eager"], {"captures": ["cache.capacity"]}, ["Cache.reset"]
    )
    assert account == {
        "ran": ["draw", "key_of", "eager"],
        "could_not": ["Cache.reset"],
        "gpu_skips": {"captures": ["cache.capacity"]},
    }
    document = document_with(account)
    assert_valid_results(document)
    assert results.schema_problem(document, results.schema()) == ""
    # Nothing that could not run, and results written before could_not was recorded.
    assert recorded(pytester, ["draw"], {})["could_not"] == []  # type: ignore[index]
    older = document_with({"ran": ["draw"], "gpu_skips": {}})
    del older["conformance"]["account"]["could_not"]  # type: ignore[index]
    assert_valid_results(older)
    assert results.schema_problem(older, results.schema()) == ""


@pytest.mark.parametrize(
    "breaking",
    [
        lambda account: account.update(could_not="Cache.reset"),
        lambda account: account.update(could_not=[1]),
        lambda account: account.update(couldnt=[]),
        lambda account: account.pop("ran"),
    ],
    ids=["could_not as text", "could_not of a number", "an unknown field", "no ran"],
)
def test_the_schema_holds_the_account_to_its_shape(
    breaking: Callable[[dict[str, object]], object],
) -> None:
    jsonschema = pytest.importorskip(
        "jsonschema", reason="checking against the schema needs jsonschema (the test extra)"
    )
    document = document_with({"ran": ["draw"], "could_not": [], "gpu_skips": {}})
    assert jsonschema.Draft202012Validator(results.schema()).is_valid(document)
    breaking(document["conformance"]["account"])  # type: ignore[index]
    assert not jsonschema.Draft202012Validator(results.schema()).is_valid(document)
    assert results.schema_problem(document, results.schema())
