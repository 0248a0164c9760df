"""Identical sampling: the target's sampler draws the same tokens with graphs off and on, seed
for seed (``sampler(seed, graphs)``)."""

from __future__ import annotations

import torch

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Sampling
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.parity import compare_outputs
from pytest_cudagraph.skips import needs_cuda

SEEDS = (0, 1)


@needs_cuda
def test_identical_sampling(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    sampler = needed(target, Sampling).sample
    off = {seed: sampler(seed, False) for seed in SEEDS}
    on = {seed: sampler(seed, True) for seed in SEEDS}
    record_figure(
        f"graphs off vs on, seeds {', '.join(map(str, SEEDS))}: "
        f"{_count_tokens(list(off.values()))} tokens per side"
    )
    mismatches = compare_outputs(off, on, path="seed", sides=("graphs off", "graphs on"))
    assert not mismatches, "sampled tokens differ:\n" + "\n".join(
        mismatch.describe() for mismatch in mismatches
    )


def _count_tokens(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_count_tokens(item) for item in value)
    return 1
