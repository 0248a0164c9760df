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

from pytest_cudagraph.conformance._catalog import check, declared
from pytest_cudagraph.conformance._judging import called, case_of, draw, graphed_path, numbered
from pytest_cudagraph.conformance._progress import CheckProgress
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.memory import DeviceMemoryProbe
from pytest_cudagraph.engines.units import MiB

SHAPES = 24  # eight times the reference cache's capacity: every graph is evicted many times over
# The long run: keys enough to cycle four times the reference cache's capacity through it.
LONG_RUN_KEYS = 12
WARM_ROUNDS = 3
JUDGED_ROUNDS = 2
RESET_BOUND_MIB = 512
# Allocator rounding and driver bookkeeping on top of the graphs themselves.
SLACK_MIB = 256


@check(
    "bounded memory",
    needs=("cache.reset", "cache.capacity", "cache.largest_key"),
    runs_on="gpu",
    breaks_target=True,
)
@pytest.mark.graph_memory_bound(RESET_BOUND_MIB)
def test_bounded_memory(
    target: CudaGraphTarget,
    cache: Cache,
    device_memory: DeviceMemoryProbe,
    conclude: Conclude,
    progress: CheckProgress,
) -> None:
    capacity, reset = declared(cache.capacity), declared(cache.reset)
    largest_inputs = draw(target, case_of(target, cache.largest_key), seed=0)
    cold = device_memory.sample().process_bytes
    graphed_path(target)(largest_inputs)
    called("Cache.reset", reset)
    target.eager(largest_inputs)
    start = device_memory.sample().process_bytes
    first_use = start - cold

    def growth_within(limit: int) -> int:
        """Growth since the baseline; exact wherever it is over ``limit``."""
        return device_memory.sample_within(start + limit).process_bytes - start

    graphed_path(target)(largest_inputs)
    largest = device_memory.sample().process_bytes - start
    called("Cache.reset", reset)
    # A cache may build a new graph before it evicts the oldest: capacity + 1 at once.
    bound = (capacity + 1) * largest + SLACK_MIB * MiB
    peak = 0
    for number in range(SHAPES):
        case = numbered(target, number)
        progress(f"shape {number + 1} of {SHAPES}, key {case.key!r}")
        graphed_path(target)(draw(target, case, seed=number))
        peak = max(peak, growth_within(bound))
    called("Cache.reset", reset)
    after_reset = growth_within(SLACK_MIB * MiB)
    figure = (
        f"{SHAPES} calls over {min(SHAPES, len(target.keys))} keys, capacity {capacity}: peak +{peak / MiB:.0f} MiB of bound "
        f"{bound / MiB:.0f} MiB (largest graph {largest / MiB:.0f} MiB); "
        f"after reset {after_reset / MiB:+.0f} MiB; first use {first_use / MiB:+.0f} MiB "
        "(warm-up, not judged)"
    )
    problems = []
    if peak > bound:
        problems.append(
            f"memory grew to +{peak / MiB:.0f} MiB over {SHAPES} calls, past the bound of "
            f"{bound / MiB:.0f} MiB ((capacity {capacity} + 1) x the largest graph's "
            f"{largest / MiB:.0f} MiB + {SLACK_MIB} MiB): the cache does not stay bounded"
        )
    if after_reset > SLACK_MIB * MiB:
        problems.append(
            f"after reset() the process still holds +{after_reset / MiB:.0f} MiB more than after "
            f"the warm-up (allowed: {SLACK_MIB} MiB): the cache keeps memory per graph it built "
            "(graphs or pools not released, a new stream and its cuBLAS workspace per graph?)"
        )
    values = {
        "peak_mib": peak / MiB,
        "bound_mib": bound / MiB,
        "largest_graph_mib": largest / MiB,
        "after_reset_mib": after_reset / MiB,
        "first_use_mib": first_use / MiB,
    }
    conclude(Judgement(problems, figure, SHAPES, "calls measured", values), "memory unbounded:")


@check(
    "memory over a long run", sharper_with=("cache.capacity",), runs_on="gpu", breaks_target=True
)
def test_memory_over_a_long_run(
    target: CudaGraphTarget,
    cache: Cache | None,
    device_memory: DeviceMemoryProbe,
    capture_counter: CaptureCounter,
    conclude: Conclude,
) -> None:
    keys = list(target.keys[:LONG_RUN_KEYS])
    key_count = len(keys)

    def one_round(repeat: int) -> None:
        for key in keys:
            case = case_of(target, key, repeat)
            graphed_path(target)(draw(target, case, seed=case.number))

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
    capacity = cache.capacity if cache is not None else None
    figure = (
        f"{JUDGED_ROUNDS} rounds over {key_count} keys after {WARM_ROUNDS} warm-up rounds "
        f"(+{(start - cold) / MiB:.0f} MiB, not judged): peak {peak / MiB:+.0f} MiB of "
        f"{SLACK_MIB} MiB; {per_round:g} captures per round"
    )
    figure += f", capacity {capacity}" if capacity is not None else ""
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
    calls = JUDGED_ROUNDS * key_count
    conclude(Judgement(problems, figure, calls, "calls measured"), "over a long run:")
