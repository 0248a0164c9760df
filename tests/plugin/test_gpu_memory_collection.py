"""The memory probe's garbage collection on a real GPU: the reading at a block's end frees a
CUDA tensor held by a reference cycle the block made, still counts one held by a cycle that
was alive at the baseline, and judge() takes that reading again with a full collection.

Skips, with the reason, where CUDA or NVML is absent (the device_memory fixture's own skips);
tests/plugin/test_engine_memory_gc.py covers the same logic with a simulated device.
"""

from __future__ import annotations

import gc

import torch

from pytest_cudagraph.memory import DeviceMemoryProbe

MiB = 1024 * 1024
# Allocator rounding and driver bookkeeping around the tensors.
TOLERANCE = 32 * MiB


def cycle_holding(megabytes: int, device: torch.device) -> list[object]:
    cycle: list[object] = [torch.empty(megabytes * MiB, dtype=torch.uint8, device=device)]
    cycle.append(cycle)
    return cycle


def test_young_reading_frees_the_blocks_cycle_and_judge_retakes_the_baselines(
    device_memory: DeviceMemoryProbe, cuda_device: torch.device
) -> None:
    old = cycle_holding(256, cuda_device)
    with device_memory.measure() as measurement:
        assert gc.get_freeze_count() > 0
        cycle_holding(256, cuda_device)  # made and dropped in the block
        kept = torch.empty(128 * MiB, dtype=torch.uint8, device=cuda_device)
        del old
    young = measurement.report
    assert gc.get_freeze_count() == 0
    # Young: the block's cycle is freed; the old cycle, frozen at the baseline, is counted.
    assert not young.after.full_collection
    assert abs(young.growth - 128 * MiB) <= TOLERANCE, young.section()
    verdict = measurement.judge(bound_mib=64)
    exact = measurement.report
    assert exact.after.full_collection and exact.young_after == young.after
    assert abs(exact.growth + 128 * MiB) <= TOLERANCE, exact.section()
    assert verdict.passed, verdict.reason
    del kept
