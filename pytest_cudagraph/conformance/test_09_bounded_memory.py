"""Bounded memory: 24 distinct shapes through the cache keep this process's device memory
(NVML) within a bound derived from the largest graph, and a reset gives back what they took.

First-use costs (cuBLAS workspaces for each stream used, lazily loaded kernels, the eager
model's first call) are paid by a warm-up before the baseline: one graphed call of the largest
case, a reset, and one eager call. They are reported, not judged, so whatever ran before this
check does not change its verdict. The baseline and the largest graph's growth, from which
the bound is derived, are exact readings (a full garbage collection); the readings over the
shapes collect gc's young generations only, which can only read high, and one over its limit
is taken again in full, so every verdict is what full readings would give. The
graph_memory_bound marker also bounds the whole body, warm-up included, to 512 MiB after the
reset.
"""

from __future__ import annotations

import pytest

from pytest_cudagraph.conformance.progress import check_progress
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.support import draw, skip_without
from pytest_cudagraph.conformance.target import CudaGraphTarget
from pytest_cudagraph.engines.memory import DeviceMemoryProbe
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.skips import needs_cuda

SHAPES = 24  # eight times the reference cache's capacity: every graph is evicted many times over
RESET_BOUND_MIB = 512
# Allocator rounding and driver bookkeeping on top of the graphs themselves.
SLACK_MIB = 256


@needs_cuda
@pytest.mark.graph_memory_bound(RESET_BOUND_MIB)
def test_bounded_memory(
    target: CudaGraphTarget,
    device_memory: DeviceMemoryProbe,
    record_figure: FigureRecorder,
    request: pytest.FixtureRequest,
) -> None:
    progress = check_progress(request)
    skip_without(target, "capacity", "largest_case", "reset")
    if target.num_keys < SHAPES:
        pytest.skip(f"target.num_keys is {target.num_keys}; this check needs {SHAPES} keys")
    largest_inputs = draw(target, target.largest_case, seed=0)
    cold = device_memory.sample().process_bytes
    target.graphed(largest_inputs)
    target.reset()
    target.eager(largest_inputs)
    start = device_memory.sample().process_bytes
    first_use = start - cold

    def growth_within(limit: int) -> int:
        """Growth since the baseline; exact wherever it is over ``limit``."""
        return device_memory.sample_within(start + limit).process_bytes - start

    target.graphed(largest_inputs)
    largest = device_memory.sample().process_bytes - start
    target.reset()
    # A cache may build a new graph before it evicts the oldest: capacity + 1 at once.
    bound = (target.capacity + 1) * largest + SLACK_MIB * MiB
    peak = 0
    for case in range(SHAPES):
        inputs = draw(target, case, seed=case)
        progress(f"shape {case + 1} of {SHAPES}, key {target.key_of(inputs)!r}")
        target.graphed(inputs)
        peak = max(peak, growth_within(bound))
    target.reset()
    after_reset = growth_within(SLACK_MIB * MiB)
    record_figure(
        f"{SHAPES} shapes, capacity {target.capacity}: peak +{peak / MiB:.0f} MiB of bound "
        f"{bound / MiB:.0f} MiB (largest graph {largest / MiB:.0f} MiB); "
        f"after reset {after_reset / MiB:+.0f} MiB; first use {first_use / MiB:+.0f} MiB "
        "(warm-up, not judged)",
        peak_mib=peak / MiB,
        bound_mib=bound / MiB,
        largest_graph_mib=largest / MiB,
        after_reset_mib=after_reset / MiB,
        first_use_mib=first_use / MiB,
    )
    assert peak <= bound, (
        f"memory grew to +{peak / MiB:.0f} MiB over {SHAPES} shapes, past the bound of "
        f"{bound / MiB:.0f} MiB ((capacity {target.capacity} + 1) x the largest graph's "
        f"{largest / MiB:.0f} MiB + {SLACK_MIB} MiB): the cache does not stay bounded"
    )
    assert after_reset <= SLACK_MIB * MiB, (
        f"after reset() the process still holds +{after_reset / MiB:.0f} MiB more than after "
        f"the warm-up (allowed: {SLACK_MIB} MiB): the cache keeps memory per graph it built "
        "(graphs or pools not released, a new stream and its cuBLAS workspace per graph?)"
    )
