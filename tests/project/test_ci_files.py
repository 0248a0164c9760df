"""CI files: the workflows parse and have the shape GitHub Actions needs, the GPU recipe runs
what docs/ci.md says, and the pinned tox env installs the stack this project pins."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
import yaml

from pytest_cudagraph.engines.stack import parse_pinned_stack

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def load_workflow(path: Path) -> dict:
    workflow = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as True.
    if True in workflow:
        workflow["on"] = workflow.pop(True)
    return workflow


def workflow_problems(workflow: object) -> list[str]:
    """What keeps ``workflow`` (a parsed file) from being a GitHub Actions workflow."""
    if not isinstance(workflow, dict):
        return ["not a mapping"]
    problems = [f"no {key!r}" for key in ("name", "on", "jobs") if key not in workflow]
    jobs = workflow.get("jobs") or {}
    if not isinstance(jobs, dict) or not jobs:
        return [*problems, "jobs is not a non-empty mapping"]
    for job_name, job in jobs.items():
        if not isinstance(job, dict) or not job.get("runs-on"):
            problems.append(f"job {job_name}: no runs-on")
            continue
        steps = job.get("steps")
        if not isinstance(steps, list) or not steps:
            problems.append(f"job {job_name}: steps is not a non-empty list")
            continue
        for number, step in enumerate(steps, 1):
            kinds = [key for key in ("run", "uses") if key in step]
            if len(kinds) != 1:
                problems.append(f"job {job_name} step {number}: needs run or uses, got {kinds}")
            elif kinds == ["uses"] and "@" not in step["uses"]:
                problems.append(f"job {job_name} step {number}: {step['uses']} names no version")
    return problems


def run_lines(workflow: dict, job: str) -> list[str]:
    """Each command of a job's run steps, whitespace made single spaces."""
    lines = []
    for step in workflow["jobs"][job]["steps"]:
        if "run" in step:
            lines += [" ".join(line.split()) for line in step["run"].strip().splitlines()]
    return lines


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.yml")), ids=lambda path: path.name)
def test_each_workflow_is_well_formed(path: Path) -> None:
    assert workflow_problems(load_workflow(path)) == []


@pytest.mark.parametrize(
    ("workflow", "problem"),
    [
        ([], "not a mapping"),
        ({"name": "x", "on": "push", "jobs": {}}, "jobs is not a non-empty mapping"),
        ({"name": "x", "jobs": {"a": {"runs-on": "y", "steps": [{"run": "z"}]}}}, "no 'on'"),
        (
            {"name": "x", "on": "push", "jobs": {"a": {"steps": [{"run": "z"}]}}},
            "job a: no runs-on",
        ),
        (
            {"name": "x", "on": "push", "jobs": {"a": {"runs-on": "y", "steps": []}}},
            "job a: steps is not a non-empty list",
        ),
        (
            {"name": "x", "on": "push", "jobs": {"a": {"runs-on": "y", "steps": [{"name": "n"}]}}},
            "job a step 1: needs run or uses, got []",
        ),
        (
            {
                "name": "x",
                "on": "push",
                "jobs": {"a": {"runs-on": "y", "steps": [{"uses": "a/b"}]}},
            },
            "job a step 1: a/b names no version",
        ),
    ],
)
def test_a_broken_workflow_is_caught(workflow: object, problem: str) -> None:
    assert problem in workflow_problems(workflow)


def test_the_cpu_job_runs_what_ci_runs() -> None:
    workflow = load_workflow(WORKFLOWS / "cpu.yml")
    assert "bash .ci/run" in run_lines(workflow, "cpu")


def test_the_gpu_job_runs_on_a_gpu_runner_what_docs_ci_gives_for_any_ci() -> None:
    workflow = load_workflow(WORKFLOWS / "gpu.yml")
    assert {"self-hosted", "gpu"} <= set(workflow["jobs"]["gpu"]["runs-on"])
    pytest_commands = [line for line in run_lines(workflow, "gpu") if line.startswith("pytest")]
    assert any("--pyargs pytest_cudagraph.conformance" in line for line in pytest_commands)
    benchmarks = [line for line in pytest_commands if "--benchmark-compare-fail=" in line]
    assert len(benchmarks) == 1
    assert "benchmarks/baseline/{cudagraph_stack_id}/baseline.json" in benchmarks[0]
    docs = " ".join(
        " ".join(line.rstrip("\\").split())
        for line in (ROOT / "docs" / "ci.md").read_text().splitlines()
    )
    for command in pytest_commands:
        assert command in docs, f"docs/ci.md does not give `{command}`"


def tox_env(name: str) -> configparser.SectionProxy:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox[f"testenv:{name}"]


def command_lines(env: configparser.SectionProxy) -> list[str]:
    return [" ".join(line.split()) for line in env["commands"].replace("\\\n", " ").splitlines()]


def test_the_pinned_env_installs_the_stack_this_project_pins(pytestconfig: pytest.Config) -> None:
    # The project's own pin (pyproject.toml), not the plugin's: the plugin pins nothing.
    pinned = parse_pinned_stack(pytestconfig.getini("cudagraph_pinned_stack"))
    assert set(pinned) == {"python", "torch"}
    env = tox_env("pinned")
    python = env["base_python"].removeprefix("python")
    assert pinned["python"].contains(f"{python}.0")
    torch_pins = [
        line.strip() for line in env["deps"].splitlines() if line.strip().startswith("torch")
    ]
    assert torch_pins == ["torch==2.7.*"]
    assert all(pinned["torch"].contains(version) for version in ("2.7.0", "2.7.1"))
    # Its pinned-stack tests run again by name; nothing overrides the project's pin.
    commands = command_lines(env)
    assert any("-m pinned_stack -v" in line for line in commands)
    assert not any("cudagraph_pinned_stack" in line for line in commands)
