"""The plugin on a real GPU: CUDA graphs, NVML, sync debug mode, xdist binding, the header.

Every test here skips, with the reason, where CUDA (or NVML) is absent; the CPU suite
covers the same logic with simulated devices.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
import torch
from gpu_graph_helpers import make_eager, make_graphed, make_inputs

from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.skips import needs_cuda

pytestmark = needs_cuda
needs_nvml = pytest.mark.skipif(
    not devices.nvml_status().available, reason=f"needs NVML: {devices.nvml_status().detail}"
)


@pytest.fixture
def eager_and_graphed(cuda_device: torch.device) -> tuple[Callable, Callable]:
    eager = make_eager(cuda_device)
    return eager, make_graphed(cuda_device, eager, (8, 16))


@pytest.mark.no_host_sync
@pytest.mark.cuda_graph_parity
def test_captured_graph_matches_its_eager_twin(graph_parity, eager_and_graphed) -> None:
    eager, graphed = eager_and_graphed
    result = graph_parity.check(eager, graphed, make_inputs, cases=16)
    assert (result.checked, result.passed) == (16, 16)


def test_a_different_graphed_callable_fails_parity(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        from gpu_graph_helpers import make_eager, make_graphed, make_inputs

        @pytest.mark.cuda_graph_parity
        def test_differs(graph_parity, cuda_device):
            eager = make_eager(cuda_device)
            drifting = lambda x: eager(x) + 1e-3 * torch.rand_like(x)  # RNG inside the graph
            graph_parity.check(eager, make_graphed(cuda_device, drifting, (8, 16)), make_inputs, 4)
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "cuda_graph_parity: case 0 of 4 differs: output at index (*): eager *, graphed * "
            "(|diff| *; tolerance exact); * of 128 elements differ, largest |diff| *; input "
            "shapes: input (8, 16); seed 0; 4 of 4 cases differ; rerun: pytest *",
            "*- cudagraph parity -*",
            "parity: 0 of 4 checked cases match",
        ]
    )


@pytest.mark.cuda_graph_parity(toggle="PYTEST_CUDAGRAPH_DEMO_GRAPHS", seed=0)
def test_toggle_form_compares_eager_and_graph_runs(
    graph_parity, eager_and_graphed, cuda_device
) -> None:
    eager, graphed = eager_and_graphed
    forward = graphed if os.environ["PYTEST_CUDAGRAPH_DEMO_GRAPHS"] == "1" else eager
    for _ in range(3):
        tokens = torch.randn(8, 16, device=cuda_device)  # global CUDA RNG, seeded alike
        graph_parity.record("probabilities", forward(tokens))
        graph_parity.record("sample", torch.multinomial(forward(tokens), 1))


@pytest.mark.no_host_sync
def test_pure_device_code_passes_no_host_sync(cuda_device: torch.device) -> None:
    generator = torch.Generator(device=cuda_device).manual_seed(0)
    x = torch.randn(64, 64, device=cuda_device, generator=generator)
    torch.softmax(x @ x.T, dim=-1).cumsum(-1)


def test_no_host_sync_catches_item_and_cpu_and_restores_the_mode(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.no_host_sync
        def test_item(cuda_device):
            torch.ones(3, device=cuda_device).sum().item()

        @pytest.mark.no_host_sync
        def test_cpu(cuda_device):
            torch.ones(3, device=cuda_device).cpu()

        def test_mode_restored():
            assert torch.cuda.get_sync_debug_mode() == 0
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*no_host_sync: the test body synchronized the host with the device, so this code is "
            "not capture-clean (torch: called a synchronizing CUDA operation)*"
        ]
    )
    assert torch.cuda.get_sync_debug_mode() == 0


@needs_nvml
@pytest.mark.graph_memory_bound(64)
def test_small_allocation_stays_within_the_bound(cuda_device: torch.device) -> None:
    scratch = torch.ones(1024, 1024, device=cuda_device)  # 4 MiB, freed with the body
    scratch.mul_(2)


@needs_nvml
def test_allocation_kept_past_the_body_fails_the_bound(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        from pytest_cudagraph.engines.units import MiB

        KEPT = []

        @pytest.mark.graph_memory_bound(64)
        def test_leaks(cuda_device):
            KEPT.append(torch.empty(256 * MiB, dtype=torch.uint8, device=cuda_device))
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "graph_memory_bound: this process's memory on cuda:0 grew by *, over the 64 MiB bound "
            "(torch reserved +256.0 MiB, outside torch *)",
            "*- cudagraph memory -*",
            "NVML, this process *",
            "torch reserved *+256.0",
        ]
    )


@needs_nvml
def test_nvml_probe_sees_this_process_and_its_peak(device_memory, cuda_device) -> None:
    before = device_memory.sample()
    assert before.process_bytes > 0
    kept = torch.empty(128 * MiB, dtype=torch.uint8, device=cuda_device)
    grown = device_memory.sample()
    assert grown.torch_reserved - before.torch_reserved >= 128 * MiB
    assert grown.process_bytes - before.process_bytes >= 120 * MiB
    with device_memory.measure() as measurement:
        spike = torch.empty(512 * MiB, dtype=torch.uint8, device=cuda_device)
        time.sleep(0.2)  # long enough for the background sampler to see it
        del spike
    report = measurement.report
    assert report.peak_process_bytes - report.before.process_bytes >= 500 * MiB
    assert abs(report.growth) < 64 * MiB
    del kept


def test_header_on_a_gpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(cuda_device): pass")
    result = pytester.runpytest_inprocess()
    result.stdout.fnmatch_lines(
        [
            f"cudagraph: python *, torch {torch.__version__} with CUDA {torch.version.cuda}, "
            "NVIDIA driver *",
            f"cudagraph: GPUs cuda:0 {torch.cuda.get_device_name(0)} (* GiB)*; NVML ok",
            "cudagraph: tests use cuda:0 (default)",
        ]
    )


def test_cuda_device_is_made_current(cuda_device: torch.device) -> None:
    assert cuda_device.type == "cuda"
    assert torch.cuda.current_device() == cuda_device.index


def test_cuda_benchmark_times_with_a_synchronizing_timer(
    request: pytest.FixtureRequest, cuda_device: torch.device
) -> None:
    if not request.config.pluginmanager.hasplugin("benchmark"):
        pytest.skip("needs pytest-benchmark active (it is off with -p no:benchmark or xdist)")
    cuda_benchmark = request.getfixturevalue("cuda_benchmark")
    x = torch.randn(1024, 1024, device=cuda_device)
    cuda_benchmark.pedantic(lambda: x @ x, rounds=3, iterations=2)
    assert cuda_benchmark._timer.__name__ == "cuda_synchronized_perf_counter"


@needs_nvml
def test_session_end_finds_no_stray_context(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_uses_the_gpu(cuda_device):
            torch.ones(1, device=cuda_device)
        """
    )
    # A fresh process: this one may hold contexts on other GPUs from earlier tests.
    result = pytester.runpytest_subprocess("--cudagraph-stray-contexts=fail")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["stray CUDA contexts: none (1 process(es) checked)"])


@needs_nvml
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: a stray needs another GPU")
def test_a_context_on_another_gpu_fails_the_run_when_asked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_touches_the_other_gpu(cuda_device):
            torch.ones(1, device="cuda:1")
        """
    )
    reported = pytester.runpytest_subprocess("--cudagraph-device=cuda:0")
    assert reported.ret == pytest.ExitCode.OK
    reported.stdout.fnmatch_lines(["stray CUDA contexts (on a GPU other than*", "*pid *: *MiB"])
    failed = pytester.runpytest_subprocess(
        "--cudagraph-device=cuda:0", "--cudagraph-stray-contexts=fail"
    )
    assert failed.ret == pytest.ExitCode.TESTS_FAILED


@needs_nvml
def test_xdist_workers_are_bound_to_one_gpu_each(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        from pytest_cudagraph import plugin

        @pytest.mark.parametrize("n", range(4))
        def test_bound(n, cuda_device, pytestconfig):
            worker = pytestconfig.workerinput["workerid"]
            binding = pytestconfig.stash[plugin.BINDING]
            assert binding.how.startswith(f"xdist worker {worker}: CUDA_VISIBLE_DEVICES=")
            assert torch.cuda.device_count() == 1
            assert cuda_device == torch.device("cuda", 0)
            torch.ones(1, device=cuda_device)
        """
    )
    result = pytester.runpytest_subprocess("-n", "2", "--cudagraph-stray-contexts=fail")
    result.assert_outcomes(passed=4)
    # The workers, and the controller if its header initialised CUDA.
    result.stdout.fnmatch_lines(["stray CUDA contexts: none ([23] process(es) checked)"])
