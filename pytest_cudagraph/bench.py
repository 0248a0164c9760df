"""pytest-benchmark support: GPU facts in machine_info, storage per stack, a GPU-aware timer,
and the cuda_benchmark fixture built on it (skipping, saying why, without pytest-benchmark).

CUDA kernels run asynchronously, so a host clock read right after a launch measures the
launch, not the work; the timer synchronizes the device before reading the clock.
pytest-benchmark names its storage after the OS and Python only, so runs on other GPUs or
torch builds would be compared; ``{cudagraph_stack_id}`` in ``--benchmark-storage`` or
``--benchmark-compare`` names the stack. Not in ``--benchmark-json``: pytest-benchmark before
5.3 opens that file while parsing arguments, before any plugin could fill the path in.
Nothing here imports torch or NVML until a benchmark needs it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch

# Written in --benchmark-storage or --benchmark-compare; replaced by stack_id().
STACK_PLACEHOLDER = "{cudagraph_stack_id}"
NEEDS_BENCHMARK = (
    "cuda_benchmark needs pytest-benchmark, which this session does not have "
    "(pip install pytest-benchmark, or drop -p no:benchmark)"
)


def synchronizing_timer(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter`` that first waits for all work queued on ``device``."""
    if device.type != "cuda":
        return time.perf_counter
    import torch

    def cuda_synchronized_perf_counter() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return cuda_synchronized_perf_counter


class MissingBenchmark:
    """``cuda_benchmark`` in a session without pytest-benchmark: it skips, saying why."""

    @pytest.fixture
    def cuda_benchmark(self) -> object:
        pytest.skip(NEEDS_BENCHMARK)


def gpu_machine_info() -> dict[str, object]:
    """GPU, driver, torch and CUDA, so saved benchmarks from different stacks tell apart."""
    from pytest_cudagraph import results
    from pytest_cudagraph.engines.units import MiB

    facts = results.stack_facts()
    return {
        "gpus": [f"{gpu.name} ({gpu.total_bytes // MiB} MiB)" for gpu in facts.gpus],
        "nvidia_driver": facts.driver,
        "torch": facts.torch,
        "torch_cuda": facts.torch_cuda,
    }


def stack_id_of(python: str, torch_version: str, cuda: str | None, gpu: str | None) -> str:
    """One folder name for a stack, e.g. ``py3.12-torch2.11.0+cu130-cuda13.0-NVIDIA-H200``,
    or ``py3.11-torch2.13.0+cpu-nogpu`` without a GPU (``cuda`` and ``gpu`` are then None)."""
    parts = ["py" + ".".join(python.split(".")[:2]), f"torch{torch_version}"]
    parts += [f"cuda{cuda}", gpu] if gpu is not None else ["nogpu"]
    return "-".join(re.sub(r"[^A-Za-z0-9.+_-]+", "-", part).strip("-") for part in parts)


def stack_id() -> str:
    """This process's stack id (the GPU is the first visible one)."""
    from pytest_cudagraph import results

    facts = results.stack_facts()
    if not facts.gpus:
        return stack_id_of(facts.python, facts.torch, None, None)
    return stack_id_of(facts.python, facts.torch, facts.torch_cuda, facts.gpus[0].name)


def fill_stack_paths(options: dict[str, object], stack: Callable[[], str]) -> dict[str, object]:
    """The benchmark path options with ``{cudagraph_stack_id}`` replaced; only those that hold it.

    ``options`` holds pytest-benchmark's option values by dest (``benchmark_storage``,
    ``benchmark_compare``, ``benchmark_json``, ``benchmark_save``, ``benchmark_autosave``).
    The storage is filled only when the run saves or compares (otherwise it is never opened);
    ``stack`` is called only when something is filled. ValueError when a compare path names
    no existing file (saying how to record it), and when the JSON path holds the placeholder
    (a path on pytest-benchmark 5.3+, an already opened file before).
    """
    storage, compare, json_target = (
        options.get(name) for name in ("benchmark_storage", "benchmark_compare", "benchmark_json")
    )
    # pytest-benchmark before 5.3 hands over the opened file; its name is the path given.
    json_path = (
        json_target if isinstance(json_target, (str, Path)) else getattr(json_target, "name", None)
    )
    if json_path is not None and STACK_PLACEHOLDER in str(json_path):
        raise ValueError(
            f"--benchmark-json={json_path}: {STACK_PLACEHOLDER} is filled in only in "
            "--benchmark-storage and --benchmark-compare (pytest-benchmark before 5.3 opens "
            "the JSON file while parsing arguments); name the stack's folder yourself"
        )
    storage_used = bool(options.get("benchmark_save") or options.get("benchmark_autosave"))
    filled: dict[str, object] = {}
    if isinstance(compare, str) and STACK_PLACEHOLDER in compare:
        compare_file = Path(compare.replace(STACK_PLACEHOLDER, stack()))
        if not compare_file.is_file():
            raise ValueError(
                f"--benchmark-compare: no benchmark file {compare_file} for this stack. Record "
                f"one on this stack with `mkdir -p {compare_file.parent} && pytest "
                f"--benchmark-only --benchmark-json={compare_file}` and commit it"
            )
        filled["benchmark_compare"] = str(compare_file)
    if isinstance(storage, str) and STACK_PLACEHOLDER in storage and (storage_used or compare):
        filled["benchmark_storage"] = storage.replace(STACK_PLACEHOLDER, stack())
    return filled


class BenchmarkHooks:
    """Registered only when pytest-benchmark is active (its hook names are unknown otherwise),
    from the cudagraph plugin's pytest_configure: before pytest-benchmark's (trylast) opens
    its storage."""

    def __init__(self) -> None:
        self.stack: str | None = None

    # Requested by name, not looked up in the body: pytest-benchmark's --benchmark-only skips
    # every test whose arguments do not hold its ``benchmark``.
    @pytest.fixture
    def cuda_benchmark(self, benchmark: Any, cuda_timer: Callable[[], float]) -> object:
        """pytest-benchmark's ``benchmark`` whose timer synchronizes ``cuda_device``."""
        # pytest-benchmark's public timer= marker argument cannot see the test's device.
        benchmark._timer = cuda_timer
        return benchmark

    def stack_once(self) -> str:
        if self.stack is None:
            self.stack = stack_id()
        return self.stack

    def pytest_configure(self, config: pytest.Config) -> None:
        names = (
            "benchmark_storage",
            "benchmark_compare",
            "benchmark_json",
            "benchmark_save",
            "benchmark_autosave",
        )
        try:
            filled = fill_stack_paths(
                {name: config.getoption(name, None) for name in names}, self.stack_once
            )
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
        if filled and config.pluginmanager.has_plugin("pytest-benchmark"):
            # pytest-benchmark read its paths when its session started: changing them now
            # would be silently ignored.
            raise pytest.UsageError(
                f"{STACK_PLACEHOLDER} cannot be filled in: pytest-benchmark's session started "
                "before the cudagraph plugin's hooks were registered"
            )
        for name, value in filled.items():
            setattr(config.option, name, value)

    def pytest_report_header(self) -> list[str]:
        return [] if self.stack is None else [f"cudagraph: benchmarks of stack {self.stack}"]

    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, object]
    ) -> None:
        machine_info.update(gpu_machine_info())
        machine_info["cudagraph_stack_id"] = self.stack_once()
