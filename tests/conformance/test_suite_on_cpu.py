"""The conformance suite as CI sees it, on a host without CUDA: the checks that need no GPU run
and pass, the rest skip saying CUDA is missing, the run exits 0 and the table says all of it.
CUDA is hidden from the run (CUDA_VISIBLE_DEVICES=""), so this holds on a GPU host too.

Also the table itself (its rows from reports, as pure functions; a check run twice; a set-up
error), the figures' named values, and what a user sees for a bad target spec."""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable

import pytest
from results_schema import assert_valid_results
from suite_runner import plugin_arguments, table_verdicts

from pytest_cudagraph import results
from pytest_cudagraph.conformance import _loading, _suite
from pytest_cudagraph.conformance._catalog import declared_checks
from pytest_cudagraph.conformance._suite import CheckRow, ConformanceTable, format_table
from pytest_cudagraph.conformance._verdict import SHOWN_PROBLEMS, Judgement
from pytest_cudagraph.skips import NEEDS_CUDA

# Each test runs the conformance suite in a run of its own (the README's test command leaves it out).
pytestmark = pytest.mark.slow

# The suite's checks, as their declarations say where they can judge.
CPU_CHECKS = {check.name for check in declared_checks() if check.runs_on == "cpu"}
GPU_CHECKS = {check.name for check in declared_checks() if check.runs_on != "cpu"}


@pytest.fixture
def run_on_cpu(
    run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., pytest.RunResult]:
    """The suite without CUDA and without emulated graphs: what a GPU-less run judges alone."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return functools.partial(run_suite, "--cudagraph-emulate=off")


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_cpu_checks_pass_and_gpu_checks_skip_saying_why(
    run_on_cpu: Callable[..., pytest.RunResult], workers: list[str]
) -> None:
    result = run_on_cpu("--cudagraph-target", "reasyn", *workers)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=len(CPU_CHECKS), skipped=len(GPU_CHECKS))
    # The rows of the checks that need CUDA are collapsed into the account below the table.
    assert table_verdicts(result) == dict.fromkeys(CPU_CHECKS, "passed")
    result.stdout.fnmatch_lines(
        [
            f"conformance of reasyn ({len(CPU_CHECKS)} passed, {len(GPU_CHECKS)} skipped):",
            "  guards * passed * 4 of 4 unsupported modes refused clearly",
            "  worker refusal * passed * graphs with 2 workers per GPU refused: *",
            # The rows of the checks that need CUDA, collapsed into an account of the run.
            f"  {len(GPU_CHECKS)} checks need CUDA and skipped ({NEEDS_CUDA}): parity, no baked inputs, *",
            "Without CUDA no graph was captured, replayed or judged: *",
            "Of your code, draw, key_of, eager, Cache.reset, Sampling.sample, "
            "Padding.make_inputs and Trajectory.next_inputs ran (the dry run); your graphed "
            "side did not run.",
            "On a GPU, 8 checks would still skip unless the factory gives there what the target "
            "made for the CPU lacks: capture clean forward (needs capture_clean), bounded memory "
            "(needs cache.capacity, cache.largest_key), *",
        ],
        consecutive=False,
    )
    collapsed = next(line for line in result.stdout.lines if "checks need CUDA" in line)
    assert collapsed.endswith(": " + ", ".join(sorted(GPU_CHECKS, key=collapsed.index)))


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_json_keeps_every_row_and_the_account(
    run_on_cpu: Callable[..., pytest.RunResult], pytester: pytest.Pytester, workers: list[str]
) -> None:
    run_on_cpu(
        "--cudagraph-target",
        "reasyn",
        "-k",
        "dry or parity or sampling",
        *workers,
        "--cudagraph-json=r.json",
    )
    document = json.loads((pytester.path / "r.json").read_text())
    assert_valid_results(document)
    conformance = document["conformance"]
    verdicts = {row["check"]: (row["verdict"], row["reason"]) for row in conformance["rows"]}
    assert verdicts == {
        "dry run": ("passed", ""),
        "parity": ("skipped", NEEDS_CUDA),
        "identical sampling": ("skipped", NEEDS_CUDA),
    }
    assert conformance["account"]["ran"] == [
        "draw",
        "key_of",
        "eager",
        "Cache.reset",
        "Sampling.sample",
        "Padding.make_inputs",
        "Trajectory.next_inputs",
    ]
    assert conformance["account"]["could_not"] == []  # nothing the CPU target gives needs CUDA
    assert "identical sampling" not in conformance["account"]["gpu_skips"]  # reasyn samples
    assert conformance["account"]["gpu_skips"]["state reset"] == ["state.reset"]


def test_a_bad_spec_stops_the_run_before_it_starts(
    run_on_cpu: Callable[..., pytest.RunResult],
) -> None:
    result = run_on_cpu("--cudagraph-target", "no_such_module_here:make")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: conformance target 'no_such_module_here:make': cannot import module *"]
    )


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
@pytest.mark.parametrize(
    ("factory", "problem"),
    [
        (
            "def make(device):\n    raise RuntimeError('no weights here')\n",
            "the factory raised RuntimeError: no weights here",
        ),
        (
            "def make(device):\n    return {'device': device}\n",
            "the factory returned dict; expected a pytest_cudagraph.conformance.CudaGraphTarget",
        ),
    ],
    ids=["raises", "wrong type"],
)
def test_a_target_that_cannot_be_built_is_reported_once_and_no_check_runs(
    run_on_cpu: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    workers: list[str],
    factory: str,
    problem: str,
) -> None:
    pytester.makepyfile(unbuildable=factory)
    result = run_on_cpu("--cudagraph-target", "unbuildable:make", *workers)
    assert result.ret in (pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.INTERRUPTED)
    outcomes = result.parseoutcomes()
    errors = outcomes.get("errors", outcomes.get("error"))
    # Once per test process: each xdist worker builds its own target.
    assert errors == 1 or (workers and errors == 2), result.stdout.str()
    assert "passed" not in outcomes and "failed" not in outcomes
    message = f"conformance target 'unbuildable:make': {problem}"
    error_lines = [line for line in result.stdout.lines if line == message]
    assert len(error_lines) == errors, result.stdout.str()
    assert "Traceback (most recent call last)" not in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.parametrize(
    ("installed", "problem"),
    [
        ({}, "none chosen and none installed; give --cudagraph-target module:factory"),
        (
            {"a": "pa:make", "b": "pb:make"},
            "none chosen and 2 installed (a, b); choose one with --cudagraph-target NAME",
        ),
    ],
    ids=["none installed", "two installed"],
)
def test_a_suite_run_with_no_target_chosen_is_a_usage_error_like_a_bad_spec(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    installed: dict[str, str],
    problem: str,
) -> None:
    """Before the run, with exit status 4, as a spec that cannot be loaded is."""
    monkeypatch.delenv("PYTEST_CUDAGRAPH_TARGET", raising=False)
    monkeypatch.setattr(_loading, "installed_targets", lambda: installed)
    result = pytester.runpytest_inprocess(
        "--pyargs", "pytest_cudagraph.conformance", *plugin_arguments()
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: conformance target: {problem}"])
    # Collecting the checks needs no target.
    collected = pytester.runpytest_inprocess(
        "--pyargs", "pytest_cudagraph.conformance", "--collect-only", "-q", *plugin_arguments()
    )
    assert collected.ret == pytest.ExitCode.OK


def test_a_target_module_in_the_rootdir_imports_with_plain_pytest(
    run_on_cpu: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    project = pytester.mkdir("project")
    (project / "pytest.ini").write_text("[pytest]\ncudagraph_target = local_graphs:make_target\n")
    (project / "local_graphs.py").write_text(
        "from reasyn_ref.targets.reference import make_target\n", encoding="utf-8"
    )
    result = run_on_cpu("-c", str(project / "pytest.ini"), "-k", "guards")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["conformance of local_graphs:make_target (1 passed):"])


def test_rows_are_the_suites_checks_only(
    run_on_cpu: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    """A test of the user's named like a check is no row; the suite's checks are rows under the
    names their declarations give (``@check("worker refusal", ...)``)."""
    pytester.makepyfile(test_mine="def test_guards(): pass\n")
    result = run_on_cpu("--cudagraph-target", "reasyn", "-k", "guards or refusal", "test_mine.py")
    result.assert_outcomes(passed=3)
    assert table_verdicts(result) == {"guards": "passed", "worker refusal": "passed"}


def test_a_run_of_checks_that_all_need_cuda_ends_with_the_account_alone(
    run_on_cpu: Callable[..., pytest.RunResult],
) -> None:
    result = run_on_cpu("--cudagraph-target", "reasyn", "-k", "parity or trajectory")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=2)
    assert "summary failed" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "conformance of reasyn (2 skipped):",
            f"  2 checks need CUDA and skipped ({NEEDS_CUDA}): parity, trajectory",
            "Without CUDA no graph was captured, replayed or judged: *",
            "The dry run did not run: none of your code was called.",
        ]
    )


def test_the_table_aligns_columns_and_shows_the_figure_or_the_reason() -> None:
    rows = [
        CheckRow("parity", "passed", 4.25, "64 cases over 8 keys, max |diff| 0"),
        CheckRow("bounded memory", "FAILED", 12.0, "40 shapes", "memory grew past the bound"),
        CheckRow("device binding", "skipped", None, "", "needs 2 visible GPUs"),
    ]
    assert format_table(rows) == [
        "  check           verdict  seconds  figure",
        "  parity          passed       4.2  64 cases over 8 keys, max |diff| 0",
        "  bounded memory  FAILED      12.0  40 shapes; memory grew past the bound",
        "  device binding  skipped        -  needs 2 visible GPUs",
    ]


def make_report(
    when: str, outcome: str, longrepr: object = None, **extra: object
) -> pytest.TestReport:
    location = (
        "pytest_cudagraph/conformance/checks/test_08_lock_safety.py",
        20,
        "test_lock_safety",
    )
    label = results.envelope(_suite.CHECK, "lock safety")
    extra["user_properties"] = [label, *extra.get("user_properties", [])]
    return pytest.TestReport(
        "test_08_lock_safety.py::test_lock_safety",
        location,
        {},
        outcome,
        longrepr,
        when,
        **extra,
    )


def account_entry(**account: object) -> tuple[str, object]:
    """The ``user_properties`` entry ``record_account`` makes."""
    return results.envelope(_suite.ACCOUNT, account)


@pytest.mark.parametrize(
    ("could_not", "said"),
    [
        (["Cache.reset", "State.sides"], ["Without CUDA, Cache.reset, State.sides could not run."]),
        ([], []),
        (None, []),  # an account recorded without it (a worker of an older plugin)
    ],
    ids=["some", "none", "not recorded"],
)
def test_the_account_says_which_of_the_users_code_could_not_run_without_cuda(
    could_not: list[str] | None, said: list[str]
) -> None:
    account: dict[str, object] = {"ran": ["draw", "key_of", "eager"], "gpu_skips": {}}
    if could_not is not None:
        account["could_not"] = could_not
    table = ConformanceTable("mine:make")
    skipped = ("x.py", 1, f"Skipped: {NEEDS_CUDA}")
    table.pytest_runtest_logreport(
        make_report("setup", "skipped", skipped, user_properties=[account_entry(**account)])
    )
    data = table.data()
    assert data is not None and data["account"]["could_not"] == (could_not or [])
    # The one row needs CUDA: no table above the account, and the count said in the singular.
    assert table.lines(data) == [
        "conformance of mine:make (1 skipped):",
        f"  1 check needs CUDA and skipped ({NEEDS_CUDA}): lock safety",
        "Without CUDA no graph was captured, replayed or judged: a green table here says only "
        "that the rows above passed.",
        "Of your code, draw, key_of and eager ran (the dry run); your graphed side did not run.",
        *said,
        "The target made for the CPU gives what every check needs.",
    ]


def test_an_empty_table_has_its_header_only() -> None:
    assert format_table([]) == ["  check  verdict  seconds  figure"]


def test_a_row_keeps_the_figure_and_the_first_failure() -> None:
    summary = ConformanceTable("mine:make")
    figure = [figure_entry("faults at warm_up: lock, next call checked")]
    summary.pytest_runtest_logreport(make_report("setup", "passed"))
    summary.pytest_runtest_logreport(
        make_report(
            "call",
            "failed",
            "AssertionError: lock held\nmore",
            duration=1.5,
            user_properties=figure,
        )
    )
    summary.pytest_runtest_logreport(make_report("teardown", "failed", "the lock was held after"))
    assert summary.lines(summary.data()) == [
        "conformance of mine:make (1 failed):",
        "  check        verdict  seconds  figure",
        "  lock safety  FAILED       1.5  faults at warm_up: lock, next call checked; "
        "AssertionError: lock held",
    ]
    assert summary.data()["rows"][0]["reason"] == "AssertionError: lock held\nmore"
    summary.pytest_runtest_logreport(
        pytest.TestReport(
            "elsewhere.py::test_x", ("elsewhere.py", 1, "test_x"), {}, "passed", None, "call"
        )
    )
    assert len(summary.rows) == 1


def test_a_row_shows_the_first_problem_and_keeps_every_line() -> None:
    """The row, the JSON and the report used to read "AssertionError: 1 of 2 dry calls
    failed:", the line naming the case and the error gone."""
    failure = (
        "AssertionError: 1 of 2 dry calls failed:\n"
        "  case 0: eager on key (1, 64): KeyError: 'hidden'\n"
        "assert not [\"case 0: eager on key (1, 64): KeyError: 'hidden'\"]"
    )
    crash = types.SimpleNamespace(reprcrash=types.SimpleNamespace(message=failure))
    table = ConformanceTable("mine:make")
    table.pytest_runtest_logreport(make_report("call", "failed", crash, duration=0.5))
    assert table.lines(table.data())[2] == (
        "  lock safety  FAILED       0.5  AssertionError: 1 of 2 dry calls failed: case 0: "
        "eager on key (1, 64): KeyError: 'hidden'"
    )
    assert table.data()["rows"][0]["reason"] == failure


def figure_entry(text: str, **values: float) -> tuple[str, object]:
    """The ``user_properties`` entry ``record_figure(text, **values)`` makes."""
    return results.envelope(_suite.FIGURE, {"figure": text, "values": values})


def test_a_later_pass_never_overwrites_a_failure() -> None:
    """A check run twice (--keep-duplicates, a rerun plugin): once failed, failed, with the
    failing run's figure and reason, as pytest counts it."""
    table = ConformanceTable("mine:make")
    failing = [figure_entry("2 of 3 modes refused", refused=2)]
    table.pytest_runtest_logreport(make_report("setup", "passed"))
    table.pytest_runtest_logreport(
        make_report(
            "call", "failed", "AssertionError: accepted", duration=2.0, user_properties=failing
        )
    )
    table.pytest_runtest_logreport(make_report("teardown", "passed"))
    passing = [figure_entry("3 of 3 modes refused", refused=3)]
    for when in ("setup", "call", "teardown"):
        table.pytest_runtest_logreport(
            make_report(when, "passed", duration=1.0, user_properties=passing)
        )
    [row] = table.data()["rows"]
    assert row == {
        "check": "lock safety",
        "verdict": "FAILED",
        "seconds": 2.0,
        "figure": "2 of 3 modes refused",
        "values": {"refused": 2},
        "reason": "AssertionError: accepted",
        "emulated": False,
    }


def test_an_error_at_set_up_is_an_error_row_with_its_reason() -> None:
    table = ConformanceTable("mine:make")
    table.pytest_runtest_logreport(
        make_report("setup", "failed", "Failed: the target's lock was held before this check")
    )
    table.pytest_runtest_logreport(make_report("teardown", "passed"))
    [row] = table.data()["rows"]
    assert (row["verdict"], row["seconds"], row["reason"]) == (
        "ERROR",
        None,
        "Failed: the target's lock was held before this check",
    )
    assert table.lines(table.data())[0] == "conformance of mine:make (1 error):"  # as pytest says


@pytest.mark.parametrize(("outcome", "marked"), [("passed", True), ("skipped", False)])
def test_only_a_check_whose_call_ran_is_marked_judged_on_emulated_graphs(
    outcome: str, marked: bool
) -> None:
    """A check skipped in its call (needs CUDA, say) judged nothing, emulated or not."""
    emulated = [results.envelope(_suite.EMULATED, True)]
    table = ConformanceTable("mine:make")
    table.pytest_runtest_logreport(make_report("setup", "passed", user_properties=emulated))
    longrepr = ("test_08_lock_safety.py", 20, "Skipped: no") if outcome == "skipped" else None
    table.pytest_runtest_logreport(make_report("call", outcome, longrepr, user_properties=emulated))
    table.pytest_runtest_logreport(make_report("teardown", "passed", user_properties=emulated))
    [row] = table.data()["rows"]
    assert (row["verdict"], row["emulated"]) == (outcome, marked)


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [("skipped", "passed", "passed"), ("passed", "skipped", "passed")],
)
def test_a_pass_outranks_a_skip(first: str, second: str, verdict: str) -> None:
    table = ConformanceTable("mine:make")
    for outcome in (first, second):
        when = "setup" if outcome == "skipped" else "call"
        longrepr = ("x.py", 1, "Skipped: needs CUDA") if outcome == "skipped" else None
        table.pytest_runtest_logreport(make_report(when, outcome, longrepr))
    [row] = table.data()["rows"]
    assert (row["verdict"], row["reason"]) == (verdict, "")


@pytest.mark.parametrize(
    ("figure", "values", "error", "message"),
    [
        (3, {}, TypeError, "the figure must be text, got 3"),
        ("x", {"peak_mib": "350"}, TypeError, "peak_mib must be a number, got '350'"),
        ("x", {"ok": True}, TypeError, "ok must be a number, got True"),
        ("x", {"peak_mib": float("nan")}, ValueError, "peak_mib must be finite, got nan"),
    ],
)
def test_record_figure_takes_text_and_finite_numbers(
    pytester: pytest.Pytester, figure: object, values: dict, error: type, message: str
) -> None:
    item = pytester.getitem("def test_func(): pass")
    with pytest.raises(error, match=f"^record_figure: {message}$"):
        _suite.record_figure(item, figure, **values)
    assert item.user_properties == []
    _suite.record_figure(item, "24 shapes", peak_mib=350.5, shapes=24)
    assert results.plugin_values(item.user_properties) == [
        (_suite.FIGURE, {"figure": "24 shapes", "values": {"peak_mib": 350.5, "shapes": 24}})
    ]


def test_conclude_records_the_figure_then_gives_the_verdict(pytester: pytest.Pytester) -> None:
    """How every check ends: the figure (the judgement's, then ``also``) and its values are
    recorded whatever the verdict; problems fail under the headline (at most SHOWN_PROBLEMS of
    them); nothing judged fails as not exercised; else the check passes."""
    item = pytester.getitem("def test_func(): pass")
    conclude = _suite.Conclude(item)

    def recorded() -> object:
        return dict(results.plugin_values(item.user_properties))[_suite.FIGURE]

    conclude(Judgement([], "4 calls", 4, "calls", {"calls": 4}), "never shown", also="2 captures")
    assert recorded() == {"figure": "4 calls; 2 captures", "values": {"calls": 4}}
    problems = [f"call {n} differs" for n in range(SHOWN_PROBLEMS + 2)]
    with pytest.raises(pytest.fail.Exception) as failure:
        conclude(Judgement(problems, "12 calls", 12, "calls"), "graphed differs from eager:")
    assert not failure.value.pytrace
    assert str(failure.value).splitlines() == [
        "graphed differs from eager:",
        *problems[:SHOWN_PROBLEMS],
        "... and 2 more",
    ]
    assert recorded() == {"figure": "12 calls", "values": {}}
    with pytest.raises(pytest.fail.Exception) as failure:
        conclude(Judgement([], "0 keys", 0, "calls compared"), "never shown", also="no capture")
    assert str(failure.value) == (
        "not exercised: this check judged 0 calls compared (0 keys; no capture); a check that "
        "judged nothing does not pass"
    )
    assert recorded() == {"figure": "0 keys; no capture", "values": {}}
    with pytest.raises(ValueError, match=r"^record_figure: peak_mib must be finite, got nan$"):
        conclude(Judgement([], "x", 1, "calls", {"peak_mib": float("nan")}), "never shown")


FLAKY_GUARD_TARGET = """
import dataclasses

from pytest_cudagraph.conformance import Guards
from reasyn_ref.targets.reference import make_target as reference

calls = []


def refuses_from_the_second_call():
    calls.append(1)
    if len(calls) > 1:
        raise ValueError("refused: not supported")


def make(device):
    modes = {"flaky": (refuses_from_the_second_call, "refused")}
    return dataclasses.replace(reference(device), guards=Guards(modes))
"""


def test_a_check_run_twice_that_failed_once_stays_failed(
    run_on_cpu: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    pytester.makepyfile(flaky_guard=FLAKY_GUARD_TARGET)
    result = run_on_cpu(
        "pytest_cudagraph.conformance.checks.test_07_guards",
        "--keep-duplicates",
        "-k",
        "guards",
        "--cudagraph-target",
        "flaky_guard:make",
        "--cudagraph-json=results.json",
    )
    result.assert_outcomes(passed=1, failed=1)
    assert table_verdicts(result) == {"guards": "FAILED"}
    document = json.loads((pytester.path / "results.json").read_text())
    assert_valid_results(document)
    [row] = document["conformance"]["rows"]
    assert (row["verdict"], row["figure"], row["values"]) == (
        "FAILED",
        "0 of 1 unsupported modes refused clearly",
        {},
    )
    assert [entry["outcome"] for entry in document["tests"]] == ["failed", "passed"]


def test_a_check_that_errors_at_set_up_is_an_error_row(
    run_on_cpu: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    pytester.makepyfile(unbuildable="def make(device):\n    raise RuntimeError('no weights')\n")
    result = run_on_cpu(
        "-k",
        "target or guards",
        "--cudagraph-target",
        "unbuildable:make",
        "--cudagraph-json=r.json",
    )
    document = json.loads((pytester.path / "r.json").read_text())
    assert_valid_results(document)
    first = document["conformance"]["rows"][0]
    assert first["verdict"] == "ERROR", result.stdout.str()
    reason = first["reason"].splitlines()
    assert reason[0].endswith(
        "conformance target 'unbuildable:make': the factory raised RuntimeError: no weights"
    )
    assert "Traceback (your code):" in reason  # the reason kept whole, the user's frame in it


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_record_figure_refuses_an_infinity(pytester: pytest.Pytester, value: float) -> None:
    item = pytester.getitem("def test_func(): pass")
    with pytest.raises(ValueError, match=r"^record_figure: peak_mib must be finite, got -?inf$"):
        _suite.record_figure(item, "x", peak_mib=value)
    assert item.user_properties == []
