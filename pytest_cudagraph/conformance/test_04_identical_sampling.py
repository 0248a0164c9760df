"""Identical sampling: with the same seed, sampling with graphs off and with graphs on (the
target's environment toggle at 0 and at 1) draws identical tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pytest_cudagraph.conformance.support import needs_cuda, skip_without
from pytest_cudagraph.parity import ParityChecker
from pytest_cudagraph.target import CudaGraphTarget

SEEDS = (0, 1)


@needs_cuda
@pytest.mark.cuda_graph_parity
def test_identical_sampling(
    target: CudaGraphTarget, graph_parity: ParityChecker, record_figure: Callable[[str], None]
) -> None:
    skip_without(target, "sampler")
    drawn: list[object] = []

    def sample_every_seed() -> None:
        for seed in SEEDS:
            tokens = target.sampler(seed)
            graph_parity.record(f"seed {seed}", tokens)
            drawn.append(tokens)

    toggle = target.graphs_toggle
    try:
        # The toggle form of cuda_graph_parity, with the toggle the target names.
        graph_parity.run_toggled(sample_every_seed, toggle)
    finally:
        record_figure(
            f"{toggle}=0 vs =1, seeds {', '.join(map(str, SEEDS))}: "
            f"{_count_tokens(drawn[: len(SEEDS)])} tokens per side"
        )


def _count_tokens(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_count_tokens(item) for item in value)
    return 1
