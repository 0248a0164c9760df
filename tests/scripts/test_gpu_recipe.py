"""scripts/gpu_recipe.py, the GPU recipe's plan and run, on the CPU: the plan fits one device
session on the H200 host it is written for (or says by how much it does not), each of its parts
fits a ten-minute command, the test steps select the GPU tests, the stability and emulation
steps run what they are for, the schedule keeps the timed steps alone and the rest within the
cores, STEPS selects, every step is one the report knows, and a step cut by the budget is
interrupted whole (children included) and recorded so."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import gpu_recipe
import pytest
from gpu_recipe import PART_BUDGET_S, PLANNED_BUDGET_S, STEP_NAMES, Recipe, Step, plan, schedule

ROOT = Path(__file__).resolve().parents[2]
# The H200 host the plan is written for: 16 cores, one GPU.
H200_HOST = {"CORES": "16", "GPUS": "1"}
RECIPE_KNOBS = (*gpu_recipe.KNOBS, *gpu_recipe.RECORDING_KNOBS)


def dry_run(**knobs: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in RECIPE_KNOBS}
    shown = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_suite.sh"), "--dry-run", "OUTDIR"],
        capture_output=True,
        text=True,
        check=True,
        env={**env, **H200_HOST, **knobs},
    )
    return shown.stdout


def planned_seconds(shown: str) -> tuple[int, dict[str, int]]:
    """The dry run's planned total, and each part's seconds by its STEPS value."""
    [total] = re.findall(r"^planned total: (\d+) s", shown, re.M)
    parts = re.findall(r"^  STEPS='([^']*)': (\d+) s", shown, re.M)
    return int(total), {steps: int(seconds) for steps, seconds in parts}


@pytest.mark.xfail(
    strict=True,
    reason="at the last run's rates the stability and emulation steps take the plan past one "
    "session: two sessions, or less of them, is the lead's call",
)
def test_the_whole_plan_fits_one_device_session() -> None:
    total, _ = planned_seconds(dry_run())
    assert total <= PLANNED_BUDGET_S


def test_each_part_fits_one_command_and_the_parts_hold_every_step_once() -> None:
    shown = dry_run()
    total, parts = planned_seconds(shown)
    assert all(seconds <= PART_BUDGET_S for seconds in parts.values()), parts
    named = [name for steps in parts for name in steps.split()]
    assert sorted(named) == sorted(step.name for step in plan(Path("OUT"), 1, {}))
    # The timed ones first, apart from the rest.
    timed = [{"bench", "bench-compile"} >= set(steps.split()) for steps in parts]
    assert timed[:2] == [True, True] and not any(timed[2:]), parts
    # A plan past the budget says so.
    assert ("over by" in shown) == (total > PLANNED_BUDGET_S)
    # Each part, run alone with its STEPS, plans what the whole plan said it would.
    for steps, seconds in parts.items():
        part_total = planned_seconds(dry_run(STEPS=steps))[0]
        assert part_total == seconds, steps


def test_every_step_the_recipe_can_plan_is_one_the_report_knows() -> None:
    for gpus in (0, 1, 2, 8):
        for knobs in ({}, {"SKIP_BENCH": "1"}, {"BENCH_COMPARE": "1", "TEST_ARGS": "-x"}):
            names = [step.name for step in plan(Path("OUT"), gpus, knobs)]
            assert names == [name for name in STEP_NAMES if name in names]
    assert len(set(STEP_NAMES)) == len(STEP_NAMES)


def test_the_timed_steps_run_alone_first_and_the_rest_within_the_cores() -> None:
    steps = plan(Path("OUT"), 1, {})
    slots = schedule(steps, cores=16)
    alone = [slot for slot in slots if slot.step.alone]
    assert {slot.step.name for slot in alone} == {"bench", "bench-compile"}
    for slot in alone:
        overlapping = [
            other.step.name
            for other in slots
            if other is not slot and other.start_s < slot.end_s and slot.start_s < other.end_s
        ]
        assert overlapping == [], slot.step.name
    assert max(slot.end_s for slot in alone) == min(s.start_s for s in slots if not s.step.alone)
    moments = {slot.start_s for slot in slots}
    for moment in moments:
        busy = [s.step for s in slots if s.start_s <= moment < s.end_s]
        assert sum(step.cores for step in busy) <= 16, moment
    # Slowest first: the first steps to start beside others are the longest.
    shared = sorted((s for s in slots if not s.step.alone), key=lambda s: s.start_s)
    assert shared[0].step.planned_s == max(s.step.planned_s for s in shared)


def test_a_steps_cores_are_its_workers_as_the_last_option_gives_them() -> None:
    cores = {step.name: step.cores for step in plan(Path("OUT"), 2, {"TEST_ARGS": "-n 6"})}
    assert cores["tests"] == cores["tests-conformance"] == 6
    assert (cores["order-reasyn"], cores["conformance-xdist"], cores["conformance"]) == (4, 2, 1)
    # The stability and emulation runs keep every core of the host busy.
    assert cores["stability"] == cores["emulation"] == int(H200_HOST["CORES"])


def test_the_test_steps_select_the_tests_that_need_cuda() -> None:
    """The project's tests in the recipe are its GPU tests (CI runs the rest); the suite's own
    runs on targets are GPU work whole."""
    for knobs in ({}, {"TEST_ARGS": "-x"}):
        for step in plan(Path("OUT"), 1, knobs):
            if not step.is_pytest or "--benchmark-only" in step.args:
                continue
            if "--pyargs" in step.args:
                assert step.args[3] == "pytest_cudagraph.conformance", step.name
                continue
            assert step.args[2].startswith("tests"), step.name
            markers = [
                value for option, value in itertools.pairwise(step.args[2:]) if option == "-m"
            ]
            assert markers == ["cuda"], step.name
            if knobs:  # TEST_ARGS still come last
                assert step.args[-1] == "-x", step.name
    tested = {step.args[2] for step in plan(Path("OUT"), 1, {}) if "-m" in step.args[2:]}
    assert tested == {"tests", "tests/reasyn_ref", "tests/conformance"}


def test_stability_runs_reasyn_and_every_example_five_times() -> None:
    [step] = [s for s in plan(Path("OUT"), 1, {}) if s.name == "stability"]
    examples = sorted(
        f"pytest_cudagraph.examples.{path.stem}:make_target"
        for path in (ROOT / "pytest_cudagraph" / "examples").glob("*_target.py")
    )
    assert "pytest_cudagraph.examples.decode_token_target:make_target" in examples
    targets = ["reasyn", "reasyn-lean", "reasyn-kv", *examples]
    assert step.args[0] == "scripts/stability_report.py"
    assert list(step.args[-len(targets) :]) == targets
    assert step.args[1:3] == ("--runs", "5")
    assert step.cores == 16  # every core of the H200 host busy


def test_emulation_compares_the_correct_targets_and_every_broken_twin(tmp_path: Path) -> None:
    [step] = [s for s in plan(tmp_path, 1, {}) if s.name == "emulation"]
    assert step.args[0] == "scripts/emulation_report.py"
    assert step.pythonpath == "tests/conformance"  # the twins' modules importable
    twins_at = step.args.index("--twins")
    assert step.args[twins_at + 1] == "tests/conformance"
    split = step.args.index("--")
    correct = [*gpu_recipe.REASYN_TARGETS, *gpu_recipe.EXAMPLES]
    assert list(step.args[twins_at + 2 : split]) == correct
    assert step.args[split + 1 :] == ("-k", "not worker_processes")
    assert {"--out", str(tmp_path / "emulation"), "--report"} <= set(step.args)


def test_jobs_limits_the_steps_at_once() -> None:
    slots = schedule(plan(Path("OUT"), 1, {"SKIP_BENCH": "1"}), cores=16, jobs=1)
    ordered = sorted(slots, key=lambda slot: slot.start_s)
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(ordered))


def test_steps_selects_and_an_unknown_name_is_refused() -> None:
    shown = dry_run(STEPS="conformance-kv bench")
    assert re.findall(r"^== ([\w-]+):", shown, re.M) == ["bench", "conformance-kv"]
    refused = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_recipe.py"), "--dry-run", "OUTDIR"],
        capture_output=True,
        text=True,
        env={**os.environ, **H200_HOST, "STEPS": "conformance bench-everything"},
    )
    assert refused.returncode == 1
    assert "STEPS names no step of the recipe: bench-everything" in refused.stderr


def test_a_pytest_step_writes_its_results_and_keeps_out_pytest_randomly(tmp_path: Path) -> None:
    [step] = [s for s in plan(tmp_path, 1, {}) if s.name == "conformance"]
    argv = step.argv(tmp_path)
    assert argv[:3] == [sys.executable, "-m", "pytest"]
    assert {
        f"--junitxml={tmp_path}/conformance.xml",
        f"--cudagraph-json={tmp_path}/conformance.json",
    } <= set(argv)
    assert "no:randomly" in argv
    assert step.shown().startswith("pytest --pyargs pytest_cudagraph.conformance")
    [order] = [s for s in plan(tmp_path, 1, {}) if s.name == "order-reasyn"]
    assert order.argv(tmp_path)[-3:] == ["--", "-p", "randomly"]


def recipe(out: Path, **changes: object) -> Recipe:
    fields: dict = dict(
        out=out, label="cpu", commit="abc1234", gpus=0, cores=2, jobs=None, budget_s=None
    )
    return Recipe(**{**fields, **changes})


# A step that starts a child of its own (as xdist and pytester do), each of them writing what
# ended it; pytest's partial results on SIGINT are the plugin's (an interrupted session's file
# says it is partial), here it is the recipe's part: the signal, to the whole group, and the
# record.
INTERRUPTIBLE = """
import pathlib, signal, subprocess, sys, time

def on_interrupt(signum, frame):
    pathlib.Path(sys.argv[1]).write_text("interrupted")
    sys.exit(2)

signal.signal(signal.SIGINT, on_interrupt)
if sys.argv[2] == "parent":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1] + ".child", "child"])
time.sleep(120)
"""


@pytest.mark.slow
def test_a_step_cut_by_the_budget_is_interrupted_whole_and_recorded(tmp_path: Path) -> None:
    out, ended = tmp_path / "out", tmp_path / "ended"
    step = Step("probe", ("-c", INTERRUPTIBLE, str(ended), "parent", INTERRUPTIBLE), 1, "test")
    status = recipe(out, budget_s=5).run([step])
    assert status == 1
    [record] = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert record["cut"] == "budget" and record["exit"] == 2 and record["seconds"] < 60
    assert ended.read_text() == "interrupted"
    assert Path(f"{ended}.child").read_text() == "interrupted"
    assert json.loads((out / "recipe.json").read_text())["steps"] == ["probe"]


def fake_wheel(folder: Path, module: str) -> Path:
    """A wheel of one empty module, as pip builds them."""
    folder.mkdir()
    path = folder / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{module}.py", "")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.slow
def test_a_module_a_step_needs_comes_from_its_wheel_for_that_step_only(tmp_path: Path) -> None:
    module = "cudagraph_recipe_probe"
    fake_wheel(tmp_path / "wheels", module)
    check = ("-c", f"import {module}, sys; print({module}.__file__)")
    step = Step("probe", check, 1, "test", needs_module=module)
    out = tmp_path / "out"
    assert recipe(out, knobs={"WHEELS": str(tmp_path / "wheels")}).run([step]) == 0
    assert str(out / f"site-{module}") in (out / "probe.log").read_text()
    assert importlib.util.find_spec(module) is None  # not installed where the tests run


def test_a_missing_wheel_fails_the_step_saying_how_to_get_it(tmp_path: Path) -> None:
    step = Step(
        "probe", ("-c", "import absent_probe_module"), 1, "test", needs_module="absent_probe_module"
    )
    out = tmp_path / "out"
    out.mkdir()
    wheels = tmp_path / "wheels"
    assert recipe(out, knobs={"WHEELS": str(wheels)}).from_wheel(step) == []
    assert (out / "probe.log").read_text() == (
        f"absent_probe_module is not installed and {wheels} holds no absent_probe_module-*.whl: "
        "on a machine with network, pip download --no-deps absent-probe-module -d wheels, and "
        "carry that folder\n"
    )
