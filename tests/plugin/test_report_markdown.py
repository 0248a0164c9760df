"""The Markdown report of a results document: each section's data, read by field."""

from __future__ import annotations

import json

from pytest_cudagraph import report_markdown, results

FACTS = results.StackFacts("3.12.3", "2.11.0+cu130", "13.0", "580.159.04", "ok")


def document(**sections: object) -> dict[str, object]:
    """A results document as the plugin writes it, with these sections."""
    made = [
        results.Section(name, lambda records, data=data: data) for name, data in sections.items()
    ]
    end = results.session_end(1, None)
    return json.loads(json.dumps(results.results_document(made, [], FACTS, session=end)))


def test_the_header_names_each_gpu_the_driver_and_the_commit() -> None:
    gpu = {"device": "cuda:0", "name": "NVIDIA H200", "total_bytes": 150_121_545_728}
    facts = document()
    facts["stack"]["gpus"] = [gpu, gpu]
    facts["commit"] = {"sha": "a" * 40, "dirty": False}
    lines = report_markdown.header_lines(facts)
    assert lines[1:] == [
        f"- pytest-cudagraph {facts['plugin_version']}",
        f"- commit: {'a' * 40}",
        "- GPUs: NVIDIA H200 (140 GiB), NVIDIA H200 (140 GiB); driver 580.159.04",
        "- python 3.12.3, torch 2.11.0+cu130, torch CUDA 13.0",
    ]
    assert report_markdown.header_lines(facts, commit="given")[2] == "- commit: given"
    facts["stack"] |= {"gpus": [], "driver": None, "torch_cuda": None}
    assert report_markdown.header_lines(facts)[3:] == [
        "- GPUs: none; driver none",
        "- python 3.12.3, torch 2.11.0+cu130, torch CUDA none",
    ]


def test_commit_text() -> None:
    assert report_markdown.commit_text(None) == "unknown"
    assert report_markdown.commit_text({"sha": "abc", "dirty": True}) == "abc (dirty)"
    assert report_markdown.commit_text({"sha": "abc", "dirty": None}) == "abc (dirty: unknown)"


def test_how_the_session_ended_comes_first() -> None:
    ended = document()
    assert (
        report_markdown.body_lines(ended, 2)[0]
        == "Session: complete; exit status 1 (TESTS_FAILED)."
    )
    ended["session"] = results.session_end(2, "KeyboardInterrupt").__dict__
    assert report_markdown.body_lines(ended, 2)[0] == (
        "Session: PARTIAL (KeyboardInterrupt); exit status 2 (INTERRUPTED)."
    )
    ended["session"] = None
    assert report_markdown.body_lines(ended, 2)[0] == "Session end: not recorded."


def section(name: str, data: object, level: int = 2) -> list[str]:
    """The lines of one section: its heading and body."""
    return report_markdown.body_lines(document(**{name: data}), level)[2:]


def test_tests_are_counted_and_the_failures_and_properties_listed() -> None:
    def run(nodeid: str, outcome: str, reason: str = "", properties: list | None = None) -> dict:
        return {
            "nodeid": nodeid,
            "outcome": outcome,
            "when": "call" if outcome != "error" else "setup",
            "duration": 0.1,
            "reason": reason,
            "properties": properties or [],
        }

    runs = [
        run("t.py::a", "passed", properties=[["speedup | key", 4.2]]),
        run("t.py::b", "failed", "assert 1 == 2"),
        run("t.py::c", "error", "fixture broke"),
        run("t.py::d", "xfailed", "known"),
        run("t.py::e", "unfinished"),
    ]
    assert section("tests", runs) == [
        "## Tests",
        "",
        "1 passed, 1 failed, 1 error, 0 skipped, 1 xfailed, 1 unfinished",
        "",
        "Not passing:",
        "",
        "- `t.py::b` failed at call: assert 1 == 2",
        "- `t.py::c` error at setup: fixture broke",
        "- `t.py::e` unfinished at call: ",
        "",
        "Recorded properties:",
        "",
        "| test | property | value |",
        "| --- | --- | --- |",
        "| t.py::a | speedup \\| key | 4.2 |",
        "",
    ]


def test_parity_lists_each_test_and_each_mismatch_by_its_fields() -> None:
    mismatch = {"path": "output[0]", "first_index": [3, 12], "eager": 0.5, "graphed": "nan"}
    entries = [
        {"nodeid": "t.py::a", "form": "cases", "checked": 8, "passed": 8},
        {
            "nodeid": "t.py::b",
            "form": "cases",
            "checked": 4,
            "passed": 3,
            "failures": [{"title": "case 2 of 4", "mismatches": [mismatch]}],
        },
    ]
    assert section("parity", entries) == [
        "## Parity",
        "",
        "11 of 12 checked cases match.",
        "",
        "| test | form | checked | match |",
        "| --- | --- | --- | --- |",
        "| `t.py::a` | cases | 8 | 8 |",
        "| `t.py::b` | cases | 4 | 3 |",
        "",
        "`t.py::b`, case 2 of 4:",
        "",
        "- `output[0]`: first_index [3, 12], eager 0.5, graphed nan",
        "",
    ]


def test_memory_conformance_skips_and_strays() -> None:
    figures = {
        "nodeid": "t.py::c",
        "device": "cuda:0",
        "growth_mib": 1.5,
        "peak_growth_mib": 40.0,
        "torch_reserved_growth_mib": 0.0,
        "outside_torch_growth_mib": 1.5,
        "bound_mib": 64,
        "passed": False,
        "warning": "torch grew",
    }
    assert section("memory", [figures])[4:] == [
        "| `t.py::c` | cuda:0 | +1.5 | 64 | OVER | +40.0 | +1.5 |",
        "",
        "Warnings:",
        "",
        "- `t.py::c`: torch grew",
        "",
    ]
    row = {"check": "guards", "verdict": "FAILED", "seconds": 1.25, "figure": "1 of 2"}
    row |= {"reason": "AssertionError: accepted", "values": {"refused": 1}}
    skipped = {"check": "parity", "verdict": "skipped", "seconds": None, "figure": ""}
    skipped |= {"reason": "needs CUDA", "values": {}}
    assert section("conformance", {"target": "reasyn", "rows": [row, skipped]})[2:] == [
        "Target `reasyn`:",
        "",
        "| check | verdict | seconds | figure |",
        "| --- | --- | --- | --- |",
        "| guards | FAILED | 1.2 | 1 of 2; AssertionError: accepted |",
        "| parity | skipped | - | needs CUDA |",
        "",
    ]
    skips = {"total": 3, "by_reason": [{"reason": "needs CUDA", "count": 3}]}
    assert section("skips", skips) == [
        "## Skips by reason (tests that use the plugin)",
        "",
        "- 3 x needs CUDA",
        "",
    ]
    assert section("skips", {"total": 0, "by_reason": []}) == []
    checks = [
        {"process": "gw0 pid 1", "note": "", "strays": ["GPU-b: 500 MiB"]},
        {"process": "gw1 pid 2", "note": "NVML lists it nowhere", "strays": []},
    ]
    assert section("stray_contexts", checks)[2:] == [
        "2 process(es) checked; stray contexts on a GPU other than the process's own:",
        "",
        "- gw0 pid 1: GPU-b: 500 MiB",
        "- gw1 pid 2: NVML lists it nowhere",
        "",
    ]


def test_another_plugins_section_is_shown_as_its_json() -> None:
    assert section("my_checks", [{"ok": True}], level=3) == [
        "### my_checks",
        "",
        "```json",
        '[\n  {\n    "ok": true\n  }\n]',
        "```",
        "",
    ]


def test_render_titles_the_whole_report() -> None:
    text = report_markdown.render(document(parity=[]), title="nightly")
    assert text.startswith("# nightly\n\n- date: ")
    assert text.endswith(".\n")  # the session line; the empty parity section says nothing
    assert "Parity" not in text


DRY_RUN_FAILURE = (
    "AssertionError: 2 of 2 dry calls failed:\n"
    "  case 0: eager on key (1, 64): KeyError: 'hidden'\n"
    "  case 1: eager on key (2, 64): KeyError: 'hidden'"
)


def test_a_reason_of_several_lines_is_shown_in_one_line_then_whole() -> None:
    """The report used to read "AssertionError: 2 of 2 dry calls failed:" and no more."""
    run = {"nodeid": "t.py::a", "outcome": "failed", "when": "call", "duration": 0.1}
    run |= {"reason": DRY_RUN_FAILURE + "\n```fenced```", "properties": []}
    assert section("tests", [run])[4:] == [
        "Not passing:",
        "",
        "- `t.py::a` failed at call: AssertionError: 2 of 2 dry calls failed: case 0: eager on "
        "key (1, 64): KeyError: 'hidden'",
        "",
        "  ````text",  # longer than any run of backticks in the reason
        "  AssertionError: 2 of 2 dry calls failed:",
        "    case 0: eager on key (1, 64): KeyError: 'hidden'",
        "    case 1: eager on key (2, 64): KeyError: 'hidden'",
        "  ```fenced```",
        "  ````",
        "",
        "",
    ]
    row = {"check": "dry run", "verdict": "FAILED", "seconds": 0.5, "figure": "eager once"}
    row |= {"reason": DRY_RUN_FAILURE, "values": {}}
    assert section("conformance", {"target": "mine:make", "rows": [row]})[2:] == [
        "Target `mine:make`:",
        "",
        "| check | verdict | seconds | figure |",
        "| --- | --- | --- | --- |",
        "| dry run | FAILED | 0.5 | eager once; AssertionError: 2 of 2 dry calls failed: case 0: "
        "eager on key (1, 64): KeyError: 'hidden' |",
        "",
        "Reasons in full:",
        "",
        "- dry run (FAILED): AssertionError: 2 of 2 dry calls failed: case 0: eager on key (1, "
        "64): KeyError: 'hidden'",
        "",
        "  ```text",
        "  AssertionError: 2 of 2 dry calls failed:",
        "    case 0: eager on key (1, 64): KeyError: 'hidden'",
        "    case 1: eager on key (2, 64): KeyError: 'hidden'",
        "  ```",
        "",
    ]
