"""What the benchmarks run on: the shapes, the default-config decoder and its inputs in the
sampler's bucketed layout, and the in-run store the ratios are computed from."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from reasyn_ref import Decoder, DecoderConfig, expand_memory
from reasyn_ref.sampler import pad_rows

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
    torch.manual_seed(seed)
    with torch.device(device):
        decoder = Decoder(DecoderConfig())
    return decoder.eval()


def make_memory(config: DecoderConfig, device: torch.device, seed: int) -> tuple[Tensor, Tensor]:
    """One target's memory [1, MEMORY_LEN, d_model] and its padding mask, the last 8 padded."""
    generator = torch.Generator(device).manual_seed(seed)
    memory = torch.randn(1, MEMORY_LEN, config.d_model, device=device, generator=generator)
    mask = torch.zeros(1, MEMORY_LEN, dtype=torch.bool, device=device)
    mask[:, -8:] = True
    return memory, mask


def forward_inputs(
    config: DecoderConfig, key: tuple[int, int], device: torch.device, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(tokens, memory, mask, gather) of one AR step at ``key``, in the sampler's layout:
    ``batch`` rows of random lengths, the longest in the ``seq`` bucket, memory expanded."""
    batch, seq = key
    rng = random.Random(seed)
    lengths = [seq] + [rng.randint(1, seq) for _ in range(batch - 1)]
    # Ids from 3 on: no pad, start or end token inside a row.
    rows = [
        [config.start_token, *rng.choices(range(3, config.vocab_size), k=n - 1)] for n in lengths
    ]
    tokens, gather = pad_rows(rows, config, bucket=True)
    if tuple(tokens.shape) != key:
        raise AssertionError(f"rows laid out as {tuple(tokens.shape)}, not the key {key}")
    memory, mask = expand_memory(*make_memory(config, device, seed), batch)
    return tokens.to(device), memory, mask, gather.to(device)


def warm_up(step: Callable[[], Any], calls: int = WARMUP_CALLS) -> None:
    """Run ``step`` a few times so that lazy initialisation stays out of the timings."""
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
