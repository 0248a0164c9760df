"""pytest-benchmark support: machine info, the synchronizing timer, and life without it."""

from __future__ import annotations

import json
import time

import pytest
import torch

from pytest_cudagraph.bench import gpu_machine_info, synchronizing_timer


def test_machine_info_names_gpus_driver_torch_and_cuda(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest-benchmark turns itself off in what looks like an xdist worker.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
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


def test_without_pytest_benchmark_the_rest_works(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import torch

        def test_parity(graph_parity, cuda_timer, pytestconfig):
            assert pytestconfig.pluginmanager.get_plugin("cudagraph-benchmark") is None
            assert cuda_timer() > 0
            graph_parity.check(torch.cos, torch.cos, lambda generator, case: torch.zeros(2), 2)

        def test_fixture_is_absent(cuda_benchmark):
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess("-p", "no:benchmark")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["E       fixture 'cuda_benchmark' not found"])


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
