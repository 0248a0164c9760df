"""scripts/gpu_report.py builds its report from the plugin's results files, through the
plugin's own Markdown rendering, adding only what the results cannot know."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import gpu_recipe
import pytest
import torch
from script_modules import script_module

from pytest_cudagraph import report_markdown


@pytest.fixture
def gpu_report() -> Iterator[ModuleType]:
    with script_module("gpu_report") as module:
        yield module


# Each step's planned seconds and limit on a one-GPU host.
PLANNED = {step.name: step.planned_s for step in gpu_recipe.plan(Path("OUT"), 1, {})}
LIMITS = {step.name: step.limit_s for step in gpu_recipe.plan(Path("OUT"), 1, {})}


def write_run(outdir: Path, outcomes: dict[str, int | str], selected: list[str]) -> None:
    """What gpu_recipe.py leaves besides the steps' own files: recipe.json, and a line of
    steps.jsonl per step of ``outcomes`` (its exit code, or what cut it)."""
    recipe = {
        "command": "STEPS='tests conformance' bash scripts/gpu_suite.sh $OUT cpu",
        "commit": "abc123",
        "cores": 16,
        "gpus": 1,
        "planned": PLANNED,
        "steps": selected,
    }
    (outdir / "recipe.json").write_text(json.dumps(recipe))
    lines = []
    for step, code in outcomes.items():
        cut = code if isinstance(code, str) else None
        record = {"step": step, "exit": 2 if cut else code, "seconds": 12.0,
                  "planned_s": PLANNED[step], "limit_s": LIMITS[step], "cut": cut}  # fmt: skip
        lines.append(json.dumps(record))
    (outdir / "steps.jsonl").write_text("\n".join(lines) + "\n")


STEP_TESTS = """
import pytest
import torch

def test_parity(graph_parity):
    graph_parity.check(torch.cos, torch.cos, lambda g, c: torch.randn(2), cases=3)

@pytest.mark.fake_memory(growth_mib=1)
@pytest.mark.graph_memory_bound(8)
def test_memory():
    pass

def test_skipped(cuda_device):
    pytest.skip("no GPU here")

def test_failing(record_property):
    record_property("speedup key=(8, 64)", 4.2)
    assert 1 == 2
"""


def test_report_from_a_real_step(cpu_pytester: pytest.Pytester, gpu_report: ModuleType) -> None:
    cpu_pytester.makepyfile(STEP_TESTS)
    outdir = cpu_pytester.path / "out"
    outdir.mkdir()
    cpu_pytester.runpytest_inprocess(f"--cudagraph-json={outdir / 'tests.json'}").assert_outcomes(
        passed=2, failed=1, skipped=1
    )
    # A step killed part-way leaves its record and no results; one step was cut at its
    # limit, one not started, one not selected.
    write_run(
        outdir,
        {"tests": 1, "conformance": 137, "conformance-kv": "limit"},
        selected=["tests", "conformance", "conformance-kv", "conformance-lean"],
    )
    report = gpu_report.render([outdir], "cpu", "abc123")
    document = json.loads((outdir / "tests.json").read_text())
    # The stack line reports the facts the plugin recorded, and those are this machine's.
    assert len(document["stack"]["gpus"]) == torch.cuda.device_count()
    lines = report.splitlines()
    for line in [
        "# GPU run: cpu",
        "- commit: abc123",
        "- command: `STEPS='tests conformance' bash scripts/gpu_suite.sh $OUT cpu`",
        f"| tests | failed (exit 1) | 12 | {PLANNED['tests']} |",
        f"| conformance | failed (exit 137) | 12 | {PLANNED['conformance']} |",
        f"| conformance-kv | cut off by its limit ({LIMITS['conformance-kv']} s) after 12 s: the "
        f"results it had | 12 | {PLANNED['conformance-kv']} |",
        "| conformance-lean | did not run: the run's budget (BUDGET_S) ran out or the run was "
        f"stopped | - | {PLANNED['conformance-lean']} |",
        f"| bench | not run (not in STEPS) | - | {PLANNED['bench']} |",
        "## tests",
        "### Tests",
        "2 passed, 1 failed, 1 skipped",
        "## conformance",
        "No results: the step exited 137 without writing conformance.json.",
    ]:
        assert line in lines, line
    assert lines.index("## tests") < lines.index("## conformance")
    # The step's body is the plugin's own rendering of its results, not a copy of it.
    body = report_markdown.body_lines(document, level=3)
    start = lines.index("## tests") + 2
    assert lines[start : start + len(body)] == body
    assert (
        "- `test_report_from_a_real_step.py::test_failing` failed at call: assert 1 == 2" in lines
    )
    assert "| test_report_from_a_real_step.py::test_failing | speedup key=(8, 64) | 4.2 |" in lines
    assert "3 of 3 checked cases match." in lines
    assert "- 1 x no GPU here" in lines


def test_the_commit_comes_from_the_results_when_not_given(
    cpu_pytester: pytest.Pytester, gpu_report: ModuleType
) -> None:
    outdir = cpu_pytester.path / "out"
    outdir.mkdir()
    cpu_pytester.makepyfile("def test_a(): pass")
    cpu_pytester.runpytest_inprocess(f"--cudagraph-json={outdir / 'tests.json'}")
    document = json.loads((outdir / "tests.json").read_text())
    document["commit"] = {"sha": "f" * 40, "dirty": True}
    (outdir / "tests.json").write_text(json.dumps(document))
    assert f"- commit: {'f' * 40} (dirty)" in gpu_report.render([outdir], "cpu").splitlines()


def test_unreadable_results_are_said_per_step(tmp_path: Path, gpu_report: ModuleType) -> None:
    (tmp_path / "tests.json").write_text('{"format": 1}')
    report = gpu_report.render([tmp_path], "cpu", "abc123")
    assert "Results unreadable: " in report
    assert "results of format 1; this plugin reads format 2" in report


def test_the_parts_of_a_run_in_several_folders_make_one_report(
    tmp_path: Path, gpu_report: ModuleType
) -> None:
    timed, shared = tmp_path / "timed", tmp_path / "shared"
    timed.mkdir()
    shared.mkdir()
    write_run(timed, {"bench": 0, "bench-compile": 0}, selected=["bench", "bench-compile"])
    (timed / "bench-h200.md").write_text("# Benchmarks\n\nthe goals table\n")
    write_run(shared, {"order-reasyn": 1}, selected=["order-reasyn"])
    (shared / "order-reasyn.md").write_text(
        "## Order independence: reasyn\n\n1 of 28 checks differ.\n"
    )
    report = gpu_report.render([timed, shared], "h200")
    lines = report.splitlines()
    assert f"| bench | passed | 12 | {PLANNED['bench']} |" in lines
    assert f"| order-reasyn | failed (exit 1) | 12 | {PLANNED['order-reasyn']} |" in lines
    assert f"| tests | not run (not in STEPS) | - | {PLANNED['tests']} |" in lines
    assert (
        lines.count("- command: `STEPS='tests conformance' bash scripts/gpu_suite.sh $OUT cpu`")
        == 2
    )
    # The order step's own Markdown is its section; the benchmark report closes the report.
    assert lines.index("## order-reasyn") < lines.index("1 of 28 checks differ.")
    assert lines[lines.index("## Benchmarks") + 2 :] == ["# Benchmarks", "", "the goals table"]
