"""graph_memory_bound judges a young reading over the bound only after taking it again with a
full collection, and its report section says which collection the judged reading had."""

from __future__ import annotations

import pytest

RETAKE_CONFTEST = """
import pytest
import torch

from pytest_cudagraph.engines.memory import DeviceMemoryProbe
from pytest_cudagraph.engines.units import MiB



@pytest.fixture
def cuda_device():
    return torch.device("cpu")


class OldCycleProbe(DeviceMemoryProbe):
    '''The real probe's readings on a simulated device, where memory held by a dead cycle of
    objects alive at the baseline comes back with a full collection only.'''

    def __init__(self):
        self.device = "cuda:0"
        self._interval_s = 0.001
        self.used = 600 * MiB
        self.dead_old_cycle = 0

    def settle(self, *, full_collection=True):
        if full_collection:
            self.used -= self.dead_old_cycle
            self.dead_old_cycle = 0

    def process_bytes(self):
        return self.used

    def allocator_bytes(self):
        return 0, 0

    def body(self, grows_mib, drops_old_cycle_mib):
        self.used += grows_mib * MiB
        self.dead_old_cycle += drops_old_cycle_mib * MiB


@pytest.fixture
def device_memory():
    return OldCycleProbe()
"""


def test_the_marker_judges_an_over_bound_young_reading_on_its_full_retake(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(RETAKE_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.graph_memory_bound(64)
        def test_within(device_memory):
            device_memory.body(grows_mib=40, drops_old_cycle_mib=100)

        @pytest.mark.graph_memory_bound(64)
        def test_within_once_retaken(device_memory):
            device_memory.body(grows_mib=100, drops_old_cycle_mib=100)

        @pytest.mark.graph_memory_bound(64)
        def test_over(device_memory):
            device_memory.body(grows_mib=100, drops_old_cycle_mib=0)
        """
    )
    result = pytester.runpytest_inprocess("-rP")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_over _*",
            "graph_memory_bound: this process's memory on cuda:0 grew by 100.0 MiB, over the 64 "
            "MiB bound *",
            "*- cudagraph memory -*",
            "after: taken again with a full garbage collection, as collecting the block's "
            "garbage only read 700.0 MiB, over the bound",
            "*_ test_within _*",
            "*- cudagraph memory -*",
            "NVML, this process         600.0     640.0     +40.0",
            "after: garbage collected among the block's objects only, so the figure may be above "
            "a full collection's, never below",
            "*_ test_within_once_retaken _*",
            "*- cudagraph memory -*",
            "NVML, this process         600.0     600.0      +0.0",
            "after: taken again with a full garbage collection, as collecting the block's "
            "garbage only read 700.0 MiB, over the bound",
        ]
    )
