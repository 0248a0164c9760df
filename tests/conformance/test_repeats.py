"""Repeated checks (``--cudagraph-repeat N``): each check runs N times, and a check whose repeats
disagree, one passing and another failing, is one row that says flaky, with both messages, in
the table, in pytest's closing line, in the exit status and in the JSON results.

The table's merging of repeats as pure functions, the setting's parsing and refusals, and whole
runs of the suite on a target whose guard is refused on every second call only."""

from __future__ import annotations

import json
import re
import types
from collections.abc import Callable, Sequence

import pytest
from results_schema import assert_valid_results
from suite_runner import plugin_arguments

from pytest_cudagraph import results, settings
from pytest_cudagraph.conformance import _suite
from pytest_cudagraph.conformance._suite import CheckRow, ConformanceTable, format_table

CHECK_FILE = "pytest_cudagraph/conformance/checks/test_07_guards.py"
SKIPPED = (CHECK_FILE, 1, "Skipped: needs 2 visible GPUs")


def label(*user_properties: tuple[str, object], repeat: int | None) -> list[tuple[str, object]]:
    """The ``user_properties`` of a report of the guards check: its name, its repeat where it
    has one (as the suite's conftest records them), then ``user_properties``."""
    labels = [results.envelope(_suite.CHECK, "guards")]
    if repeat is not None:
        labels.append(results.envelope(_suite.REPEAT, repeat))
    return [*labels, *user_properties]


def figure(text: str, **values: float) -> tuple[str, object]:
    """The ``user_properties`` entry ``record_figure(text, **values)`` makes."""
    return results.envelope(_suite.FIGURE, {"figure": text, "values": values})


def run_of(
    table: ConformanceTable,
    repeat: int | None,
    outcome: str,
    shown: str = "",
    reason: str = "",
    duration: float = 1.0,
    **values: float,
) -> None:
    """Feed ``table`` the reports of one run of the guards check: its set-up, then (unless it
    skipped there) its call with ``outcome`` and the figure ``shown``, then its teardown."""
    nodeid = f"{CHECK_FILE}::test_guards" + (f"[repeat-{repeat}-of-3]" if repeat else "")
    location = (CHECK_FILE, 20, "test_guards")

    def report(when: str, result: str, longrepr: object, properties: list) -> None:
        table.pytest_runtest_logreport(
            pytest.TestReport(
                nodeid,
                location,
                {},
                result,
                longrepr,
                when,
                duration=duration if when == "call" else 0.0,
                user_properties=label(*properties, repeat=repeat),
            )
        )

    if outcome == "skipped":
        report("setup", "skipped", SKIPPED, [])
    elif outcome == "error":
        report("setup", "failed", reason, [])
    else:
        report("setup", "passed", None, [])
        properties = [figure(shown, **values)] if shown else []
        report("call", outcome, reason or None, properties)
    report("teardown", "passed", None, [])


def the_row(table: ConformanceTable) -> dict[str, object]:
    data = table.data()
    assert data is not None
    [row] = data["rows"]
    return row


def conformance_problem(data: object) -> str:
    """How ``data`` breaks the schema's ``conformance`` section ("" where it keeps it), by the
    plugin's own reading and by jsonschema's where it is installed."""
    rule = results.schema()["properties"]["conformance"]
    try:
        import jsonschema
    except ImportError:
        return results.schema_problem(data, rule, "conformance")
    errors = [error.message for error in jsonschema.Draft202012Validator(rule).iter_errors(data)]
    return results.schema_problem(data, rule, "conformance") or "; ".join(errors)


# The table


@pytest.mark.parametrize("failing_first", [False, True], ids=["pass then fail", "fail then pass"])
def test_a_pass_and_a_fail_are_one_flaky_row_with_both_messages(failing_first: bool) -> None:
    table = ConformanceTable("mine:make", repeats=2)
    passing = ("passed", "3 of 3 modes refused", "", 1.0)
    failing = ("failed", "2 of 3 modes refused", "AssertionError: mode x accepted\nmore", 2.0)
    first, second = (failing, passing) if failing_first else (passing, failing)
    run_of(table, 1, *first[:3], duration=first[3], refused=int(first[1][0]))
    run_of(table, 2, *second[:3], duration=second[3], refused=int(second[1][0]))
    fail, success = ("1", "2") if failing_first else ("2", "1")
    row = the_row(table)
    # The failing repeat's figure and numbers, as a failed row has them; both messages kept.
    assert (row["verdict"], row["figure"], row["values"], row["seconds"]) == (
        "flaky",
        "2 of 3 modes refused",
        {"refused": 2},
        2.0,
    )
    assert row["reason"].splitlines() == [
        f"flaky: {'FAILED in repeat 1, passed in repeat 2' if failing_first else 'passed in repeat 1, FAILED in repeat 2'} of 2",
        f"repeat {fail} FAILED: 2 of 3 modes refused; AssertionError: mode x accepted",
        "more",
        f"repeat {success} passed: 3 of 3 modes refused",
    ]
    assert row["repeats"] == 2
    assert [(run["repeat"], run["verdict"], run["figure"]) for run in row["runs"]] == sorted(
        [
            (int(fail), "FAILED", "2 of 3 modes refused"),
            (int(success), "passed", "3 of 3 modes refused"),
        ]
    )
    lines = table.lines(table.data())
    assert lines[0] == "conformance of mine:make (1 flaky; each check run 2 times):"
    assert lines[2].split()[:3] == ["guards", "flaky", "2.0"]
    assert lines[2].endswith(
        f"of 2: repeat {fail} FAILED: 2 of 3 modes refused; AssertionError: mode x accepted | "
        f"repeat {success} passed: 3 of 3 modes refused"
    )
    assert conformance_problem(table.data()) == ""
    assert [row.check for row in table.flaky()] == ["guards"]


def test_repeats_that_all_pass_are_a_passed_row_keeping_each_run() -> None:
    table = ConformanceTable("mine:make", repeats=3)
    for repeat, seconds in ((1, 1.5), (2, 0.5), (3, 0.25)):
        run_of(table, repeat, "passed", f"{repeat} calls", duration=seconds, calls=repeat)
    row = the_row(table)
    assert (row["verdict"], row["figure"], row["values"], row["seconds"], row["reason"]) == (
        "passed",
        "1 calls",
        {"calls": 1},
        1.5,
        "",
    )
    assert row["repeats"] == 3
    assert row["runs"] == [
        {
            "repeat": n,
            "verdict": "passed",
            "seconds": s,
            "figure": f"{n} calls",
            "values": {"calls": n},
            "reason": "",
        }
        for n, s in ((1, 1.5), (2, 0.5), (3, 0.25))
    ]
    assert table.lines(table.data())[0] == (
        "conformance of mine:make (1 passed; each check run 3 times):"
    )
    assert table.flaky() == []
    assert conformance_problem(table.data()) == ""


def test_repeats_that_all_fail_are_the_first_failure() -> None:
    table = ConformanceTable("mine:make", repeats=3)
    run_of(table, 1, "error", reason="Failed: the target's lock was held before this check")
    run_of(table, 2, "failed", "1 of 3 refused", "AssertionError: b", duration=2.0)
    run_of(table, 3, "failed", "0 of 3 refused", "AssertionError: c", duration=3.0)
    row = the_row(table)
    assert (row["verdict"], row["reason"], row["seconds"]) == (
        "ERROR",
        "Failed: the target's lock was held before this check",
        None,
    )
    assert [run["verdict"] for run in row["runs"]] == ["ERROR", "FAILED", "FAILED"]
    assert table.lines(table.data())[0] == (
        "conformance of mine:make (1 error; each check run 3 times):"
    )
    assert table.flaky() == []


def test_an_error_and_a_pass_are_flaky_too() -> None:
    table = ConformanceTable("mine:make", repeats=2)
    run_of(table, 1, "passed", "3 of 3 refused")
    run_of(table, 2, "error", reason="Failed: the target's lock was held before this check")
    row = the_row(table)
    assert row["verdict"] == "flaky"
    assert row["reason"].splitlines()[:2] == [
        "flaky: passed in repeat 1, ERROR in repeat 2 of 2",
        "repeat 2 ERROR: Failed: the target's lock was held before this check",
    ]


@pytest.mark.parametrize(
    ("outcomes", "verdict", "reason"),
    [
        (["skipped", "skipped"], "skipped", "needs 2 visible GPUs"),
        (["skipped", "passed"], "passed", ""),
        (["passed", "skipped"], "passed", ""),
        (["skipped", "failed"], "FAILED", "AssertionError: accepted"),
    ],
    ids=["all skipped", "skip then pass", "pass then skip", "skip then fail"],
)
def test_a_skip_makes_no_row_flaky(outcomes: list[str], verdict: str, reason: str) -> None:
    """Only a pass against a failure is flaky; a skip gives way as in a check run twice."""
    table = ConformanceTable("mine:make", repeats=2)
    for repeat, outcome in enumerate(outcomes, start=1):
        failure = "AssertionError: accepted" if outcome == "failed" else ""
        run_of(table, repeat, outcome, "3 modes" if outcome != "skipped" else "", failure)
    row = the_row(table)
    assert (row["verdict"], row["reason"]) == (verdict, reason)
    assert [run["verdict"] for run in row["runs"]] == [
        {"failed": "FAILED"}.get(outcome, outcome) for outcome in outcomes
    ]


def test_a_repeat_run_twice_keeps_the_rule_of_a_check_run_twice() -> None:
    """The same repeat twice (--keep-duplicates): once failed, failed; never flaky by itself."""
    table = ConformanceTable("mine:make", repeats=2)
    run_of(table, 1, "failed", "2 of 3 refused", "AssertionError: accepted")
    run_of(table, 1, "passed", "3 of 3 refused")
    row = the_row(table)
    assert row["verdict"] == "FAILED"
    assert row["runs"] == [
        {
            "repeat": 1,
            "verdict": "FAILED",
            "seconds": 1.0,
            "figure": "2 of 3 refused",
            "values": {},
            "reason": "AssertionError: accepted",
        }
    ]


def test_a_check_run_once_has_no_repeats_in_its_row() -> None:
    """Without --cudagraph-repeat the data is as before: no repeats, no runs, and a later pass
    never overwrites a failure."""
    table = ConformanceTable("mine:make")
    run_of(table, None, "failed", "2 of 3 refused", "AssertionError: accepted")
    run_of(table, None, "passed", "3 of 3 refused")
    data = table.data()
    assert data is not None and "repeats" not in data
    assert the_row(table) == {
        "check": "guards",
        "verdict": "FAILED",
        "seconds": 1.0,
        "figure": "2 of 3 refused",
        "reason": "AssertionError: accepted",
        "values": {},
        "emulated": False,
    }
    assert table.lines(data)[0] == "conformance of mine:make (1 failed):"
    assert table.flaky() == []


def test_the_table_shows_a_flaky_row_in_its_columns() -> None:
    runs = [
        {"repeat": 1, "verdict": "passed", "seconds": 1.0, "figure": "8 keys", "values": {}},
        {"repeat": 2, "verdict": "FAILED", "seconds": 2.0, "figure": "8 keys", "values": {}},
        {"repeat": 3, "verdict": "passed", "seconds": 1.0, "figure": "", "values": {}},
    ]
    runs[0]["reason"], runs[1]["reason"], runs[2]["reason"] = "", "key 3 differs:\n  at 0", ""
    rows = [
        CheckRow("parity", "flaky", 2.0, "8 keys", "", repeats=3, runs=runs),  # type: ignore[arg-type]
        CheckRow("guards", "passed", 0.5, "4 of 4 refused"),
    ]
    assert format_table(rows) == [
        "  check   verdict  seconds  figure",
        "  parity  flaky        2.0  passed in repeats 1 and 3, FAILED in repeat 2 of 3: repeat 2 "
        "FAILED: 8 keys; key 3 differs: at 0 | repeat 1 passed: 8 keys",
        "  guards  passed       0.5  4 of 4 refused",
    ]


@pytest.mark.parametrize(("flaky", "status"), [(True, 1), (False, 0)], ids=["flaky", "steady"])
def test_a_flaky_row_fails_a_run_pytest_would_pass(flaky: bool, status: int) -> None:
    """Should another plugin turn the failing repeat into another outcome, the run still fails;
    and pytest's closing line counts the flaky rows."""
    table = ConformanceTable("mine:make", repeats=2)
    run_of(table, 1, "passed", "3 of 3 refused")
    run_of(table, 2, "failed" if flaky else "passed", "2 of 3 refused", "AssertionError: x")
    session = types.SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    table.pytest_sessionfinish(session)  # type: ignore[arg-type]
    assert session.exitstatus == status
    reporter = types.SimpleNamespace(stats={})
    table.pytest_terminal_summary(reporter)  # type: ignore[arg-type]
    assert [row.check for row in reporter.stats.get("flaky", [])] == (["guards"] if flaky else [])
    interrupted = types.SimpleNamespace(exitstatus=pytest.ExitCode.INTERRUPTED)
    table.pytest_sessionfinish(interrupted)  # type: ignore[arg-type]
    assert interrupted.exitstatus == pytest.ExitCode.INTERRUPTED  # never made to look milder


def test_the_schema_refuses_a_flaky_repeat_and_takes_rows_of_before() -> None:
    table = ConformanceTable("mine:make", repeats=2)
    run_of(table, 1, "passed", "3 of 3 refused")
    run_of(table, 2, "failed", "2 of 3 refused", "AssertionError: x")
    data = table.data()
    assert conformance_problem(data) == ""
    data["rows"][0]["runs"][0]["verdict"] = "flaky"  # a repeat has a verdict of its own
    assert "'flaky'" in conformance_problem(data)
    data["rows"][0]["runs"][0]["verdict"] = "passed"
    data["repeats"] = 1  # said only where each check ran several times
    assert conformance_problem(data)
    del data["repeats"]
    for row in data["rows"]:
        del row["repeats"], row["runs"]
        row["verdict"] = "FAILED"
    assert conformance_problem(data) == ""  # a row of a release before this one


# The setting


@pytest.mark.parametrize(("given", "repeat"), [("1", 1), (" +3 ", 3), (7, 7), ("0100", 100)])
def test_a_repeat_count_from_text_or_numbers(given: object, repeat: int) -> None:
    assert settings.parse_repeat(given) == repeat


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (0, "repeat must be a number of runs of each conformance check in [1, 100], got 0"),
        ("-2", "repeat must be a number of runs of each conformance check in [1, 100], got -2"),
        (101, "repeat must be a number of runs of each conformance check in [1, 100], got 101"),
        ("three", "repeat must be an integer, got 'three'"),
        (2.0, "repeat must be an integer, got 2.0"),
        (True, "repeat must be an integer, got True"),
        ("9" * 30, "repeat must be an integer of at most 20 digits, got one of 30 digits"),
    ],
)
def test_a_repeat_count_out_of_range_or_not_a_number_is_refused(
    given: object, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        settings.parse_repeat(given)


def test_the_repeat_setting_is_named_as_the_others_are() -> None:
    assert settings.REPEAT in settings.SETTINGS
    assert (settings.REPEAT.option, settings.REPEAT.env, settings.REPEAT.ini) == (
        "--cudagraph-repeat",
        "PYTEST_CUDAGRAPH_REPEAT",
        "cudagraph_repeat",
    )
    assert settings.REPEAT.parse(settings.REPEAT.default) == 1  # today's one run
    assert settings.MAX_REPEAT == 100


@pytest.mark.parametrize(
    ("where", "shown"),
    [
        ("cli", "--cudagraph-repeat='0'"),
        ("env", "PYTEST_CUDAGRAPH_REPEAT='0'"),
        ("ini", "ini cudagraph_repeat=*0*"),  # 0 or '0', as the ini key's type reads it
    ],
)
def test_a_bad_repeat_count_stops_the_run_before_any_test_naming_where_it_came_from(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str, shown: str
) -> None:
    pytester.makepyfile("def test_ran():\n    open('ran', 'w').close()\n")
    arguments = ["--cudagraph-repeat=0"] if where == "cli" else []
    if where == "env":
        monkeypatch.setenv("PYTEST_CUDAGRAPH_REPEAT", "0")
    if where == "ini":
        pytester.makeini("[pytest]\ncudagraph_repeat = 0\n")
    result = pytester.runpytest_inprocess(*plugin_arguments(), *arguments)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: {shown}: repeat must be a number of runs of each conformance check in *"]
    )
    assert not (pytester.path / "ran").exists()


@pytest.mark.parametrize(
    ("given", "resolved"),
    [
        ({"cli": "3", "env": "4", "ini": "5"}, (3, "--cudagraph-repeat")),
        ({"env": "4", "ini": "5"}, (4, "PYTEST_CUDAGRAPH_REPEAT")),
        ({"ini": "5"}, (5, "ini cudagraph_repeat")),
        ({}, (1, "default")),
    ],
    ids=["command line", "environment", "ini", "default"],
)
def test_the_repeat_count_comes_from_the_first_source_present(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, given: dict, resolved: tuple
) -> None:
    if "ini" in given:
        pytester.makeini(f"[pytest]\ncudagraph_repeat = {given['ini']}\n")
    if "env" in given:
        monkeypatch.setenv("PYTEST_CUDAGRAPH_REPEAT", given["env"])
    pytester.makepyfile(
        f"""
        from pytest_cudagraph import settings

        def test_repeat(pytestconfig):
            resolved = settings.snapshot(pytestconfig)[settings.REPEAT]
            assert resolved == settings.Resolved{resolved!r}
        """
    )
    cli = [f"--cudagraph-repeat={given['cli']}"] if "cli" in given else []
    result = pytester.runpytest_inprocess(*plugin_arguments(), *cli)
    result.assert_outcomes(passed=1)  # a test outside the suite runs once whatever the count


# Whole runs of the suite

# The guard's one unsupported mode is refused on every second call only: the guards check,
# which calls it once per run, fails on its odd runs and passes on its even ones.
ALTERNATING_GUARD_TARGET = """
import dataclasses

from pytest_cudagraph.conformance import Guards
from reasyn_ref.targets.reference import make_target as reference

calls = []


def refused_on_every_second_call():
    calls.append(1)
    if len(calls) % 2 == 0:
        raise ValueError("refused: not supported")


def make(device):
    modes = {"alternating": (refused_on_every_second_call, "refused")}
    return dataclasses.replace(reference(device), guards=Guards(modes))
"""
ROW = re.compile(r"^  (?P<check>[a-z][a-z ]*?)\s{2,}(?P<verdict>[a-zA-Z ]+?)\*?\s+[0-9.-]+  ")


def rows_said(result: pytest.RunResult) -> dict[str, tuple[str, str]]:
    """check -> (verdict, the rest of its line), read from the table at the end of the output."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("conformance of "))
    said = {}
    for line in lines[start + 2 :]:
        match = ROW.match(line)
        if match is None:
            break
        said[match["check"]] = (match["verdict"], line[match.end() :])
    return said


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers", [[], ["-n", "2", "--dist", "loadfile"]], ids=["one process", "xdist"]
)
def test_a_check_whose_repeats_disagree_is_flaky_and_fails_the_run(
    run_suite: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    workers: Sequence[str],
) -> None:
    """Under xdist the check's file goes to one worker (loadfile), so its runs alternate there
    as in one process; the controller builds the row from the workers' reports."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(alternating_guard=ALTERNATING_GUARD_TARGET)
    result = run_suite(
        "-k",
        "guards or refusal",
        "--cudagraph-target",
        "alternating_guard:make",
        "--cudagraph-repeat",
        "4",
        "--cudagraph-json=results.json",
        *workers,
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2 + 4, failed=2)
    result.stdout.fnmatch_lines(
        ["conformance of alternating_guard:make (1 flaky, 1 passed; each check run 4 times):"]
    )
    said = rows_said(result)
    assert said["worker refusal"][0] == "passed"
    verdict, rest = said["guards"]
    assert verdict == "flaky"
    assert rest.startswith(
        "FAILED in repeats 1 and 3, passed in repeats 2 and 4 of 4: repeat 1 FAILED: 0 of 1 "
        "unsupported modes refused clearly; Failed: unsupported modes not refused: "
    ), rest
    assert rest.endswith(" | repeat 2 passed: 1 of 1 unsupported modes refused clearly"), rest
    closing = result.stdout.lines[-1]
    assert re.search(r"\b2 failed, 6 passed, .*\b1 flaky\b", closing), closing
    document = json.loads((pytester.path / "results.json").read_text())
    assert_valid_results(document)
    assert document["session"]["exit_status"] == 1
    conformance = document["conformance"]
    assert conformance["repeats"] == 4
    [guards] = [row for row in conformance["rows"] if row["check"] == "guards"]
    assert (guards["verdict"], guards["repeats"]) == ("flaky", 4)
    assert guards["figure"] == "0 of 1 unsupported modes refused clearly"
    assert [(run["repeat"], run["verdict"], run["figure"]) for run in guards["runs"]] == [
        (n, verdict, f"{1 - n % 2} of 1 unsupported modes refused clearly")
        for n, verdict in ((1, "FAILED"), (2, "passed"), (3, "FAILED"), (4, "passed"))
    ]
    assert guards["runs"][0]["reason"].startswith("Failed: unsupported modes not refused")
    guard_runs = [entry for entry in document["tests"] if "test_guards" in entry["nodeid"]]
    assert sorted(entry["nodeid"].rpartition("[")[2] for entry in guard_runs) == [
        f"repeat-{n}-of-4]" for n in range(1, 5)
    ]


@pytest.mark.slow
def test_repeats_of_a_steady_target_pass_and_one_run_is_as_before(
    run_suite: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    arguments = ("-k", "guards", "--cudagraph-target", "reasyn", "--cudagraph-json=r.json")
    repeated = run_suite(*arguments, "--cudagraph-repeat=3")
    assert repeated.ret == pytest.ExitCode.OK
    repeated.assert_outcomes(passed=3)
    repeated.stdout.fnmatch_lines(
        ["conformance of reasyn (1 passed; each check run 3 times):", "  guards * passed *"]
    )
    assert "flaky" not in repeated.stdout.str()
    [row] = json.loads((pytester.path / "r.json").read_text())["conformance"]["rows"]
    assert [run["verdict"] for run in row["runs"]] == ["passed"] * 3
    once = run_suite(*arguments, "--collect-only", "-q")
    assert [line for line in once.stdout.lines if "test_guards" in line] == [
        "checks/test_07_guards.py::test_guards"
    ]
    once = run_suite(*arguments)
    once.assert_outcomes(passed=1)
    once.stdout.fnmatch_lines(["conformance of reasyn (1 passed):"])
    document = json.loads((pytester.path / "r.json").read_text())
    assert_valid_results(document)
    assert "repeats" not in document["conformance"]
    assert set(document["conformance"]["rows"][0]) == {
        "check",
        "verdict",
        "seconds",
        "figure",
        "values",
        "reason",
        "emulated",
    }
