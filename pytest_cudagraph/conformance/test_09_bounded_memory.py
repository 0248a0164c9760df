"""Bounded memory: 24 calls over the target's keys (cases 0..23) keep this process's device
memory (NVML) within a bound derived from the largest graph, and a reset gives back what they
took. First-use costs (cuBLAS workspaces, lazily loaded kernels, eager's first call) are paid
by a warm-up before the baseline (one graphed call of the largest key, a reset, one eager call)
and reported, not judged, so what ran before this check does not change its verdict. The
baseline and the largest graph's growth are exact readings (a full garbage collection); the
readings over the shapes collect gc's young generations only, which can only read high, and
one over its limit is taken again in full. The graph_memory_bound marker also bounds the whole
body to 512 MiB after the reset.

Memory over a long run, with or without a reset: warm-up rounds over up to 12 keys, then more
rounds of the same keys must not grow the process's memory past the slack, and, where the keys
outnumber ``capacity``, must capture again as a cache of that capacity has to (counted by
CaptureCounter): one that recaptures less keeps more graphs than it says.
"""

from __future__ import annotations

import pytest

from pytest_cudagraph.conformance.catalog import given, needed
from pytest_cudagraph.conformance.judging import (
    case_in_key,
    draw,
    graphed_path,
)
from pytest_cudagraph.conformance.progress import CheckProgress
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.memory import DeviceMemoryProbe
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.skips import needs_cuda

SHAPES = 24  # eight times the reference cache's capacity: every graph is evicted many times over
# The long run: keys enough to cycle four times the reference cache's capacity through it.
LONG_RUN_KEYS = 12
WARM_ROUNDS = 3
JUDGED_ROUNDS = 2
RESET_BOUND_MIB = 512
# Allocator rounding and driver bookkeeping on top of the graphs themselves.
SLACK_MIB = 256


@needs_cuda
@pytest.mark.graph_memory_bound(RESET_BOUND_MIB)
def test_bounded_memory(
    target: CudaGraphTarget,
    device_memory: DeviceMemoryProbe,
    record_figure: FigureRecorder,
    progress: CheckProgress,
) -> None:
    cache = needed(target, Cache, "reset", "capacity", "largest_key")
    capacity, reset = cache.capacity, cache.reset
    assert capacity is not None and reset is not None
    largest_inputs = draw(target, list(target.keys).index(cache.largest_key), seed=0)
    cold = device_memory.sample().process_bytes
    graphed_path(target)(largest_inputs)
    reset()
    target.eager(largest_inputs)
    start = device_memory.sample().process_bytes
    first_use = start - cold

    def growth_within(limit: int) -> int:
        """Growth since the baseline; exact wherever it is over ``limit``."""
        return device_memory.sample_within(start + limit).process_bytes - start

    graphed_path(target)(largest_inputs)
    largest = device_memory.sample().process_bytes - start
    reset()
    # A cache may build a new graph before it evicts the oldest: capacity + 1 at once.
    bound = (capacity + 1) * largest + SLACK_MIB * MiB
    peak = 0
    for case in range(SHAPES):
        inputs = draw(target, case, seed=case)
        progress(f"shape {case + 1} of {SHAPES}, key {target.key_of(inputs)!r}")
        graphed_path(target)(inputs)
        peak = max(peak, growth_within(bound))
    reset()
    after_reset = growth_within(SLACK_MIB * MiB)
    record_figure(
        f"{SHAPES} calls over {min(SHAPES, target.num_keys)} keys, capacity {capacity}: peak +{peak / MiB:.0f} MiB of bound "
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
        f"memory grew to +{peak / MiB:.0f} MiB over {SHAPES} calls, past the bound of "
        f"{bound / MiB:.0f} MiB ((capacity {capacity} + 1) x the largest graph's "
        f"{largest / MiB:.0f} MiB + {SLACK_MIB} MiB): the cache does not stay bounded"
    )
    assert after_reset <= SLACK_MIB * MiB, (
        f"after reset() the process still holds +{after_reset / MiB:.0f} MiB more than after "
        f"the warm-up (allowed: {SLACK_MIB} MiB): the cache keeps memory per graph it built "
        "(graphs or pools not released, a new stream and its cuBLAS workspace per graph?)"
    )


@needs_cuda
def test_memory_over_a_long_run(
    target: CudaGraphTarget,
    device_memory: DeviceMemoryProbe,
    capture_counter: CaptureCounter,
    record_figure: FigureRecorder,
) -> None:
    key_count = min(LONG_RUN_KEYS, target.num_keys)

    def one_round(repeat: int) -> None:
        for key_index in range(key_count):
            case = case_in_key(target, key_index, repeat)
            graphed_path(target)(draw(target, case, seed=case))

    cold = device_memory.sample().process_bytes
    for repeat in range(WARM_ROUNDS):
        one_round(repeat)
    start = device_memory.sample().process_bytes
    peak = 0
    with capture_counter:
        for repeat in range(WARM_ROUNDS, WARM_ROUNDS + JUDGED_ROUNDS):
            one_round(repeat)
            peak = max(
                peak, device_memory.sample_within(start + SLACK_MIB * MiB).process_bytes - start
            )
    per_round = len(capture_counter.captures) / JUDGED_ROUNDS
    capacity = given(target, Cache, "capacity")
    figure = (
        f"{JUDGED_ROUNDS} rounds over {key_count} keys after {WARM_ROUNDS} warm-up rounds "
        f"(+{(start - cold) / MiB:.0f} MiB, not judged): peak {peak / MiB:+.0f} MiB of "
        f"{SLACK_MIB} MiB; {per_round:g} captures per round"
    )
    record_figure(figure + (f", capacity {capacity}" if capacity is not None else ""))
    problems = []
    if peak > SLACK_MIB * MiB:
        problems.append(
            f"memory grew by {peak / MiB:.0f} MiB over {JUDGED_ROUNDS} more rounds of the same "
            f"{key_count} keys (allowed: {SLACK_MIB} MiB): memory kept per call or per capture"
        )
    if capacity is not None and key_count > capacity and per_round < key_count - capacity:
        problems.append(
            f"cycling {key_count} keys through a cache of capacity {capacity} captured "
            f"{per_round:g} graphs per round, fewer than the {key_count - capacity} a cache of "
            "that capacity must: it keeps more graphs than it says"
        )
    assert not problems, "\n".join(problems)
