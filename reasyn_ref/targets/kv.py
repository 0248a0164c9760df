"""The stateful conformance target ``reasyn-kv``: the KV decoder, its step graphed per
``StepKey`` (``StepGraphCache``), against the same steps run eagerly (``EagerSteps``).

A call is an episode, so that the state the graphs keep is built from inputs like any other: one
target's memory and padding mask, the right-padded prefixes and each row's length, and the token
fed to each row at each of ``STEPS`` steps (row b's step t sits at position lengths[b] + t). Its
output is every step's logits and the KV cache the episode leaves (the positions it wrote; zeros
beyond), so parity, no-baked-inputs and owned-outputs judge the state too. A StepGraphCache keeps
each key's buffers from one target to the next: the target is stateful (``reset_state``).

On CUDA: the default (upstream) config, random weights from a fixed seed, bf16 autocast on the
bf16 weight copy, as ``KVSampler`` runs it. Without CUDA: the tiny config on the CPU and
no graphs, for the checks that need no GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from pytest_cudagraph.conformance import CaptureClean, CudaGraphTarget, Inputs, State

from ..bucketing import bucket_seq
from ..config import DecoderConfig
from ..kv_decoder import EagerSteps, KVDecoder, StepKey, claimed
from ..kv_graphs import StepGraphCache
from ..kv_sampler import KVSampler
from ..model import seeded_decoder, step_context, with_bf16_matmul_weights
from .reference import (
    MODEL_SEED,
    SAMPLE_MAX_LEN,
    TARGET_SEED,
    SeededTarget,
    sample_prefixes,
    sample_target,
)

# Case c lands in key number c % 40: batch BATCHES[k % 5], cache CACHE_LENS[k // 5 % 4], memory
# MEMORY_LENS[k // 20], so neighbouring cases differ in batch and cases 0..39 are 40 keys.
BATCHES = (1, 2, 4, 8, 16)
CACHE_LENS = (64, 128, 192, 256)
MEMORY_LENS = (64, 128)
NUM_KEYS = len(BATCHES) * len(CACHE_LENS) * len(MEMORY_LENS)
LARGEST_CASE = NUM_KEYS - 1  # batch 16, cache 256, memory 128
# Steps per episode. Prefixes are cache_len - STEPS long, so a full-length row's last step
# writes the cache's last position.
STEPS = 8


def key_for_case(case: int) -> StepKey:
    index = case % NUM_KEYS
    return StepKey(
        BATCHES[index % len(BATCHES)],
        CACHE_LENS[index // len(BATCHES) % len(CACHE_LENS)],
        MEMORY_LENS[index // (len(BATCHES) * len(CACHE_LENS))],
    )


def make_target(device: torch.device) -> CudaGraphTarget:
    """The ``reasyn-kv`` target for ``device`` (a CUDA device, or the CPU for the CPU checks)."""
    return KVTarget(device).as_target()


class KVTarget(SeededTarget):
    """The decoder, its eager steps, its step graphs, and the episodes the checks run on them.
    ``cache_class`` and ``graph_kv_class`` (the decoder the graphs capture) let the project's
    tests swap in deliberately broken graphs; the eager side always runs the plain decoder."""

    keys = tuple(key_for_case(case) for case in range(NUM_KEYS))
    largest_key = key_for_case(LARGEST_CASE)

    def __init__(
        self,
        device: torch.device,
        cache_class: type[StepGraphCache] = StepGraphCache,
        graph_kv_class: type[KVDecoder] = KVDecoder,
    ) -> None:
        super().__init__(device)
        on_cuda = device.type == "cuda"
        weights = with_bf16_matmul_weights(self.decoder) if on_cuda else self.decoder
        self.kv = KVDecoder(weights)
        self.eager_steps = EagerSteps(self.kv, bf16=True)
        self.cache = cache_class(graph_kv_class(weights)) if on_cuda else None

    def as_target(self) -> CudaGraphTarget:
        common = self.common_fields()
        if self.cache is None:
            return CudaGraphTarget(**common)
        return CudaGraphTarget(
            **common,
            cache=self.graph_cache(self.cache, StepGraphCache.STAGES, self.cache.clear),
            state=State(reset=self.cache.clear_state),
            capture_clean=CaptureClean(self.capture_clean_forward),
        )

    def eager(self, inputs: Inputs) -> dict[str, Tensor]:
        return self.episode(self.eager_steps, inputs)

    def graphed(self, inputs: Inputs) -> dict[str, Tensor]:
        if self.cache is None:
            raise RuntimeError("reasyn_ref's step graphs need CUDA; this target is on the CPU")
        return self.episode(self.cache, inputs)

    def episode(self, steps: EagerSteps | StepGraphCache, inputs: Inputs) -> dict[str, Tensor]:
        """One target through ``steps``: load it, prefill the prefixes, feed ``step_tokens`` one
        step at a time. Returns every step's logits [STEPS, Bb, vocab] (fp32) and the cache it
        leaves [L, 2, Bb, S, d], zero past each row's last written position."""
        key = self.key_of(inputs)
        lengths, step_tokens = inputs["lengths"], inputs["step_tokens"]
        kv = steps.kv
        with steps.claim(key) as slot:
            buffers = claimed(slot)
            with step_context(self.device, bf16=True):
                kv.load_target(buffers, inputs["memory"], inputs["memory_padding_mask"])
                kv.prefill(buffers, inputs["tokens"], lengths - 1)
            logits = []
            for step, fed in enumerate(step_tokens):
                buffers.inputs.copy_(torch.stack((fed, lengths + step)))
                logits.append(slot.step(key.batch))
            # Written: the prefill's positions [0, P) of every row, then each row's steps.
            reach = (lengths + len(step_tokens)).clamp(min=inputs["tokens"].shape[1])
            written = torch.arange(key.cache_len, device=self.device) < reach.unsqueeze(1)
            cache = torch.where(written.view(1, 1, *written.shape, 1), buffers.cache, 0)
        return {"logits": torch.stack(logits), "cache": cache}

    def inputs_at(self, generator: torch.Generator, key: StepKey) -> Inputs:
        """One episode at the case's key: random memory with a random padded suffix, prefixes of
        random lengths right-padded to cache_len - STEPS, random tokens for every step."""
        batch, cache_len, memory_len = key
        config, device = self.config, self.device
        prefix_len = cache_len - STEPS

        def draw(low: int, high: int, size: tuple[int, ...]) -> Tensor:
            return torch.randint(low, high, size, generator=generator, device=device)

        lengths = draw(1, prefix_len + 1, (batch,))
        real = torch.arange(prefix_len, device=device) < lengths.unsqueeze(1)
        tokens = torch.where(
            real, draw(3, config.vocab_size, (batch, prefix_len)), config.pad_token
        )
        tokens[:, 0] = config.start_token
        memory = torch.randn(1, memory_len, config.d_model, generator=generator, device=device)
        padding = torch.arange(memory_len, device=device) >= draw(1, memory_len + 1, (1, 1))
        return {
            "memory": memory,
            "memory_padding_mask": padding,
            "tokens": tokens,
            "lengths": lengths,
            "step_tokens": draw(3, config.vocab_size, (STEPS, batch)),
        }

    def key_of(self, inputs: Inputs) -> StepKey:
        """Rows, the cache the prefixes plus the steps need (a sequence bucket), memory length."""
        batch, prefix_len = inputs["tokens"].shape
        needed = prefix_len + len(inputs["step_tokens"])
        return StepKey(batch, bucket_seq(needed, self.config.max_len), inputs["memory"].shape[1])

    def sample(self, seed: int, graphs: bool) -> list[list[int]]:
        """KVSampler's tokens for fixed prefixes and memory under ``seed``, graphs on or
        off (the same target as the ``reasyn`` target samples)."""
        sampler = KVSampler(self.decoder, bf16=True, cudagraph=graphs)
        memory, padding = sample_target(self.config)
        generator = torch.Generator(self.device).manual_seed(seed)
        return sampler.sample(
            memory.to(self.device),
            padding.to(self.device),
            sample_prefixes(self.config),
            generator,
            max_len=SAMPLE_MAX_LEN,
        )

    def unsupported_modes(self) -> dict[str, tuple[Callable[[], object], str]]:
        """Settings and inputs the step graphs refuse, each with the error it must raise. On the
        CPU the input checks run through the eager steps: both share the decoder's checks."""
        steps = self.cache if self.cache is not None else self.eager_steps
        decoder, max_len = self.decoder, self.config.max_len
        modes: dict[str, tuple[Callable[[], object], str]] = {
            "sampler graphs without bf16": (
                lambda: KVSampler(decoder, bf16=False, cudagraph=True),
                r"cudagraph=True needs bf16=True",
            ),
            "a cache longer than the decoder's positions": (
                functools.partial(enter_claim, steps, StepKey(1, max_len + 64, 64)),
                rf"key\.cache_len {max_len + 64} exceeds the decoder's max_len {max_len}",
            ),
            "an empty batch bucket": (
                functools.partial(enter_claim, steps, StepKey(0, 64, 64)),
                r"key\.batch must be an int >= 1",
            ),
            "more rows than the batch bucket": (
                functools.partial(step_rows, steps, StepKey(1, 64, 64), 2),
                r"rows must be an int in \[1, Bb=1\], got 2",
            ),
            "int32 prefixes": (
                functools.partial(self._episode_with, steps, "tokens", torch.int32),
                r"tokens must be a torch\.long tensor",
            ),
            "integer memory": (
                functools.partial(self._episode_with, steps, "memory", torch.long),
                r"memory must be a floating-point tensor",
            ),
        }
        if self.cache is None:
            modes["graphs without CUDA"] = (
                lambda: StepGraphCache(self.kv),
                r"StepGraphCache needs CUDA",
            )
        else:
            cpu_kv = KVDecoder(seeded_decoder(DecoderConfig.tiny(), MODEL_SEED))
            modes["graphs of a decoder on the CPU"] = (
                lambda: StepGraphCache(cpu_kv),
                r"needs the decoder on a CUDA device",
            )
        return modes

    def _episode_with(
        self, steps: EagerSteps | StepGraphCache, name: str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        """An episode of case 0 with input ``name`` cast to ``dtype``."""
        inputs = self.make_inputs(torch.Generator(self.device).manual_seed(TARGET_SEED), 0)
        return self.episode(steps, {**inputs, name: inputs[name].to(dtype)})


def enter_claim(steps: EagerSteps | StepGraphCache, key: StepKey) -> None:
    with steps.claim(key):
        pass


def step_rows(steps: EagerSteps | StepGraphCache, key: StepKey, rows: int) -> None:
    with steps.claim(key) as slot:
        slot.step(rows)
