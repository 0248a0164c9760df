"""graph_memory_bound's warning: torch's live tensors grew past the bound in memory the
allocator already held, while the process (NVML, which decides) stayed within it."""

from __future__ import annotations

import json

import pytest

WARNING_CONFTEST = """
import contextlib

import pytest
import torch

from pytest_cudagraph.engines.memory import MemoryMeasurement, MemoryReport, MemorySample
from pytest_cudagraph.engines.units import MiB



@pytest.fixture
def cuda_device():
    return torch.device("cpu")


class AllocatorGrowthProbe:
    @contextlib.contextmanager
    def measure(self):
        measurement = MemoryMeasurement()
        yield measurement
        before = MemorySample(500 * MiB, 100 * MiB, 300 * MiB)
        after = MemorySample(502 * MiB, 180 * MiB, 300 * MiB)  # +80 MiB live, +2 MiB process
        measurement.report = MemoryReport("cuda:0", before, after, after.process_bytes)


@pytest.fixture
def device_memory():
    return AllocatorGrowthProbe()
"""


def test_allocator_only_growth_passes_with_a_warning_in_section_summary_and_json(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(WARNING_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.graph_memory_bound(64)
        def test_reuses_reserved_memory():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-rP", "--cudagraph-json", "results.json")
    result.assert_outcomes(passed=1)
    warning = (
        "graph_memory_bound: torch's live tensors on cuda:0 grew by 80.0 MiB, over the 64 MiB "
        "bound, in memory the allocator already held; the process grew only by 2.0 MiB"
    )
    result.stdout.fnmatch_lines(
        [
            "*warnings summary*",
            f"*PytestWarning: {warning}",
            "*- cudagraph memory -*",
            f"warning: {warning}",
            "*= cudagraph =*",
            "  test_*.py::test_reuses_reserved_memory on cuda:0: +2.0 MiB of 64 MiB bound ok;*",
            f"    warning: {warning}",
        ]
    )
    memory = json.loads((pytester.path / "results.json").read_text())["memory"]
    assert [entry["warning"] for entry in memory] == [warning]


def test_no_warning_where_live_tensors_stay_within_the_bound(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.fake_memory(growth_mib=3)
        @pytest.mark.graph_memory_bound(32)
        def test_small():
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1)
    assert "warning:" not in result.stdout.str()
    assert "PytestWarning" not in result.stdout.str()
