"""The report header, the records (what the plugin wrote, never a user's value), the sections
built from them (each test's runs, the skips) and the "cudagraph" terminal summary."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import textwrap
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from results_schema import assert_valid_results

from pytest_cudagraph import results
from pytest_cudagraph.engines.devices import DeviceBinding, GpuInfo, StrayCheck
from pytest_cudagraph.engines.units import GiB
from pytest_cudagraph.markers.cuda_graph_parity import ParityMarker
from pytest_cudagraph.markers.graph_memory_bound import MemoryBoundMarker

# What the header says of this torch: PyPI's torch 2.7 (the pinned env) is a CUDA build.
BUILD = f"with CUDA {torch.version.cuda}" if torch.version.cuda else "(CPU build, no CUDA)"


CPU_BOX = results.StackFacts(
    python="3.11.7",
    torch="2.13.0+cpu",
    torch_cuda=None,
    driver=None,
    nvml="unavailable (NVML Shared Library Not Found)",
)


def test_header_on_a_machine_without_cuda_names_no_device() -> None:
    assert results.header_lines(CPU_BOX, DeviceBinding(0, "default")) == [
        "cudagraph: python 3.11.7, torch 2.13.0+cpu (CPU build, no CUDA), NVIDIA driver none",
        "cudagraph: no GPU visible to torch, so tests that need CUDA skip",
    ]


def test_header_on_a_gpu_machine() -> None:
    facts = results.StackFacts(
        python="3.10.14",
        torch="2.7.1+cu118",
        torch_cuda="11.8",
        driver="570.86.15",
        nvml="ok",
        gpus=[
            GpuInfo("cuda:0", "NVIDIA H200", 140 * GiB),
            GpuInfo("cuda:1", "NVIDIA H200", 140 * GiB),
        ],
    )
    binding = DeviceBinding(0, "xdist worker gw1: CUDA_VISIBLE_DEVICES=1 (of 0,1)")
    assert results.header_lines(facts, binding) == [
        "cudagraph: python 3.10.14, torch 2.7.1+cu118 with CUDA 11.8, NVIDIA driver 570.86.15",
        "cudagraph: GPUs cuda:0 NVIDIA H200 (140.0 GiB), cuda:1 NVIDIA H200 (140.0 GiB); NVML ok",
        "cudagraph: tests use cuda:0 (xdist worker gw1: CUDA_VISIBLE_DEVICES=1 (of 0,1))",
    ]


def test_an_unrelated_run_prints_no_cudagraph_lines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_unrelated="import pytest\n\ndef test_a(): pass\n\ndef test_b(): pytest.skip('no')"
    )
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    # The plugins line and the directory name aside, no line mentions the plugin.
    lines = [line for line in result.stdout.lines if not line.startswith(("plugins:", "rootdir:"))]
    assert not [line for line in lines if "cudagraph" in line]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the header where CUDA is absent")
@pytest.mark.parametrize(
    "test_file",
    [
        "def test_a(cuda_device): pass",
        "import pytest\n\n@pytest.mark.no_host_sync\ndef test_a(): pass",
    ],
)
def test_a_run_that_uses_the_plugin_gets_the_header(
    pytester: pytest.Pytester, test_file: str
) -> None:
    pytester.makepyfile(test_file)
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines(
        [
            "collected 1 item",
            f"cudagraph: python *, torch {torch.__version__} {BUILD}, NVIDIA driver *",
            "cudagraph: no GPU visible to torch, so tests that need CUDA skip",
        ]
    )
    assert "pinned_stack" not in result.stdout.str()
    assert "cuda:0" not in result.stdout.str()


@pytest.mark.slow
def test_a_given_setting_prints_the_header_before_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_subprocess("--cudagraph-seed=3")
    result.stdout.fnmatch_lines(["cudagraph: python *", "collected 1 item"])


def test_the_pinned_stack_line_appears_only_with_pinned_tests(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = python<3")
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.pinned_stack\ndef test_a(): pass\n\n"
        "@pytest.mark.pinned_stack\ndef test_b(): pass"
    )
    result = pytester.runpytest_inprocess()
    result.stdout.fnmatch_lines(
        [
            "cudagraph: 2 pinned_stack test(s) are meant for python<3; this is not it "
            "(python * not <3), so they skip"
        ]
    )
    result = pytester.runpytest_inprocess("--cudagraph-stack=any")
    result.stdout.fnmatch_lines(["cudagraph: 2 pinned_stack test(s) * they run anyway *"])


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
    extra = {results.USES_PLUGIN: True} if uses_plugin else {}
    return make_report(nodeid, "setup", "skipped", ("t.py", 3, f"Skipped: {reason}"), **extra)


def records_of(*reports: pytest.TestReport) -> list[results.Record]:
    return [record for report in reports for record in results.records_from(report)]


def test_summary_lines_from_records() -> None:
    records = [
        results.Record(
            "parity", "t.py::a", {"form": "cases", "checked": 8, "passed": 8, "failures": []}
        ),
        results.Record(
            "parity", "t.py::a", {"form": "cases", "checked": 4, "passed": 3, "failures": []}
        ),
        results.Record(
            "parity", "t.py::b", {"form": "toggle", "checked": 1, "passed": 1, "failures": []}
        ),
        results.Record(
            "memory",
            "t.py::c",
            {
                "device": "cuda:0",
                "growth_mib": 1.5,
                "peak_growth_mib": 40.0,
                "torch_reserved_growth_mib": 0.0,
                "outside_torch_growth_mib": 1.5,
                "bound_mib": 64,
                "passed": True,
            },
        ),
        *records_of(
            skip_report("t.py::d", "needs CUDA"),
            skip_report("t.py::e", "pinned stack not running: x"),
            skip_report("t.py::f", "needs CUDA"),
            skip_report("t.py::g", "the user's own skip", uses_plugin=False),
        ),
    ]
    sections = [
        results.Section(
            feature.results_key,
            partial(feature.section_data, None),
            partial(feature.section_lines, None),
        )
        for feature in (ParityMarker, MemoryBoundMarker)
    ]
    lines = results.summary_lines([*sections, results.SKIPS], records)
    assert lines == [
        "parity: 12 of 13 checked cases match",
        "  t.py::a: 11 of 12 cases match",
        "  t.py::b: 1 of 1 toggled run pairs match",
        "memory growth across the test body (NVML, this process):",
        "  t.py::c on cuda:0: +1.5 MiB of 64 MiB bound ok; peak +40.0 MiB; torch reserved "
        "+0.0 MiB, outside torch +1.5 MiB",
        "skips by reason:",
        "  2 x needs CUDA",
        "  1 x pinned stack not running: x",
    ]


def test_summary_is_empty_without_records_or_checks() -> None:
    assert results.summary_lines([results.SKIPS], []) == []


def test_the_skip_total_counts_skips_not_reasons() -> None:
    """Two skips of one reason are two; a user's own skip, an xfail and a pass are none."""
    xfail = make_report("t.py::x", "call", "skipped", "AssertionError", wasxfail="known")
    setattr(xfail, results.USES_PLUGIN, True)
    records = records_of(
        skip_report("t.py::a", "needs CUDA"),
        skip_report("t.py::b", "needs CUDA"),
        skip_report("t.py::c", "needs 2 GPUs"),
        skip_report("t.py::d", "not today", uses_plugin=False),
        xfail,
        make_report("t.py::e", "call", "passed", **{results.USES_PLUGIN: True}),
    )
    assert results.skips_data(records) == {
        "total": 3,
        "by_reason": [{"reason": "needs CUDA", "count": 2}, {"reason": "needs 2 GPUs", "count": 1}],
    }


def test_a_skip_of_a_test_that_records_for_the_plugin_counts() -> None:
    """A conformance check that requests no fixture of the plugin (device binding) is labelled
    by a record from collection on: its skip at set-up used to go uncounted."""
    label = results.envelope("check", "device binding")
    skipped = make_report(
        "t.py::binding",
        "setup",
        "skipped",
        ("t.py", 3, "Skipped: needs 2 GPUs"),
        properties=[label],
    )
    assert results.skips_data(records_of(skipped)) == {
        "total": 1,
        "by_reason": [{"reason": "needs 2 GPUs", "count": 1}],
    }


def test_records_are_only_what_the_plugin_wrote() -> None:
    """A user's ``record_property`` under our prefix is the user's: kept among the test's own
    properties, never read as a record (it used to crash the summary)."""
    item_properties: list[Any] = [
        ("cudagraph_memory", 5),
        ("cudagraph_parity", {"form": "cases"}),
        ("cudagraph_phase", {results.ENVELOPE: {"forged": True}}),
        # Even with this run's token: the phase record is the report's own, never a property.
        (
            "cudagraph_phase",
            {results.ENVELOPE: {"forged": True}, results.TOKEN: results.run_token()},
        ),
        ("speed", 1.5),
        "not a pair",
    ]
    item_properties.append(results.envelope("parity", {"form": "cases", "checked": 2}))
    report = make_report("t.py::a", "call", "passed", properties=item_properties)
    *recorded, phase = results.records_from(report)
    assert recorded == [results.Record("parity", "t.py::a", {"form": "cases", "checked": 2})]
    assert phase.kind == results.PHASE
    assert phase.value["properties"] == [
        ["cudagraph_memory", 5],
        ["cudagraph_parity", {"form": "cases"}],
        ["cudagraph_phase", {results.ENVELOPE: {"forged": True}}],
        [
            "cudagraph_phase",
            {results.ENVELOPE: {"forged": True}, results.TOKEN: results.run_token()},
        ],
        ["speed", 1.5],
        [None, "not a pair"],
    ]
    # Records come from the call's report only: set-up and teardown hold the same list.
    teardown = make_report("t.py::a", "teardown", "passed", properties=item_properties)
    assert [record.kind for record in results.records_from(teardown)] == [results.PHASE]


def test_a_property_shaped_like_an_envelope_is_the_users() -> None:
    """Only an envelope ``record`` wrote carries this run's token: a user's value in the
    documented shape, with or without a token of its own, is never read as the plugin's."""
    ours = results.envelope("parity", {"checked": 1})
    forged = [
        ("cudagraph_parity", {results.ENVELOPE: {"checked": 1}}),
        ("cudagraph_check", {results.ENVELOPE: "guards", results.TOKEN: "a guess"}),
        ("cudagraph_check", {results.ENVELOPE: "guards", results.TOKEN: None}),
    ]
    assert results.plugin_values([*forged, ours]) == [("parity", {"checked": 1})]
    assert results.foreign_properties([*forged, ours]) == [list(pair) for pair in forged]


def test_a_worker_carries_its_controllers_token() -> None:
    own = results.run_token()
    try:
        results.join_run("the controller's")
        assert results.envelope("parity", 1)[1][results.TOKEN] == "the controller's"
        assert results.plugin_values([results.envelope("parity", 1)]) == [("parity", 1)]
    finally:
        results.join_run(own)
    with pytest.raises(TypeError, match="a run token is a non-empty string, got ''"):
        results.join_run("")


def self_holding_list() -> list[object]:
    looped: list[object] = [1]
    looped.append(looped)
    return looped


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


class SourText:
    def __str__(self) -> str:
        raise ValueError("no text")


def test_a_property_json_cannot_hold_is_kept_described_and_said() -> None:
    """Such a value used to crash the end of the run (a raw traceback and exit 1)."""
    huge = 10**5000
    properties = [
        ("huge", huge),
        ("looped", self_holding_list()),
        ("deep", nested(5000)),
        ("sour", SourText()),
        ("keys", {1: "int", "1": "str"}),
        ("fine", {3: object, "nan": float("nan")}),
    ]
    report = make_report("t.py::a", "call", "passed", properties=properties)
    [entry] = results.tests_data(records_of(report))
    stored = dict(entry["properties"])
    json.dumps(entry, allow_nan=False)  # strict JSON as it is
    assert int(stored["huge"].removeprefix(f"{results.NOT_JSON}an int, in hex "), 16) == huge
    assert stored["looped"] == [1, f"{results.NOT_JSON}a list that holds itself"]
    cut = stored["deep"]
    for _ in range(results.MAX_NESTING):
        [cut] = cut
    assert cut == f"{results.NOT_JSON}a list nested deeper than {results.MAX_NESTING} levels"
    assert (
        stored["sour"] == f"{results.NOT_JSON}a {__name__}.SourText whose str() raised ValueError"
    )
    assert stored["keys"] == [[1, "int"], ["1", "str"]]  # both kept: as keys, they print alike
    assert stored["fine"] == {"3": str(object), "nan": "nan"}
    assert results.tests_lines([entry]) == [
        "record_property values JSON cannot hold, kept as descriptions:",
        *(f"  t.py::a: {name!r}" for name in ("huge", "looped", "deep", "sour")),
    ]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [object()]}, "record 'x'['a'][0]: a value of type object is not plain data"),
        ({1: 2}, "record 'x': the key 1 is not a string"),
        (self_holding_list(), "record 'x'[1]: holds itself"),
        (nested(100), "record 'x'" + "[0]" * 64 + ": is deeper than 64 levels"),
    ],
    ids=["object", "key", "loop", "deep"],
)
def test_a_record_must_be_plain_data(value: object, problem: str) -> None:
    item = types.SimpleNamespace(user_properties=[])
    with pytest.raises(TypeError, match=f"^{re.escape(problem)} \\(dicts with string keys"):
        results.record(item, "x", value)  # type: ignore[arg-type]
    assert item.user_properties == []
    results.record(item, "x", {"a": [1, 2.5, float("nan"), None, "t", (True,)]})  # type: ignore[arg-type]


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
    assert results.failure_reason(report) == results.reason_of(report) == DRY_RUN_FAILURE
    assert results.tests_data(records_of(report))[0]["reason"] == DRY_RUN_FAILURE


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
    assert results.one_line(reason) == line


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        (3, TypeError, "a record's kind must be a string, got 3"),
        ("", ValueError, "must be a non-empty name other than 'phase'"),
        ("phase", ValueError, "must be a non-empty name other than 'phase'"),
    ],
)
def test_a_record_needs_a_kind_of_its_own(kind: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        results.envelope(kind, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["tests", "skips", "stray_contexts", "format", "session"])
def test_a_section_cannot_take_a_name_the_document_keeps(
    pytester: pytest.Pytester, name: str
) -> None:
    config = pytester.parseconfig()
    with pytest.raises(ValueError, match=f"{name!r} is a name the results document keeps"):
        results.add_section(config, results.Section(name, lambda records: None))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: results.Section("", lambda records: None), "a section's name must be a non-"),
        (lambda: results.Section(3, lambda records: None), "a section's name must be a non-"),
        (lambda: results.Section("mine", None), "section 'mine': data must be callable"),
        (lambda: results.Section("mine", list, "lines"), "section 'mine': lines must be callable"),
    ],
    ids=["empty name", "a number", "no data", "no lines"],
)
def test_a_section_is_checked_when_it_is_made(make: Callable[[], object], message: str) -> None:
    with pytest.raises(TypeError, match=f"^{re.escape(message)}"):
        make()


def test_add_section_takes_a_section(pytester: pytest.Pytester) -> None:
    with pytest.raises(TypeError, match=r"^add_section takes a results\.Section, got dict$"):
        results.add_section(pytester.parseconfig(), {"name": "mine"})  # type: ignore[arg-type]


def test_a_section_that_fails_says_so_and_the_rest_of_the_summary_stands() -> None:
    def broken(records: object) -> object:
        raise ZeroDivisionError("division by zero")

    sections = [
        results.Section("broken", broken),
        results.Section("wrong", lambda records: 1, lambda data: "not a list"),  # type: ignore[arg-type,return-value]
        results.SKIPS,
    ]
    records = records_of(skip_report("t.py::a", "needs CUDA"))
    assert results.summary_lines(sections, records) == [
        "the 'broken' section's summary failed: ZeroDivisionError: division by zero",
        "the 'wrong' section's lines must be a list of strings",
        "skips by reason:",
        "  1 x needs CUDA",
    ]
    with pytest.raises(ValueError, match=r"^the 'broken' section's data failed: ZeroDivisionError"):
        results.results_document(sections, records, None)


def run_of(*reports: pytest.TestReport) -> list[dict[str, object]]:
    return results.tests_data(records_of(*reports))


def test_each_run_of_a_test_is_one_entry_and_its_first_failure_stands() -> None:
    failed = make_report("t.py::a", "call", "failed", "AssertionError: 1 != 2\nmore")
    entries = run_of(
        make_report("t.py::a", "setup", "passed", duration=0.5),
        make_report("t.py::a", "call", "failed", "AssertionError: 1 != 2\nmore", duration=1.0),
        make_report("t.py::a", "teardown", "failed", "lock held", duration=0.25),
        # The same test again (--keep-duplicates, a rerun plugin): a run of its own.
        make_report("t.py::a", "setup", "passed"),
        make_report("t.py::a", "call", "passed", properties=[("speed", 2)]),
        make_report("t.py::a", "teardown", "passed", properties=[("speed", 2)]),
    )
    assert results.failure_reason(failed) == "AssertionError: 1 != 2\nmore"
    assert entries == [
        {
            "nodeid": "t.py::a",
            "outcome": "failed",
            "when": "call",
            "duration": 1.75,
            "reason": "AssertionError: 1 != 2\nmore",
            "properties": [],
        },
        {
            "nodeid": "t.py::a",
            "outcome": "passed",
            "when": "call",
            "duration": 0.0,
            "reason": "",
            "properties": [["speed", 2]],
        },
    ]


@pytest.mark.parametrize(
    ("reports", "outcome", "when", "reason"),
    [
        (
            [("setup", "failed", "fixture broke"), ("teardown", "passed", None)],
            "error",
            "setup",
            "fixture broke",
        ),
        (
            [
                ("setup", "passed", None),
                ("call", "passed", None),
                ("teardown", "failed", "left a lock"),
            ],
            "error",
            "teardown",
            "left a lock",
        ),
        (
            [
                ("setup", "skipped", ("t.py", 1, "Skipped: needs CUDA")),
                ("teardown", "passed", None),
            ],
            "skipped",
            "setup",
            "needs CUDA",
        ),
        ([("setup", "passed", None), ("call", "rerun", "flaky")], "rerun", "call", "flaky"),
        ([("setup", "passed", None)], "unfinished", "setup", ""),
    ],
    ids=["set-up error", "teardown error", "skip", "rerun", "interrupted"],
)
def test_the_phase_that_decides_a_run(
    reports: list[tuple[str, str, object]], outcome: str, when: str, reason: str
) -> None:
    [entry] = run_of(*(make_report("t.py::a", *report) for report in reports))
    assert (entry["outcome"], entry["when"], entry["reason"]) == (outcome, when, reason)


def test_runs_on_two_xdist_workers_interleave_without_mixing() -> None:
    def phases(worker: str, outcome: str) -> list[pytest.TestReport]:
        return [
            make_report(
                "t.py::a", when, result, "boom" if result == "failed" else None, worker_id=worker
            )
            for when, result in (("setup", "passed"), ("call", outcome), ("teardown", "passed"))
        ]

    gw0, gw1 = phases("gw0", "failed"), phases("gw1", "passed")
    entries = run_of(gw0[0], gw1[0], gw1[1], gw0[1], gw0[2], gw1[2])
    assert [entry["outcome"] for entry in entries] == ["failed", "passed"]


def test_xfail_and_xpass_say_so() -> None:
    xfailed = make_report("t.py::a", "call", "skipped", "AssertionError", wasxfail="known bug")
    xpassed = make_report("t.py::b", "call", "passed", wasxfail="known bug")
    assert [(e["outcome"], e["reason"]) for e in run_of(xfailed, xpassed)] == [
        ("xfailed", "known bug"),
        ("xpassed", "known bug"),
    ]


def test_a_collection_error_is_an_entry_and_a_passing_collection_none() -> None:
    failed = pytest.CollectReport("t.py", "failed", "ImportError: no module x\nmore", [])
    collected = pytest.CollectReport("u.py", "passed", None, [])
    assert run_of(failed, collected) == [
        {
            "nodeid": "t.py",
            "outcome": "error",
            "when": "collect",
            "duration": 0.0,
            "reason": "ImportError: no module x\nmore",
            "properties": [],
        }
    ]


@pytest.mark.parametrize(
    ("status", "stopped", "exit", "complete"),
    [
        (pytest.ExitCode.OK, None, "OK", True),
        (pytest.ExitCode.TESTS_FAILED, None, "TESTS_FAILED", True),
        (pytest.ExitCode.NO_TESTS_COLLECTED, None, "NO_TESTS_COLLECTED", True),
        (pytest.ExitCode.TESTS_FAILED, "stopping after 1 failures", "TESTS_FAILED", False),
        (pytest.ExitCode.INTERRUPTED, "KeyboardInterrupt", "INTERRUPTED", False),
        (pytest.ExitCode.INTERNAL_ERROR, None, "INTERNAL_ERROR", False),
        (17, None, "17", False),
    ],
)
def test_how_a_session_ended(status: int, stopped: str | None, exit: str, complete: bool) -> None:
    assert results.session_end(status, stopped) == results.SessionEnd(
        int(status), exit, complete, stopped
    )


def test_the_json_is_strict_whatever_the_values(tmp_path: Path) -> None:
    document = {"a": [float("nan"), float("inf"), -float("inf"), 1.5, (1, 2)], "b": {3: object}}
    path = tmp_path / "deep" / "r.json"
    results.write_json(path, document)

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "a": ["nan", "inf", "-inf", 1.5, [1, 2]],
        "b": {"3": str(object)},
    }
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[1]", "a results document is a JSON object"),
        ('{"format": 1}', "results of format 1; this plugin reads format 2"),
    ],
)
def test_a_file_that_is_not_our_results_is_refused_naming_it(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {message}"):
        results.read_document(path)


def git(folder: Path, *arguments: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    command = ["git", *identity, "-C", str(folder), *arguments]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make a repository")
def test_the_commit_is_the_folders_head_and_dirty_means_tracked_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert results.commit_of(tmp_path) is None  # no repository
    git(tmp_path, "init", "-q")
    assert results.commit_of(tmp_path) is None  # a repository with no commit yet
    (tmp_path / "tracked.txt").write_text("one\n")
    git(tmp_path, "add", "tracked.txt")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("new\n")
    assert results.commit_of(tmp_path) == {"sha": head, "dirty": False}
    (tmp_path / "tracked.txt").write_text("two\n")
    assert results.commit_of(tmp_path) == {"sha": head, "dirty": True}
    # The folder's own repository, whatever repository the environment points git at.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    assert results.commit_of(tmp_path) == {"sha": head, "dirty": True}
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert results.commit_of(tmp_path) is None


def test_stray_lines() -> None:
    clean = StrayCheck("pid 1", "")
    stray = StrayCheck("gw1 pid 2", "", ("NVIDIA H200 GPU-bbbb: 500 MiB",))
    hidden = StrayCheck("gw0 pid 3", "NVML lists this process on no GPU, so strays cannot be seen")
    assert results.stray_lines([clean], "report") == [
        "stray CUDA contexts: none (1 process(es) checked)"
    ]
    assert results.stray_lines([clean, stray, hidden], "fail") == [
        "stray CUDA contexts (on a GPU other than the process's own; fail the run):",
        "  gw1 pid 2: NVIDIA H200 GPU-bbbb: 500 MiB",
        "  gw0 pid 3: NVML lists this process on no GPU, so strays cannot be seen",
    ]


STRAY_CONFTEST = """
import pytest
from pytest_cudagraph import plugin
from pytest_cudagraph.engines.devices import StrayCheck

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    stray = StrayCheck("gw1 pid 7", "", ("Fake GPU GPU-bbbb: 500 MiB",))
    session.config.stash[plugin.STRAY_CHECKS].append(stray)
"""


@pytest.mark.parametrize(
    ("args", "exit_code", "consequence"),
    [
        ([], pytest.ExitCode.OK, "reported only"),
        (["--cudagraph-stray-contexts=fail"], pytest.ExitCode.TESTS_FAILED, "fail the run"),
    ],
)
def test_stray_contexts_are_reported_and_can_fail_the_run(
    pytester: pytest.Pytester, args: list[str], exit_code: pytest.ExitCode, consequence: str
) -> None:
    pytester.makeconftest(STRAY_CONFTEST)
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == exit_code
    result.stdout.fnmatch_lines(
        [
            "*= cudagraph =*",
            f"stray CUDA contexts (on a GPU other than the process's own; {consequence}):",
            "  gw1 pid 7: Fake GPU GPU-bbbb: 500 MiB",
            "*1 passed*",
        ]
    )


def test_bad_stray_mode_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_stray_contexts = crash")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini cudagraph_stray_contexts='crash': choose one of report, fail"]
    )


DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugin.md"


def documented_section_example() -> str:
    """The conftest docs/plugin.md gives for adding a section ("Extending the plugin")."""
    text = DOCS.read_text()
    start = text.index("- A new section of the results")
    block = text[text.index("```python", start) + len("```python") : text.index("```\n", start + 1)]
    return textwrap.dedent(block)


def test_other_modules_add_a_section_as_the_docs_say(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(documented_section_example())
    pytester.makepyfile(
        """
        def test_check(stale_reads):
            stale_reads(3)
        """
    )
    result = pytester.runpytest_inprocess("--cudagraph-json=results.json")
    result.stdout.fnmatch_lines(["*= cudagraph =*", "stale reads: test_*.py::test_check: 3"])
    document = json.loads((pytester.path / "results.json").read_text())
    assert document["stale_reads"] == [
        {"nodeid": "test_other_modules_add_a_section_as_the_docs_say.py::test_check", "count": 3}
    ]
    assert_valid_results(document)


def test_no_summary_section_when_nothing_to_say(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("def test_a(): pass")
    # A fresh process that sees no GPU: where CUDA has started (the header starts it on a GPU
    # host), the stray-context check always has a line to say, even if only "none".
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = pytester.runpytest_subprocess()
    assert "= cudagraph =" not in result.stdout.str()


def test_a_value_with_our_key_and_more_is_the_users() -> None:
    ours = results.envelope("parity", {"checked": 1})
    theirs = ("cudagraph_parity", {results.ENVELOPE: {"checked": 9}, "note": "mine"})
    assert results.plugin_values([ours, theirs]) == [("parity", {"checked": 1})]
    assert results.foreign_properties([ours, theirs]) == [list(theirs)]


def test_a_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(source: object, destination: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        results.write_json(tmp_path / "r.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


# What the results file may replace


def earlier_results(path: Path) -> Path:
    results.write_json(path, results.results_document([results.TESTS], [], None))
    return path


def user_file(path: Path) -> Path:
    path.write_text('{"format": 2, "mine": true}')  # JSON, even of our format, but not ours
    return path


def empty_file(path: Path) -> Path:
    path.touch()
    return path


def folder(path: Path) -> Path:
    path.mkdir()
    return path


def link_to_results(path: Path) -> Path:
    path.symlink_to(earlier_results(path.with_name("target.json")))
    return path


def link_to_stdout(path: Path) -> Path:
    path.symlink_to("/proc/self/fd/1")
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def folder_state(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Each entry's mode and, for a regular file, its content (links and FIFOs not opened)."""
    modes = {path: path.lstat().st_mode for path in folder.iterdir()}
    return {
        path.name: (mode, path.read_bytes() if stat.S_ISREG(mode) else None)
        for path, mode in modes.items()
    }


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (user_file, "holds a file that is not results of this plugin"),
        (empty_file, "holds a file that is not results of this plugin"),
        (folder, "is a folder; give a file path such as"),
        (link_to_results, "is a symlink, never written through nor replaced"),
        (link_to_stdout, "is a symlink, never written through nor replaced"),
        (fifo, "is a FIFO (only the results file of an earlier run is ever replaced)"),
    ],
    ids=["user file", "empty file", "folder", "link to results", "link to stdout", "fifo"],
)
def test_only_an_earlier_results_file_is_ever_replaced(
    tmp_path: Path, make: Callable[[Path], Path], problem: str
) -> None:
    path = make(tmp_path / "r.json")
    before = folder_state(tmp_path)
    for attempt in (
        results.check_replaceable,
        results.remove_earlier_results,
        lambda path: results.write_json(path, {"format": 2}),
    ):
        with pytest.raises(ValueError, match=re.escape(problem)):
            attempt(path)
    assert folder_state(tmp_path) == before  # nothing written or removed, no temporary file


def test_an_earlier_results_file_is_replaced_and_the_new_one_readable_by_others(
    tmp_path: Path,
) -> None:
    path = earlier_results(tmp_path / "r.json")
    results.check_replaceable(path)
    results.check_replaceable(tmp_path / "free" / "r.json")
    previous = os.umask(0o022)
    try:
        results.write_json(path, results.results_document([], [], None))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0o600: CI reads it
    results.remove_earlier_results(path)
    assert not path.exists()
    results.remove_earlier_results(path)  # nothing there is fine too


def test_a_long_results_name_leaves_room_for_the_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / ("r" * 250 + ".json")
    results.write_json(path, {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
