"""pytest-benchmark support: machine info, storage per stack, the synchronizing timer, and
life without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pytest_cudagraph import bench
from pytest_cudagraph.bench import (
    STACK_PLACEHOLDER,
    fill_stack_paths,
    gpu_machine_info,
    stack_id,
    stack_id_of,
    synchronizing_timer,
)

SMALL_BENCHMARK = """
def test_sum(benchmark):
    benchmark.pedantic(sum, args=(range(100),), rounds=3)
"""


@pytest.fixture
def bench_pytester(pytester: pytest.Pytester, outside_xdist: None) -> pytest.Pytester:
    """A project with one small benchmark, run as pytest-benchmark runs it outside xdist."""
    pytester.makepyfile(test_small=SMALL_BENCHMARK)
    return pytester


@pytest.mark.usefixtures("outside_xdist")
def test_machine_info_names_gpus_driver_torch_and_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_bench(benchmark):
            benchmark(sum, range(10))
        """
    )
    output = pytester.path / "bench.json"
    pytester.runpytest_inprocess(f"--benchmark-json={output}").assert_outcomes(passed=1)
    machine_info = json.loads(output.read_text())["machine_info"]
    assert {key: machine_info[key] for key in gpu_machine_info()} == gpu_machine_info()
    assert machine_info["torch"] == torch.__version__
    assert machine_info["torch_cuda"] == torch.version.cuda
    assert machine_info["cudagraph_stack_id"] == stack_id()


def test_stack_id_names_python_torch_cuda_and_gpu() -> None:
    assert (
        stack_id_of("3.12.3", "2.11.0+cu130", "13.0", "NVIDIA H200")
        == "py3.12-torch2.11.0+cu130-cuda13.0-NVIDIA-H200"
    )
    assert stack_id_of("3.11.9", "2.13.0+cpu", None, None) == "py3.11-torch2.13.0+cpu-nogpu"
    # Whatever a GPU is called, the id stays one folder name.
    assert stack_id_of("3.10.1", "2.7.1", "12.6", "Tesla V100/SXM2 (32GB)") == (
        "py3.10-torch2.7.1-cuda12.6-Tesla-V100-SXM2-32GB"
    )


def test_stack_id_is_this_process_stack() -> None:
    python = ".".join(sys.version.split(".")[:2])
    assert stack_id().startswith(f"py{python}-torch{torch.__version__}-")
    assert stack_id().endswith("-nogpu") != torch.cuda.is_available()


def never_called() -> str:
    raise AssertionError("the stack id was computed for a run that does not need it")


def test_paths_without_the_placeholder_are_left_alone() -> None:
    options = {
        "benchmark_storage": "file://./.benchmarks",
        "benchmark_compare": "0001",
        "benchmark_json": Path("out.json"),
        "benchmark_autosave": "tag",
    }
    assert fill_stack_paths(options, never_called) == {}


def test_storage_is_filled_only_when_the_run_saves_or_compares() -> None:
    storage = f"file://./.benchmarks/{STACK_PLACEHOLDER}"
    assert (
        fill_stack_paths({"benchmark_storage": storage, "benchmark_compare": []}, never_called)
        == {}
    )
    expected = {"benchmark_storage": "file://./.benchmarks/S"}
    for used in (
        {"benchmark_save": "name"},
        {"benchmark_autosave": "tag"},
        {"benchmark_compare": True},
    ):
        assert fill_stack_paths({"benchmark_storage": storage, **used}, lambda: "S") == expected


def test_a_compare_path_is_filled(tmp_path: Path) -> None:
    baseline = tmp_path / "S" / "baseline.json"
    baseline.parent.mkdir()
    baseline.write_text("{}")
    options = {"benchmark_compare": str(tmp_path / STACK_PLACEHOLDER / "baseline.json")}
    assert fill_stack_paths(options, lambda: "S") == {"benchmark_compare": str(baseline)}


def test_a_missing_compare_file_says_how_to_record_it(tmp_path: Path) -> None:
    compare = str(tmp_path / STACK_PLACEHOLDER / "baseline.json")
    with pytest.raises(
        ValueError, match=r"no benchmark file .*S.baseline\.json for this stack.*mkdir -p "
    ):
        fill_stack_paths({"benchmark_compare": compare}, lambda: "S")


@pytest.mark.parametrize(
    "json_option",
    [
        pytest.param(Path(f"out/{STACK_PLACEHOLDER}/run.json"), id="path (pytest-benchmark 5.3+)"),
        pytest.param(
            SimpleNamespace(name=f"out/{STACK_PLACEHOLDER}/run.json"),
            id="opened file (pytest-benchmark before 5.3)",
        ),
    ],
)
def test_the_placeholder_in_the_json_path_is_refused(json_option: object) -> None:
    with pytest.raises(ValueError, match=r"--benchmark-json=out/\{cudagraph_stack_id\}/run"):
        fill_stack_paths({"benchmark_json": json_option}, never_called)


def test_runs_are_saved_and_compared_per_stack(bench_pytester: pytest.Pytester) -> None:
    stack = stack_id()
    storage = f"--benchmark-storage=file://./.benchmarks/{STACK_PLACEHOLDER}"
    # Recorded as the compare error says; pytest-benchmark before 5.3 opens the JSON file
    # while parsing arguments, so its folder must exist.
    recorded = bench_pytester.path / "benchmarks" / stack / "baseline.json"
    recorded.parent.mkdir(parents=True)
    saved = bench_pytester.runpytest_inprocess(
        storage, "--benchmark-autosave", f"--benchmark-json={recorded}"
    )
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines([f"cudagraph: benchmarks of stack {stack}"])
    stored = list((bench_pytester.path / ".benchmarks" / stack).rglob("*.json"))
    assert len(stored) == 1, f"expected the run saved under .benchmarks/{stack}"
    assert json.loads(recorded.read_text())["machine_info"]["cudagraph_stack_id"] == stack

    compared = bench_pytester.runpytest_inprocess(
        storage,
        f"--benchmark-compare=benchmarks/{STACK_PLACEHOLDER}/baseline.json",
        "--benchmark-compare-fail=median:1000000%",
    )
    compared.assert_outcomes(passed=1)
    compared.stderr.fnmatch_lines([f"*Comparing against benchmarks from*{recorded.name}*"])


def test_comparing_without_a_baseline_is_a_usage_error(bench_pytester: pytest.Pytester) -> None:
    result = bench_pytester.runpytest_inprocess(
        f"--benchmark-compare=benchmarks/{STACK_PLACEHOLDER}/baseline.json"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--benchmark-compare: no benchmark file benchmarks/{stack_id()}/baseline.json*"]
    )


def test_the_placeholder_in_the_json_option_is_a_usage_error(
    bench_pytester: pytest.Pytester,
) -> None:
    # pytest-benchmark 5.3+ passes the path on and the plugin refuses it; before 5.3 argparse
    # fails to open the file. Either way nothing is written under a literal placeholder.
    result = bench_pytester.runpytest_inprocess(
        f"--benchmark-json=benchmarks/{STACK_PLACEHOLDER}/baseline.json"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--benchmark-json*{cudagraph_stack_id}/baseline.json*"])
    assert not (bench_pytester.path / "benchmarks").exists()


def test_a_run_that_saves_nothing_never_asks_for_the_stack(
    bench_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "stack_id", never_called)
    result = bench_pytester.runpytest_inprocess(
        f"--benchmark-storage=file://./.benchmarks/{STACK_PLACEHOLDER}", "--benchmark-disable"
    )
    result.assert_outcomes(passed=1)
    assert "cudagraph: benchmarks of stack" not in result.stdout.str()


def test_filling_in_after_pytest_benchmark_started_is_refused(
    bench_pytester: pytest.Pytester,
) -> None:
    config = bench_pytester.parseconfigure()
    assert config.pluginmanager.has_plugin("pytest-benchmark")
    config.option.benchmark_storage = f"file://./.benchmarks/{STACK_PLACEHOLDER}"
    config.option.benchmark_autosave = True
    with pytest.raises(pytest.UsageError, match="pytest-benchmark's session started before"):
        bench.BenchmarkHooks().pytest_configure(config)


def test_the_module_imports_neither_torch_nor_nvml() -> None:
    code = (
        "import sys, pytest_cudagraph.bench; print(sorted({'torch', 'pynvml'} & set(sys.modules)))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert shown.stdout.strip() == "[]"


def test_cuda_benchmark_is_benchmark_with_the_device_timer(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        def test_bench(cuda_benchmark, benchmark, cuda_timer):
            assert cuda_benchmark is benchmark
            assert benchmark._timer is cuda_timer
            cuda_benchmark(sum, range(10))
        """
    )
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)


@pytest.mark.usefixtures("outside_xdist")
def test_a_cuda_benchmark_runs_under_benchmark_only(cpu_pytester: pytest.Pytester) -> None:
    """--benchmark-only skips a test that does not request ``benchmark``; cuda_benchmark does."""
    cpu_pytester.makepyfile(
        """
        def test_bench(cuda_benchmark):
            cuda_benchmark(sum, range(10))

        def test_not_a_benchmark():
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess("--benchmark-only")
    result.assert_outcomes(passed=1, skipped=1)


def test_without_pytest_benchmark_the_rest_works(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import torch

        def test_parity(graph_parity, cuda_timer, pytestconfig):
            assert pytestconfig.pluginmanager.get_plugin("cudagraph-benchmark") is None
            assert cuda_timer() > 0
            graph_parity.check(torch.cos, torch.cos, lambda generator, case: torch.zeros(2), 2)

        def test_benchmark(cuda_benchmark):
            cuda_benchmark(sum, range(10))
        """
    )
    result = cpu_pytester.runpytest_inprocess("-p", "no:benchmark", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] *: {bench.NEEDS_BENCHMARK}"])


def test_timer_for_a_cpu_device_is_the_plain_clock() -> None:
    assert synchronizing_timer(torch.device("cpu")) is time.perf_counter


def test_timer_for_a_cuda_device_synchronizes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", synchronized.append)
    timer = synchronizing_timer(torch.device("cuda", 1))
    before = time.perf_counter()
    assert timer() >= before
    assert synchronized == [torch.device("cuda", 1)]
    assert timer.__name__ == "cuda_synchronized_perf_counter"


def test_a_stack_folder_without_its_baseline_file_is_still_missing(tmp_path: Path) -> None:
    (tmp_path / "S").mkdir()
    compare = str(tmp_path / STACK_PLACEHOLDER / "baseline.json")
    with pytest.raises(ValueError, match=r"no benchmark file .*S.baseline\.json for this stack"):
        fill_stack_paths({"benchmark_compare": compare}, lambda: "S")
