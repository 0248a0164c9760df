"""A workload for timing and profiling the reference: the default-config (upstream-sized)
decoder with random weights, and one autoregressive step's inputs in the sampler's bucketed
layout. Shared by the benchmarks (tests/bench) and scripts/replay_profile.py."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from reasyn_ref.config import DecoderConfig
from reasyn_ref.model import Decoder, expand_memory
from reasyn_ref.sampler import pad_rows

MEMORY_LEN = 64
WARMUP_CALLS = 3


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
