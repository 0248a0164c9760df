"""scripts/emulation_report.py and scripts/twins.py: the verdicts on emulated graphs against real
ones, read from the runs' files alone (tests/scripts/run_folders.py writes them as
scripts/suite_runs.py leaves them): a correct target failing under emulation what it passes on
the GPU fails the report, each twin is said caught or not; the twins are every factory of the
broken_*targets.py modules; and once, end to end, both halves run on the quick start."""

from __future__ import annotations

import os
from pathlib import Path

import emulation_report
import pytest
from run_folders import INTERRUPTED, write_run
from twins import twins

ROOT = Path(__file__).resolve().parents[2]
CORRECT = "pkg.example_target:make_target"
TWIN = "broken_targets:baked_memory"
GOOD = {"parity": "passed", "owned outputs": "passed", "guards": "passed"}


def halves(folder: Path, target: str, gpu: dict[str, str], emulated: dict[str, str]) -> None:
    name = emulation_report.slug(target)
    write_run(folder, f"{name}-gpu", gpu)
    write_run(folder, f"{name}-emulated", emulated)


def test_a_correct_target_failing_only_under_emulation_fails_the_report(tmp_path: Path) -> None:
    halves(tmp_path, CORRECT, GOOD, {**GOOD, "parity": "FAILED", "guards": "skipped"})
    shown, problems = emulation_report.markdown([CORRECT], [], tmp_path)
    assert problems == 1  # parity; a skip under emulation is shown, not a failure
    assert f"- {CORRECT}: parity" in shown
    assert f"| {CORRECT} | correct | parity passed -> FAILED; guards passed -> skipped |" in shown


def test_a_correct_target_failing_on_both_is_no_emulation_problem(tmp_path: Path) -> None:
    halves(tmp_path, CORRECT, {**GOOD, "parity": "FAILED"}, {**GOOD, "parity": "FAILED"})
    shown, problems = emulation_report.markdown([CORRECT], [], tmp_path)
    assert problems == 0
    assert f"| {CORRECT} | correct | none |" in shown


@pytest.mark.parametrize(
    ("emulated_fails", "caught"),
    [
        ({"parity", "owned outputs"}, "yes"),
        ({"parity", "owned outputs", "guards"}, "yes"),
        ({"parity"}, "partly, missed owned outputs"),
        (set(), "no"),
    ],
)
def test_each_twin_is_said_caught_or_not(
    tmp_path: Path, emulated_fails: set[str], caught: str
) -> None:
    gpu = {**GOOD, "parity": "FAILED", "owned outputs": "ERROR"}
    emulated = {check: "FAILED" if check in emulated_fails else "passed" for check in GOOD}
    halves(tmp_path, TWIN, gpu, emulated)
    shown, problems = emulation_report.markdown([], [TWIN], tmp_path)
    assert problems == 0  # a twin missed is reported, not failed
    [row] = [line for line in shown.splitlines() if line.startswith(f"| {TWIN} | owned")]
    assert row.endswith(f"| {caught} |")


def test_a_twin_the_gpu_does_not_fail_has_nothing_to_catch(tmp_path: Path) -> None:
    halves(tmp_path, TWIN, GOOD, GOOD)
    shown, _ = emulation_report.markdown([], [TWIN], tmp_path)
    assert f"| {TWIN} | - | - | nothing to catch: the GPU run failed no check |" in shown


def test_a_half_that_proves_nothing_fails_the_report(tmp_path: Path) -> None:
    halves(tmp_path, TWIN, GOOD, GOOD)
    name = emulation_report.slug(CORRECT)
    write_run(tmp_path, f"{name}-gpu", GOOD, exit_code=2, session=INTERRUPTED)
    (tmp_path / f"{name}-emulated.exit").write_text("4\n")  # e.g. the switch refused
    shown, problems = emulation_report.markdown([CORRECT], [TWIN], tmp_path)
    assert problems == 2
    assert f"- {CORRECT}, gpu: exited 2 and is partial (KeyboardInterrupt)" in shown
    assert f"- {CORRECT}, emulated: exited 4 and wrote no results to {name}-emulated.json" in shown


def test_each_target_runs_on_the_gpu_then_emulated_without_one() -> None:
    gpu, emulated = emulation_report.runs_of([CORRECT], ["-k", "not worker_processes"])
    assert (gpu.name, gpu.args, dict(gpu.env)) == (
        "pkg.example_target-make_target-gpu",
        ("-k", "not worker_processes"),
        {},
    )
    assert emulated.name == "pkg.example_target-make_target-emulated"
    assert emulated.args == ("-k", "not worker_processes", emulation_report.EMULATE_OPTION)
    assert emulated.env["CUDA_VISIBLE_DEVICES"] == ""


def test_the_twins_are_the_factories_of_the_broken_modules(tmp_path: Path) -> None:
    (tmp_path / "broken_probe_targets.py").write_text(
        "def made(device) -> CudaGraphTarget: ...\n"
        "def with_a_default(device, graph_class=None) -> CudaGraphTarget: ...\n"
        "def _private(device) -> CudaGraphTarget: ...\n"
        "def two_required(route, device) -> CudaGraphTarget: ...\n"
        "def a_helper(device) -> Callable: ...\n"
    )
    (tmp_path / "foreign.py").write_text("def twin(device) -> CudaGraphTarget: ...\n")
    assert twins(tmp_path) == ["broken_probe_targets:made", "broken_probe_targets:with_a_default"]
    found = twins(ROOT / "tests" / "conformance")
    assert {TWIN, "broken_kv_targets:baked_position", "broken_zoo_targets:lookup_by_real_size"} < (
        set(found)
    )
    assert "broken_witness_targets:rebinding_through" not in found  # needs its route too


def test_the_exit_status_is_the_reports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    halves(tmp_path, CORRECT, GOOD, GOOD)
    argv = ["--reuse", "--out", str(tmp_path), "--report", str(tmp_path / "e.md"), CORRECT]
    assert emulation_report.main(argv) == 0
    assert (tmp_path / "e.md").read_text() in capsys.readouterr().out
    halves(tmp_path, CORRECT, GOOD, {**GOOD, "guards": "ERROR"})
    assert emulation_report.main(argv) == 1


@pytest.mark.slow
@pytest.mark.usefixtures("outside_xdist")
def test_both_halves_run_on_the_quick_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The switch itself is the suite's; here a harmless option stands for it."""
    monkeypatch.setattr(emulation_report, "EMULATE_OPTION", "--strict-markers")
    paths = [str(ROOT / "tests" / "project" / "quickstart"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in paths if path))
    argv = ["--jobs", "2", "--out", str(tmp_path), "my_graphs:make_target"]
    assert emulation_report.main(argv) == 0, capsys.readouterr().out
    assert "| my_graphs:make_target | correct | none |" in capsys.readouterr().out
    assert (tmp_path / "my_graphs-make_target-emulated.exit").read_text() == "0\n"
