"""What the benchmarks run on: the shapes, the default-config decoder and its steps (from
``reasyn_ref.workloads``, in the sampler's bucketed layout), and the in-run store the ratios are
computed from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from reasyn_ref import ARStep, Decoder, DecoderConfig, GraphKey
from reasyn_ref.workloads import random_step, seeded_decoder, target_memory

# (bucketed batch, bucketed sequence) of the AR forward; memory length 64 throughout.
FORWARD_KEYS = [(1, 64), (8, 64), (16, 128), (64, 128), (256, 512)]
MEMORY_LEN = 64
WARMUP_CALLS = 3

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: GPU benchmark (torch.cuda.is_available() is False)",
)


def key_id(key: tuple[int, int]) -> str:
    return f"{key[0]}x{key[1]}"


class BenchResults:
    """Figures of this session's benchmarks by label, e.g. ("ar_forward", "eager", (8, 64)):
    the median in seconds and any other figure a partner benchmark needs."""

    def __init__(self) -> None:
        self._figures: dict[tuple[Any, ...], dict[str, Any]] = {}

    def record(self, benchmark: Any, label: tuple[Any, ...], **figures: Any) -> float | None:
        """Store ``benchmark``'s median (seconds) and ``figures`` under ``label``; returns the
        median, or None when benchmarks are disabled (the function ran once, untimed)."""
        if benchmark.stats is None:
            return None
        median = benchmark.stats.stats.median
        self._figures[label] = {"median_s": median, **figures}
        return median

    def get(self, label: tuple[Any, ...], figure: str = "median_s") -> Any:
        """A figure stored under ``label`` in this session, None when it was not measured."""
        return self._figures.get(label, {}).get(figure)

    @staticmethod
    def ratio(info: dict[str, Any], name: str, numerator: Any, denominator: Any) -> None:
        """info[name] = numerator / denominator when both were measured in this run."""
        if numerator is not None and denominator:
            info[name] = numerator / denominator


def make_decoder(device: torch.device, seed: int = 0) -> Decoder:
    """The default (upstream-sized) decoder with random weights from ``seed``, in eval mode."""
    return seeded_decoder(DecoderConfig(), seed, device)


def make_memory(config: DecoderConfig, device: torch.device, seed: int) -> tuple[Tensor, Tensor]:
    """One target's memory [1, MEMORY_LEN, d_model] and its padding mask, the last 8 padded."""
    return target_memory(config, MEMORY_LEN, padded=8, seed=seed, device=device)


def forward_inputs(
    config: DecoderConfig, key: tuple[int, int], device: torch.device, seed: int = 0
) -> ARStep:
    """One AR step at ``key`` = (batch, seq) in the sampler's layout: ``batch`` real rows of
    random lengths, the longest in the ``seq`` bucket, one target's memory (length
    MEMORY_LEN, masked tail) expanded over them."""
    batch, seq = key
    graph_key = GraphKey(batch, seq, MEMORY_LEN, has_mask=True, shared_memory=batch > 1)
    return random_step(config, graph_key, seed=seed, device=device, rows=batch)


def warm_up(step: Callable[[], Any], calls: int = WARMUP_CALLS) -> None:
    """Run ``step`` a few times so that lazy initialisation stays out of the timings."""
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
