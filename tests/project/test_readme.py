"""The README's quick start: it fits one screen, says how long each step takes, shows the files
of tests/project/quickstart/ as they are, and runs as written (here, and in CI from the built
wheel alone: .ci/run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pytest_cudagraph.skips import NEEDS_CUDA

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = Path(__file__).resolve().parent / "quickstart"
SCREEN_LINES = 50
# A file shown in the README: a python block whose first line is a comment naming it.
FILE_BLOCK = re.compile(r"```python\n# (?P<name>\w+\.py)\n(?P<code>.*?)```", re.DOTALL)
BASH_BLOCK = re.compile(r"```bash\n(?P<code>.*?)```", re.DOTALL)
DURATION = re.compile(r"# \d+ (s|min)\b")


def readme() -> str:
    return (ROOT / "README.md").read_text()


def quick_start() -> str:
    text = readme()
    start = text.index("## Quick start")
    return text[start : text.index("\n## ", start)].rstrip("\n")


def commands() -> list[str]:
    """The quick start's shell commands, in order, each with its comment."""
    return [
        line for block in BASH_BLOCK.finditer(quick_start()) for line in block["code"].splitlines()
    ]


def command(prefix: str) -> str:
    [found] = [line for line in commands() if line.startswith(prefix)]
    return found


def test_the_quick_start_fits_one_screen() -> None:
    assert len(quick_start().splitlines()) <= SCREEN_LINES


@pytest.mark.parametrize(
    "step",
    [
        "python3 -m venv",
        'python -m pip install "torch==',
        "pytest test_my_model.py",
        "pytest --pyargs pytest_cudagraph.conformance",
    ],
)
def test_each_step_says_how_long_it_takes(step: str) -> None:
    assert DURATION.search(command(step)), f"no duration: {command(step)}"


def test_the_readme_shows_the_quick_start_files_as_they_are() -> None:
    shown = {match["name"]: match["code"] for match in FILE_BLOCK.finditer(readme())}
    assert shown == {path.name: path.read_text() for path in sorted(QUICKSTART.glob("*.py"))}
    # Every python snippet of the README is one of them: none with names defined nowhere.
    assert readme().count("```python") == len(shown)


def test_ci_runs_the_quick_start_commands_on_the_wheel_alone() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for step in ("pytest test_my_model.py", "pytest --pyargs pytest_cudagraph.conformance"):
        typed = command(step).split("#")[0].strip()
        assert any(line.strip() == typed for line in ci), f".ci/run does not run `{typed}`"


@pytest.fixture
def user_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder holding the README's two files, as the README shows them."""
    for match in FILE_BLOCK.finditer(quick_start()):
        (pytester.path / match["name"]).write_text(match["code"])
    return pytester


def run_as_typed(project: pytest.Pytester, step: str) -> pytest.RunResult:
    words = command(step).split("#")[0].split()
    assert words[0] == "pytest"
    return project.runpytest_subprocess(*words[1:], "-rs")


@pytest.mark.slow
def test_the_users_test_runs_as_written(user_project: pytest.Pytester) -> None:
    result = run_as_typed(user_project, "pytest test_my_model.py")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] *: {NEEDS_CUDA}"])


@pytest.mark.slow
def test_the_conformance_command_runs_as_written(user_project: pytest.Pytester) -> None:
    result = run_as_typed(user_project, "pytest --pyargs pytest_cudagraph.conformance")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "conformance of my_graphs:make_target (*):",
            "  target contract * passed *",
        ]
    )
    if torch.cuda.is_available():
        result.stdout.fnmatch_lines(["  parity * passed *"])


TEST_COMMAND_BUDGET_S = 120  # on 2 cores without a GPU


def developer_test_command() -> str:
    """The last command of the README's "Developing this repository" block: the test command."""
    text = readme()
    start = text.index("## Developing this repository")
    [block] = BASH_BLOCK.findall(text[start : text.index("\n### ", start)])
    return block.strip().splitlines()[-1]


def test_the_test_command_says_it_fits_its_budget_and_ci_runs_it_and_the_rest() -> None:
    line = developer_test_command()
    typed, _, comment = line.partition("#")
    seconds = re.fullmatch(r" (\d+) s on 2 cores without a GPU", comment)
    assert seconds, f"the test command gives no duration on 2 cores: {line}"
    assert int(seconds[1]) <= TEST_COMMAND_BUDGET_S
    typed = typed.strip()
    assert typed.endswith('-m "not slow"'), typed
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    # CI runs the command as typed, then the slow tests it leaves out: everything.
    assert typed in ci
    assert typed.replace('-m "not slow"', "-m slow") in ci
