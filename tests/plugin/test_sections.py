"""The sections built from the records (each test's runs, the skips, the stray contexts), a
section's own checks, and the "cudagraph" terminal summary."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import pytest
from made_reports import make_report, records_of, skip_report

from pytest_cudagraph import reasons, records, results, sections
from pytest_cudagraph.engines.devices import StrayCheck
from pytest_cudagraph.markers.cuda_graph_parity import ParityMarker
from pytest_cudagraph.markers.graph_memory_bound import MemoryBoundMarker


def test_summary_lines_from_records() -> None:
    found = [
        records.Record(
            "parity", "t.py::a", {"form": "cases", "checked": 8, "passed": 8, "failures": []}
        ),
        records.Record(
            "parity", "t.py::a", {"form": "cases", "checked": 4, "passed": 3, "failures": []}
        ),
        records.Record(
            "parity", "t.py::b", {"form": "toggle", "checked": 1, "passed": 1, "failures": []}
        ),
        records.Record(
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
    markers = [
        sections.Section(
            feature.results_key,
            partial(feature.section_data, None),
            partial(feature.section_lines, None),
        )
        for feature in (ParityMarker, MemoryBoundMarker)
    ]
    lines = sections.summary_lines([*markers, sections.SKIPS], found)
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
    assert sections.summary_lines([sections.SKIPS], []) == []


def test_the_skip_total_counts_skips_not_reasons() -> None:
    """Two skips of one reason are two; a user's own skip, an xfail and a pass are none."""
    xfail = make_report("t.py::x", "call", "skipped", "AssertionError", wasxfail="known")
    setattr(xfail, records.USES_PLUGIN, True)
    found = records_of(
        skip_report("t.py::a", "needs CUDA"),
        skip_report("t.py::b", "needs CUDA"),
        skip_report("t.py::c", "needs 2 GPUs"),
        skip_report("t.py::d", "not today", uses_plugin=False),
        xfail,
        make_report("t.py::e", "call", "passed", **{records.USES_PLUGIN: True}),
    )
    assert sections.skips_data(found) == {
        "total": 3,
        "by_reason": [{"reason": "needs CUDA", "count": 2}, {"reason": "needs 2 GPUs", "count": 1}],
    }


def test_a_skip_of_a_test_that_records_for_the_plugin_counts() -> None:
    """A conformance check that requests no fixture of the plugin (device binding) is labelled
    by a record from collection on: its skip at set-up used to go uncounted."""
    label = records.envelope("check", "device binding")
    skipped = make_report(
        "t.py::binding",
        "setup",
        "skipped",
        ("t.py", 3, "Skipped: needs 2 GPUs"),
        properties=[label],
    )
    assert sections.skips_data(records_of(skipped)) == {
        "total": 1,
        "by_reason": [{"reason": "needs 2 GPUs", "count": 1}],
    }


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: sections.Section("", lambda records: None), "a section's name must be a non-"),
        (lambda: sections.Section(3, lambda records: None), "a section's name must be a non-"),
        (lambda: sections.Section("mine", None), "section 'mine': data must be callable"),
        (lambda: sections.Section("mine", list, "lines"), "section 'mine': lines must be callable"),
    ],
    ids=["empty name", "a number", "no data", "no lines"],
)
def test_a_section_is_checked_when_it_is_made(make: Callable[[], object], message: str) -> None:
    with pytest.raises(TypeError, match=f"^{re.escape(message)}"):
        make()


def test_a_section_that_fails_says_so_and_the_rest_of_the_summary_stands() -> None:
    def broken(records: object) -> object:
        raise ZeroDivisionError("division by zero")

    parts = [
        sections.Section("broken", broken),
        sections.Section("wrong", lambda records: 1, lambda data: "not a list"),  # type: ignore[arg-type,return-value]
        sections.SKIPS,
    ]
    found = records_of(skip_report("t.py::a", "needs CUDA"))
    assert sections.summary_lines(parts, found) == [
        "the 'broken' section's summary failed: ZeroDivisionError: division by zero",
        "the 'wrong' section's lines must be a list of strings",
        "skips by reason:",
        "  1 x needs CUDA",
    ]
    with pytest.raises(ValueError, match=r"^the 'broken' section's data failed: ZeroDivisionError"):
        results.results_document(parts, found, None)


def run_of(*reports: pytest.TestReport) -> list[dict[str, object]]:
    return sections.tests_data(records_of(*reports))


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
    assert reasons.failure_reason(failed) == "AssertionError: 1 != 2\nmore"
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


def test_stray_lines() -> None:
    clean = StrayCheck("pid 1", "")
    stray = StrayCheck("gw1 pid 2", "", ("NVIDIA H200 GPU-bbbb: 500 MiB",))
    hidden = StrayCheck("gw0 pid 3", "NVML lists this process on no GPU, so strays cannot be seen")
    assert sections.stray_lines([clean], "report") == [
        "stray CUDA contexts: none (1 process(es) checked)"
    ]
    assert sections.stray_lines([clean, stray, hidden], "fail") == [
        "stray CUDA contexts (on a GPU other than the process's own; fail the run):",
        "  gw1 pid 2: NVIDIA H200 GPU-bbbb: 500 MiB",
        "  gw0 pid 3: NVML lists this process on no GPU, so strays cannot be seen",
    ]
