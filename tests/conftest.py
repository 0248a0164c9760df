"""Fixtures every test folder shares: no cudagraph settings from the outer environment, a
pytester whose runs use the CPU for the GPU-bound fixtures, and inner runs that pytest-benchmark
does not take for xdist workers; and the ``cuda`` marker on every test taking ``cuda_device``."""

from __future__ import annotations

import os

import pytest

# pytester's in-process runs drop, when they end, every module imported after pytester was set
# up, and torch cannot be imported twice in one process: have it imported before any of them.
import torch  # noqa: F401

# Written into a pytester directory: runs the CUDA-bound fixtures on the CPU, and replaces
# the NVML probe with one whose readings a test sets with @pytest.mark.fake_memory.
CPU_CONFTEST = """
import contextlib

import pytest
import torch

from pytest_cudagraph.engines.memory import MemoryMeasurement, MemoryReport, MemorySample
from pytest_cudagraph.engines.units import MiB



def pytest_configure(config):
    config.addinivalue_line("markers", "fake_memory(growth_mib, reserved_growth_mib=0)")


@pytest.fixture
def cuda_device():
    return torch.device("cpu")


class FakeProbe:
    def __init__(self, growth_mib, reserved_growth_mib=0):
        self.growth = int(growth_mib * MiB)
        self.reserved_growth = int(reserved_growth_mib * MiB)

    @contextlib.contextmanager
    def measure(self):
        measurement = MemoryMeasurement()
        yield measurement
        before = MemorySample(500 * MiB, 100 * MiB, 200 * MiB)
        after = MemorySample(
            500 * MiB + self.growth, 100 * MiB, 200 * MiB + self.reserved_growth
        )
        measurement.report = MemoryReport("cuda:0", before, after, after.process_bytes + 2 * MiB)


@pytest.fixture
def device_memory(request):
    marker = request.node.get_closest_marker("fake_memory")
    return FakeProbe(*marker.args, **marker.kwargs)
"""


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test taking the plugin's ``cuda_device`` skips without CUDA, so it carries the ``cuda``
    marker as ``needs_cuda`` gives it (the README's quick start cannot say so itself)."""
    for item in items:
        if "cuda_device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(autouse=True)
def _no_outer_cudagraph_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings from the outer environment (tox passes PYTEST_*) must not leak into runs."""
    for name in list(os.environ):
        if name.startswith("PYTEST_CUDAGRAPH_"):
            monkeypatch.delenv(name)


@pytest.fixture
def cpu_pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester whose runs use the CPU for ``cuda_device`` and a scripted memory probe."""
    pytester.makeconftest(CPU_CONFTEST)
    return pytester


@pytest.fixture
def outside_xdist(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `pytest -n` an inner run must not take itself for an xdist worker: pytest-benchmark
    turns itself off there (and then refuses --benchmark-only)."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
