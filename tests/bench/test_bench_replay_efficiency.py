"""Replay efficiency: how close a graph-cache call comes to the time of its kernels alone, for
the exact and the lean step's graphs.

The benchmark times ``REPLAYS`` back-to-back cache calls per round (staging, replay, fp32 copy;
no sync between them, as a caller that keeps the GPU fed), between device synchronizations:
enough calls that the round's start (the device idles through the first call's host work) and
its closing synchronization are a small share of each call.
A separate pass of the same calls under the profiler sums the device time of every kernel and
copy they ran. Efficiency = device time per call / wall time per call; what it misses is launch
latency and idle time between kernels.
"""

from __future__ import annotations

from functools import partial

import pytest
from bench_workloads import (
    FORWARD_KEYS,
    STEP_KINDS,
    forward_inputs,
    key_id,
    warm_up,
)
from device_profile import profile_device_ops, summarize

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref.graph_cache import GraphCache

pytestmark = needs_cuda

REPLAYS = 50
ROUNDS = 3


@pytest.mark.parametrize("step_kind", STEP_KINDS)
@pytest.mark.parametrize("key", FORWARD_KEYS, ids=key_id)
def test_replay_efficiency(key, step_kind, default_decoder, cuda_device, cuda_benchmark):
    ar_step = forward_inputs(default_decoder.config, key, cuda_device)
    cache = GraphCache(default_decoder, cuda_device, lean=step_kind == "lean")
    step = partial(cache, ar_step)
    warm_up(step)  # the first call captures
    cuda_benchmark.pedantic(step, rounds=ROUNDS, iterations=REPLAYS)
    device = summarize(profile_device_ops(step, REPLAYS), REPLAYS)
    device_ms = device.device_us_per_call / 1e3
    info = cuda_benchmark.extra_info
    info.update(
        bench="replay_efficiency",
        key=list(key),
        step=step_kind,
        replays=REPLAYS,
        device_ms=device_ms,
        device_ops_per_call=round(device.ops_per_call),
    )
    if cuda_benchmark.stats is not None:
        wall_ms = cuda_benchmark.stats.stats.median * 1e3  # per call: stats divide by REPLAYS
        info.update(wall_ms=wall_ms, efficiency=device_ms / wall_ms)
    cache.clear()
