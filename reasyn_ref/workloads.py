"""Reproducible workloads for tests, benchmarks and examples: a seeded decoder, one target's
memory with padding, random prefixes, and a random AR step at a graph key in the sampler's
layout. Everything is drawn from a CPU generator seeded by the caller and then moved, so a
seed gives the same values on every device and from any thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .bucketing import bucket_batch, bucket_seq
from .checks import check_int
from .config import DecoderConfig
from .model import Decoder, seeded_decoder, seeded_encoder
from .sampler import pad_rows
from .step import ARStep, GraphKey

__all__ = [
    "MEMORY_LEN",
    "forward_inputs",
    "make_decoder",
    "make_memory",
    "random_prefixes",
    "random_step",
    "seeded_decoder",
    "seeded_encoder",
    "target_memory",
    "warm_up",
]

# The benchmarks' and profiler's memory length, and their warm-up calls before timing.
MEMORY_LEN = 64
WARMUP_CALLS = 3


def target_memory(
    config: DecoderConfig,
    length: int,
    *,
    padded: int = 0,
    seed: int,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """One target's random memory [1, length, d_model] (standard normal, fp32) and its padding
    mask [1, length] with the last ``padded`` positions masked (at least one stays real)."""
    check_int("length", length, minimum=1)
    check_int("padded", padded, minimum=0, maximum=length - 1, label="length - 1")
    check_int("seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)
    memory = torch.randn(1, length, config.d_model, generator=generator)
    mask = torch.zeros(1, length, dtype=torch.bool)
    mask[:, length - padded :] = True
    return memory.to(device), mask.to(device)


def random_prefixes(
    config: DecoderConfig, lengths: Sequence[int], generator: torch.Generator
) -> list[list[int]]:
    """One prefix per length: the start token, then ids drawn from the vocabulary without the
    pad, start and end tokens (so no row ends or pads early)."""
    special = {config.pad_token, config.start_token, config.end_token}
    ordinary = torch.tensor([i for i in range(config.vocab_size) if i not in special])
    prefixes = []
    for n in lengths:
        check_int("prefix length", n, minimum=1)
        picks = torch.randint(len(ordinary), (n - 1,), generator=generator)
        prefixes.append([config.start_token, *ordinary[picks].tolist()])
    return prefixes


def random_step(
    config: DecoderConfig,
    key: GraphKey,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    rows: int | None = None,
) -> ARStep:
    """A step at ``key`` (a bucketed key) laid out by the sampler's own ``pad_rows``: ``rows``
    real rows (default: a random count that still buckets to ``key.batch``) of random lengths,
    the longest in the ``key.seq`` bucket; random memory with a random padded tail (at least
    one real position), one target's expanded over the batch when ``key.shared_memory``, else
    one per row; no mask when ``key.has_mask`` is False."""
    if not isinstance(key, GraphKey):
        raise TypeError(f"key must be a GraphKey, got {type(key).__name__}")
    batch, seq, memory_len = key.batch, key.seq, key.memory_len
    if bucket_batch(batch) != batch or bucket_seq(seq, config.max_len) != seq:
        raise ValueError(f"key {key} is not bucketed (see bucket_batch, bucket_seq)")
    if key.shared_memory and batch == 1:
        raise ValueError(f"key {key}: a shared memory needs batch > 1")
    check_int("key.memory_len", memory_len, minimum=1)
    check_int("seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (), generator=generator))

    fewest = batch // 2 + 1  # the fewest rows that bucket to ``batch``
    if rows is None:
        rows = draw(fewest, batch + 1)
    else:
        check_int("rows", rows, minimum=fewest, maximum=batch, label="batch")
    longest = draw(max(seq - 63, 1), seq + 1)
    lengths = [draw(1, longest + 1) for _ in range(rows)]
    lengths[draw(0, rows)] = longest
    tokens, gather = pad_rows(random_prefixes(config, lengths, generator), config, bucket=True)
    targets = 1 if key.shared_memory else batch
    memory = torch.randn(targets, memory_len, config.d_model, generator=generator)
    padding = torch.zeros(targets, memory_len, dtype=torch.bool)
    for target in range(targets):
        padding[target, memory_len - draw(0, memory_len) :] = True
    step = ARStep(
        tokens,
        memory.expand(batch, -1, -1),
        padding.expand(batch, -1) if key.has_mask else None,
        gather,
        rows,
    )
    return step.to(device)


def make_decoder(device: torch.device, seed: int = 0) -> Decoder:
    """The default (upstream-sized) decoder with random weights from ``seed``, in eval mode."""
    return seeded_decoder(DecoderConfig(), seed, device)


def make_memory(config: DecoderConfig, device: torch.device, seed: int) -> tuple[Tensor, Tensor]:
    """One target's memory [1, MEMORY_LEN, d_model] and its padding mask, the last 8 padded."""
    return target_memory(config, MEMORY_LEN, padded=8, seed=seed, device=device)


def forward_inputs(
    config: DecoderConfig, key: tuple[int, int], device: torch.device, seed: int = 0
) -> ARStep:
    """One AR step at ``key`` = (batch, seq) in the sampler's layout, as the benchmarks and the
    profiler time it: ``batch`` real rows of random lengths, the longest in the ``seq`` bucket,
    one target's memory (length MEMORY_LEN, masked tail) expanded over them."""
    batch, seq = key
    graph_key = GraphKey(batch, seq, MEMORY_LEN, has_mask=True, shared_memory=batch > 1)
    return random_step(config, graph_key, seed=seed, device=device, rows=batch)


def warm_up(step: Callable[[], Any], calls: int = WARMUP_CALLS) -> None:
    """Run ``step`` a few times so that lazy initialisation stays out of the timings."""
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
