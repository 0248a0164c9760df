"""The memory probe's garbage collection on a real GPU: the reading at a block's end frees a
CUDA tensor held by a reference cycle the block made, still counts one held by a cycle that
was alive at the baseline, and judge() takes that reading again with a full collection; gc's
state (frozen objects, as on the H200 host's Python, enabled, thresholds) is left as it was.

Skips, with the reason, where CUDA or NVML is absent (the device_memory fixture's own skips);
tests/engines/test_memory_gc.py covers the same logic with a simulated device.
"""

from __future__ import annotations

import gc

import torch

from pytest_cudagraph.engines.memory import DeviceMemoryProbe
from pytest_cudagraph.engines.units import MiB

# Allocator rounding and driver bookkeeping around the tensors.
TOLERANCE = 32 * MiB


def cycle_holding(megabytes: int, device: torch.device) -> list[object]:
    cycle: list[object] = [torch.empty(megabytes * MiB, dtype=torch.uint8, device=device)]
    cycle.append(cycle)
    return cycle


def gc_state() -> tuple[int, bool, tuple[int, ...]]:
    return gc.get_freeze_count(), gc.isenabled(), gc.get_threshold()


def test_young_reading_frees_the_blocks_cycle_and_judge_retakes_the_baselines(
    device_memory: DeviceMemoryProbe, cuda_device: torch.device
) -> None:
    state = gc_state()
    old = cycle_holding(256, cuda_device)
    with device_memory.measure() as measurement:
        assert gc_state() == state
        cycle_holding(256, cuda_device)  # made and dropped in the block
        kept = torch.empty(128 * MiB, dtype=torch.uint8, device=cuda_device)
        del old
    young = measurement.report
    # Young: the block's cycle is freed; the old cycle, in the oldest generation since the
    # baseline's full collection, is still counted.
    assert not young.after.full_collection
    assert abs(young.growth - 128 * MiB) <= TOLERANCE, young.section()
    verdict = measurement.judge(bound_mib=64)
    exact = measurement.report
    assert exact.after.full_collection and exact.young_after == young.after
    assert abs(exact.growth + 128 * MiB) <= TOLERANCE, exact.section()
    assert verdict.passed, verdict.reason
    assert gc_state() == state
    del kept
