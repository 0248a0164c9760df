"""The device side of repeated calls (a graph replay, say), from torch.profiler: each kernel
and copy, and their sums per call. Used by the replay-efficiency benchmark and
scripts/replay_profile.py; not imported by the plugin."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


class DeviceOp(NamedTuple):
    """One kernel or copy as the profiler saw it; times in microseconds."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class KernelRow:
    name: str
    per_call: float
    mean_us: float
    idle_before_us_per_call: float


@dataclass(frozen=True)
class Profile:
    ops_per_call: float
    device_us_per_call: float
    span_us_per_call: float
    rows: list[KernelRow]

    @property
    def efficiency(self) -> float:
        """Device time over span: how busy the device was from the first op to the last."""
        return self.device_us_per_call / self.span_us_per_call


def profile_device_ops(step: Callable[[], Any], calls: int) -> list[DeviceOp]:
    """The kernels and copies that ``calls`` back-to-back calls of ``step`` ran on the device."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    ops = [
        DeviceOp(event.name, event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == DeviceType.CUDA
    ]
    if not ops:
        raise AssertionError("the profiler saw no device activity in the calls (CUPTI off?)")
    return ops


def summarize(ops: list[DeviceOp], calls: int) -> Profile:
    """Per-call figures of ``ops`` (any order), made by ``calls`` calls. The idle time before an
    op is the time since the latest end of any op before it; overlapping ops have none."""
    if not ops:
        raise ValueError("no device operations to summarize (was CUPTI available?)")
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    ops = sorted(ops, key=lambda op: op.start_us)
    count: dict[str, int] = defaultdict(int)
    busy: dict[str, float] = defaultdict(float)
    idle: dict[str, float] = defaultdict(float)
    latest_end = ops[0].start_us
    for op in ops:
        count[op.name] += 1
        busy[op.name] += op.end_us - op.start_us
        idle[op.name] += max(0.0, op.start_us - latest_end)
        latest_end = max(latest_end, op.end_us)
    rows = [
        KernelRow(name, count[name] / calls, busy[name] / count[name], idle[name] / calls)
        for name in count
    ]
    rows.sort(key=lambda row: (-row.idle_before_us_per_call, -row.per_call * row.mean_us))
    return Profile(
        ops_per_call=len(ops) / calls,
        device_us_per_call=sum(busy.values()) / calls,
        span_us_per_call=(latest_end - ops[0].start_us) / calls,
        rows=rows,
    )
