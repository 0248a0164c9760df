"""CI files: the workflows parse and have the shape GitHub Actions needs; the GPU recipe is one
script that tox and the GPU job call, runs every target and example, names the commit and is
what docs/ci.md gives; each set-up installs both distributions; the docs name the torch each job
installs; releases are tags, checked, then published; the pinned tox env installs the stack this
project pins."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from distributions import registered_targets
from gpu_recipe import INSTALL_TARGETS, KNOBS, RECORDING_KNOBS, STEP_NAMES

from pytest_cudagraph.engines.stack import parse_pinned_stack

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
EXAMPLES = ROOT / "pytest_cudagraph" / "examples"
FOREIGN = ROOT / "tests" / "conformance" / "foreign.py"
TARGET = re.compile(r"--cudagraph-target (\S+)")


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


# The recipe's knobs (scripts/gpu_recipe.py): those that change what runs (the report names
# them) and the rest. Set outside, as on a GPU host running the recipe, they would change what
# the dry run prints.
RECIPE_KNOBS = (*KNOBS, *RECORDING_KNOBS)


def recipe_env(**knobs: str) -> dict[str, str]:
    """This environment without the recipe's knobs, then ``knobs``."""
    return {**{k: v for k, v in os.environ.items() if k not in RECIPE_KNOBS}, **knobs}


def gpu_recipe_steps(**knobs: str) -> dict[str, str]:
    """Step name -> command, as ``scripts/gpu_suite.sh --dry-run`` prints them."""
    shown = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_suite.sh"), "--dry-run", "OUTDIR"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=recipe_env(**{"GPUS": "0", **knobs}),
    )
    # The script makes OUTDIR absolute; the docs write it as given.
    lines = shown.stdout.replace(str(ROOT / "OUTDIR"), "OUTDIR").splitlines()
    steps = [line.removeprefix("== ").split(": ", 1) for line in lines if line.startswith("== ")]
    return dict(steps)


def targets_of(steps: dict[str, str]) -> set[str]:
    return {target for command in steps.values() for target in TARGET.findall(command)}


def test_the_gpu_recipe_is_written_once_and_called_by_tox_and_the_gpu_job() -> None:
    workflow = load_workflow(WORKFLOWS / "gpu.yml")
    assert {"self-hosted", "gpu"} <= set(workflow["jobs"]["gpu"]["runs-on"])
    lines = run_lines(workflow, "gpu")
    assert [line for line in lines if "gpu_suite.sh" in line] == [
        "bash scripts/gpu_suite.sh gpu-results ci"
    ]
    assert not [line for line in lines if line.startswith("pytest")], "pytest outside the recipe"
    assert command_lines(tox_env("gpu")) == [
        "bash {tox_root}/scripts/gpu_suite.sh {posargs:{work_dir}/gpu-results tox}"
    ]


def test_the_gpu_recipe_runs_every_installed_target_and_example() -> None:
    targets = targets_of(gpu_recipe_steps())
    assert set(registered_targets("reasyn-ref")) <= targets
    examples = {
        f"pytest_cudagraph.examples.{path.stem}:make_target"
        for path in EXAMPLES.glob("*_target.py")
    } - {"pytest_cudagraph.examples.hand_written_target:make_target"}
    # The hand-written example runs as the foreign target, which is it.
    assert (
        "from pytest_cudagraph.examples.hand_written_target import make_target"
        in FOREIGN.read_text()
    )
    assert examples | {"foreign:make_target", "my_graphs:make_target"} <= targets
    # Under xdist only with two GPUs or more, one worker each.
    assert "conformance-xdist" not in gpu_recipe_steps(GPUS="1")
    assert gpu_recipe_steps(GPUS="2")["conformance-xdist"].endswith(
        "--cudagraph-target reasyn -n 2"
    )


def test_the_gpu_recipe_compares_benchmarks_with_the_baseline_when_asked() -> None:
    assert "--benchmark-compare" not in gpu_recipe_steps()["bench"]
    compared = gpu_recipe_steps(BENCH_COMPARE="1")["bench"]
    assert "--benchmark-compare=benchmarks/baseline/{cudagraph_stack_id}/baseline.json" in compared
    assert "--benchmark-compare-fail=median:25%" in compared


def test_docs_ci_gives_every_step_of_the_gpu_recipe() -> None:
    docs = (ROOT / "docs" / "ci.md").read_text().splitlines()
    for name, command in gpu_recipe_steps(GPUS="2", BENCH_COMPARE="1").items():
        assert command in docs, f"docs/ci.md does not give step {name}: `{command}`"


def test_the_report_knows_every_step_of_the_gpu_recipe_in_its_order() -> None:
    assert list(gpu_recipe_steps(GPUS="2")) == list(STEP_NAMES)


def test_knobs_set_outside_do_not_change_the_recipe_the_tests_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = gpu_recipe_steps()
    for knob in RECIPE_KNOBS:
        monkeypatch.setenv(knob, "1")
    assert gpu_recipe_steps() == default


def test_the_gpu_recipe_names_the_commit_of_the_clone(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git clone: the recipe reports the commit GIT_COMMIT gives")
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT).returncode != 0
    shown = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_suite.sh"), "--dry-run", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env=recipe_env(GPUS="0"),
    )
    expected = head.stdout.strip() + ("-dirty" if dirty else "")
    assert shown.stdout.splitlines()[0] == f"commit: {expected}"
    given = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_suite.sh"), "--dry-run", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env=recipe_env(GPUS="0", GIT_COMMIT="abc1234"),
    )
    assert given.stdout.splitlines()[0] == "commit: abc1234"
    assert list(tmp_path.iterdir()) == [], "a dry run writes nothing"


def torch_pins(text: str) -> set[str]:
    return set(re.findall(r"torch==(\d+\.\d+\.\d+)", text))


def test_the_readme_and_docs_ci_name_the_torch_each_job_installs() -> None:
    [cpu] = torch_pins((ROOT / ".ci" / "run").read_text())
    gpu = load_workflow(WORKFLOWS / "gpu.yml")["jobs"]["gpu"]["env"]["TORCH_VERSION"]
    for doc in ("README.md", "docs/ci.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert f"torch {cpu}" in text and f"torch {gpu}" in text, doc
        assert torch_pins(text) <= {cpu, gpu}, f"{doc} pins a torch no job installs"


def test_each_set_up_of_the_repository_installs_both_distributions() -> None:
    both = "-e . -e ./reasyn_ref"
    assert '-e ".[test,lint,transformers]" -e ./reasyn_ref' in (ROOT / ".ci" / "run").read_text()
    assert '-e ".[test]" -e ./reasyn_ref' in "\n".join(
        run_lines(load_workflow(WORKFLOWS / "gpu.yml"), "gpu")
    )
    assert " ".join(INSTALL_TARGETS) == both
    assert tox_env("pinned").parser.get("testenv", "commands_pre").split() == [
        "python",
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "-e",
        "{tox_root}/reasyn_ref",
    ]
    assert '-e ".[test]" -e ./reasyn_ref' in (ROOT / "README.md").read_text()


def test_a_release_is_a_tag_checked_then_published_by_trusted_publishing() -> None:
    workflow = load_workflow(WORKFLOWS / "release.yml")
    assert workflow["on"] == {"push": {"tags": ["v*"]}}
    assert {
        "bash scripts/build_dists.sh dist",
        'python scripts/check_release.py "$GITHUB_REF_NAME" dist',
    } <= set(run_lines(workflow, "build"))
    publish = workflow["jobs"]["publish"]
    assert publish["needs"] == "build"
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    assert [step["uses"] for step in publish["steps"]][-1].startswith(
        "pypa/gh-action-pypi-publish@"
    )
    assert "trusted publishing" in (ROOT / "docs" / "ci.md").read_text()


def tox_env(name: str) -> configparser.SectionProxy:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox[f"testenv:{name}"]


def command_lines(env: configparser.SectionProxy) -> list[str]:
    lines = env["commands"].replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip()]


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
