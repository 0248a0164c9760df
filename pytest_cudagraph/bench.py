"""pytest-benchmark support: GPU facts in machine_info, and a timer that waits for the GPU.

CUDA kernels run asynchronously, so a host clock read right after a launch measures the
launch, not the work; the timer synchronizes the device before reading the clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from pytest_cudagraph import devices


def synchronizing_timer(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter`` that first waits for all work queued on ``device``."""
    if device.type != "cuda":
        return time.perf_counter

    def cuda_synchronized_perf_counter() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return cuda_synchronized_perf_counter


def gpu_machine_info() -> dict[str, object]:
    """GPU, driver, torch and CUDA, so saved benchmarks from different stacks tell apart."""
    nvml = devices.nvml_status()
    return {
        "gpus": [
            f"{gpu.name} ({gpu.total_bytes // devices.MiB} MiB)" for gpu in devices.visible_gpus()
        ],
        "nvidia_driver": nvml.detail if nvml.available else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }


class BenchmarkHooks:
    """Registered only when pytest-benchmark is active (its hook names are unknown otherwise)."""

    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, object]
    ) -> None:
        machine_info.update(gpu_machine_info())

    @pytest.fixture
    def cuda_benchmark(self, benchmark: object, cuda_timer: Callable[[], float]) -> object:
        """pytest-benchmark's ``benchmark`` whose timer synchronizes ``cuda_device``."""
        # pytest-benchmark's public timer= marker argument cannot see the test's device.
        benchmark._timer = cuda_timer
        return benchmark
