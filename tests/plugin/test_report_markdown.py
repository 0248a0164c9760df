"""The Markdown report of a results document: each section's data, read by field."""

from __future__ import annotations

import json

from pytest_cudagraph import report_markdown, results
from pytest_cudagraph.engines.devices import GpuInfo

H200 = GpuInfo("cuda:0", "NVIDIA H200", 150_121_545_728)
FACTS = results.StackFacts("3.12.3", "2.11.0+cu130", "13.0", "580.159.04", "ok", [H200])


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
    assert text.startswith(f"{report_markdown.MARK}\n# nightly\n\n- date: ")
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


def conformance_on(gpus: list[dict[str, object]], account: object) -> list[str]:
    """The conformance section of a run whose stack lists ``gpus``, with ``account``."""
    skipped = {"check": "parity", "verdict": "skipped", "seconds": None, "figure": ""}
    skipped |= {"reason": "needs CUDA: torch.cuda.is_available() is False", "values": {}}
    table: dict[str, object] = {"target": "mine:make", "rows": [skipped]}
    if account is not None:
        table["account"] = account
    made = document(conformance=table)
    made["stack"]["gpus"] = gpus
    return report_markdown.body_lines(made, 2)[2:]


def test_a_run_without_a_gpu_gives_its_account_under_the_table() -> None:
    """The results of a CPU run hold what it could not judge; the report used to drop it."""
    account = {
        "ran": ["draw", "key_of", "eager"],
        "gpu_skips": {"bounded memory": ["cache.reset", "cache.capacity"], "sampling": ["sampler"]},
    }
    lines = conformance_on([], account)
    assert lines[
        lines.index("| parity | skipped | - | needs CUDA: torch.cuda.is_available() is False |")
        + 1 :
    ] == [
        "",
        "Without a GPU:",
        "",
        "- No graph was captured, replayed or judged: a passing row above says only that its "
        "check passed without one.",
        "- Of your code, `draw`, `key_of`, `eager` ran (the dry run); your graphed side did not "
        "run.",
        "- On a GPU, 2 check(s) would still skip unless the factory gives there what the target "
        "made for the CPU lacks:",
        "  - bounded memory: needs `cache.reset`, `cache.capacity`",
        "  - sampling: needs `sampler`",
        "",
    ]
    everything = {"ran": ["draw", "key_of", "eager", "graphed"], "gpu_skips": {}}
    assert conformance_on([], everything)[-3:-1] == [
        "- Of your code, `draw`, `key_of`, `eager`, `graphed` ran (the dry run).",
        "- The target made for the CPU gives what every check needs.",
    ]
    assert conformance_on([], None)[-2] == (
        "- The dry run did not run: none of your code was called."
    )


def test_a_run_on_a_gpu_gives_no_cpu_account() -> None:
    gpu = {"device": "cuda:0", "name": "NVIDIA H200", "total_bytes": 150_121_545_728}
    lines = conformance_on([gpu], {"ran": ["draw", "key_of", "eager"], "gpu_skips": {}})
    assert not any("Without a GPU" in line or "your code" in line for line in lines)
    assert lines[-2].startswith("| parity | skipped |")


def pinned(data: dict[str, object]) -> str:
    [heading, _, line, _] = section("pinned_stack", data)
    assert heading == "## Pinned stack"
    return line


def test_the_pinned_stack_says_what_was_pinned_and_what_it_meant() -> None:
    """ "Pinned nothing; the running stack matches" said neither where nothing is pinned nor
    what became of the pinned_stack tests."""
    nothing = {"pinned": {}, "running_matches": True, "mismatches": [], "stack_mode": "pinned"}
    assert pinned(nothing) == (
        "No stack is pinned for the session (ini `cudagraph_pinned_stack`, "
        "`--cudagraph-pinned-stack` or `PYTEST_CUDAGRAPH_PINNED_STACK`), so a `pinned_stack` "
        "test ran only where its marker pins components itself and the running stack matches "
        "them; one whose marker pins nothing skipped."
    )
    matching = {"pinned": {"python": ">=3", "torch": ">=2"}, "running_matches": True}
    assert pinned(matching | {"mismatches": [], "stack_mode": "pinned"}) == (
        "The session pins python>=3, torch>=2, and the running stack matches it, so "
        "`pinned_stack` tests ran, but where a component their marker pins itself does not "
        "match."
    )
    off = {"pinned": {"python": "~=3.10.0"}, "running_matches": False, "stack_mode": "pinned"}
    off["mismatches"] = ["python 3.12.3 not ~=3.10.0"]
    assert pinned(off) == (
        "The session pins python~=3.10.0, and the running stack does not match it (python "
        "3.12.3 not ~=3.10.0), so `pinned_stack` tests skipped, but where the components their "
        "marker pins itself, in place of the session's, make a pin the running stack matches."
    )
    assert pinned(off | {"stack_mode": "any"}) == (
        "The session pins python~=3.10.0, and the running stack does not match it (python "
        "3.12.3 not ~=3.10.0), but the stack mode `any` (`--cudagraph-stack`) ran every "
        "`pinned_stack` test whatever the stack."
    )
