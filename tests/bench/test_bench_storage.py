"""Storage per stack and the committed baseline (CPU, runs in CI)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import pytest
import torch
from bench_storage import BASELINE_ROOT, DEFAULT_STORAGE, baseline_file, per_stack_storage, stack_id

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parents[1]


def test_stack_id_names_python_torch_and_the_device():
    stack = stack_id()
    python = ".".join(platform.python_version_tuple()[:2])
    assert stack.startswith(f"py{python}-torch{torch.__version__}-")
    if torch.cuda.is_available():
        assert f"-cuda{torch.version.cuda}-" in stack
    else:
        assert stack.endswith("-nogpu")
    assert re.fullmatch(r"[A-Za-z0-9.+_-]+", stack), "usable as one folder name"


def test_only_the_default_storage_gets_a_stack_folder():
    assert per_stack_storage(DEFAULT_STORAGE, "S") == f"{DEFAULT_STORAGE}/S"
    assert per_stack_storage("file:///elsewhere", "S") == "file:///elsewhere"


def test_baseline_file_is_the_last_json_of_the_stack(tmp_path):
    folder = tmp_path / BASELINE_ROOT / "S"
    with pytest.raises(ValueError, match=r"no benchmark baseline for stack S.*pytest tests/bench"):
        baseline_file(tmp_path, "S")
    folder.mkdir(parents=True)
    for name in ("0002_b.json", "0001_a.json", "notes.txt"):
        (folder / name).write_text("{}")
    assert baseline_file(tmp_path, "S") == folder / "0002_b.json"


SMALL_BENCHMARK = (
    "def test_sum(benchmark):\n    benchmark.pedantic(sum, args=(range(100),), rounds=3)\n"
)


@pytest.fixture
def bench_project(pytester, monkeypatch):
    """A project with this directory's conftest and one small benchmark."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCH_DIR), str(ROOT)]))
    # Under `pytest -n`, the inner run must not take itself for an xdist worker (pytest-benchmark
    # saves nothing from a worker).
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest((BENCH_DIR / "conftest.py").read_text())
    pytester.makepyfile(test_small=SMALL_BENCHMARK)
    return pytester


def test_runs_are_saved_and_compared_per_stack(bench_project):
    stack = stack_id()
    baseline = bench_project.path / BASELINE_ROOT / stack / "baseline.json"
    baseline.parent.mkdir(parents=True)
    saved = bench_project.runpytest_subprocess(
        "--benchmark-autosave", f"--benchmark-json={baseline}", "-p", "no:cacheprovider"
    )
    saved.assert_outcomes(passed=1)
    stored = list((bench_project.path / ".benchmarks" / stack).rglob("*.json"))
    assert len(stored) == 1, f"expected the run saved under .benchmarks/{stack}"

    compared = bench_project.runpytest_subprocess(
        "--bench-baseline", "--benchmark-compare-fail=median:1000000%", "-p", "no:cacheprovider"
    )
    compared.assert_outcomes(passed=1)
    compared.stderr.fnmatch_lines([f"*Comparing against benchmarks from*{baseline}*"])


def test_comparing_without_a_baseline_is_a_usage_error(bench_project):
    result = bench_project.runpytest_subprocess("--bench-baseline", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--bench-baseline: no benchmark baseline for stack {stack_id()}*"]
    )


def test_a_conftest_loaded_while_collecting_warns_when_saving(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCH_DIR), str(ROOT)]))
    # "suite" is not an initial conftest folder of a bare `pytest` (only test* ones are).
    suite = pytester.mkdir("suite")
    (suite / "conftest.py").write_text((BENCH_DIR / "conftest.py").read_text())
    (suite / "test_small.py").write_text(SMALL_BENCHMARK)
    result = pytester.runpytest_subprocess("--benchmark-autosave", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*benchmark storage is not per stack in this run*"])
    assert not (pytester.path / ".benchmarks" / stack_id()).exists()
