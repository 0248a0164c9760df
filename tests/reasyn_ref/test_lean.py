"""The lean step on the CPU: its arithmetic is the upstream step's (fp32 copies agree to float
rounding), its inputs are checked before any work, it is a snapshot of the decoder's weights,
and the sampler, worker pool and graph cache refuse a lean setting they cannot honour."""

from __future__ import annotations

import pytest
import torch

from reasyn_ref import ARSampler, DecoderConfig, WorkerPool
from reasyn_ref.graph_cache import GraphCache
from reasyn_ref.lean import LeanDecoder
from reasyn_ref.model import ar_step_logits
from reasyn_ref.step import GraphKey
from reasyn_ref.workloads import random_step, seeded_decoder

# One target shared by the batch (the sampler's layout), a memory per row, no mask, batch 1.
KEYS = (
    GraphKey(1, 64, 64, True),
    GraphKey(4, 128, 64, True, shared_memory=True),
    GraphKey(8, 64, 128, False),
    GraphKey(2, 192, 64, True),
)


# Every key at the tiny config; the upstream-sized config (seconds on a CPU) at the sampler's key.
CASES = [(DecoderConfig.tiny(), key) for key in KEYS] + [(DecoderConfig(), KEYS[1])]


def case_id(value: object) -> str:
    return f"d{value.d_model}" if isinstance(value, DecoderConfig) else str(tuple(value))


@pytest.mark.slow
@pytest.mark.parametrize(("config", "key"), CASES, ids=case_id)
def test_fp32_lean_step_is_the_decoders_arithmetic(config, key) -> None:
    decoder = seeded_decoder(config, 0)
    lean = LeanDecoder(decoder, dtype=torch.float32)
    step = random_step(config, key, seed=5)
    expected = ar_step_logits(decoder, step, bf16=False)
    actual = ar_step_logits(lean, step, bf16=False)
    # Same operations in another order (one key/value matmul for all layers, the last layer
    # at one row): float32 rounding apart, nothing else.
    assert actual.shape == expected.shape == (step.rows, config.vocab_size)
    scale = expected.abs().max()
    assert (actual - expected).abs().max() <= 1e-5 * scale


def test_bf16_lean_step_stays_near_the_decoder() -> None:
    config = DecoderConfig.tiny()
    decoder = seeded_decoder(config, 0)
    step = random_step(config, GraphKey(4, 64, 64, True, shared_memory=True), seed=1)
    expected = ar_step_logits(decoder, step, bf16=False)
    actual = ar_step_logits(LeanDecoder(decoder), step, bf16=False)
    assert actual.dtype == torch.float32
    relative = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert 0 < relative < 0.05  # bf16 rounding: not exact, not far


def test_lean_decoder_is_a_snapshot(tiny_decoder) -> None:
    lean = LeanDecoder(tiny_decoder, dtype=torch.float32)
    step = random_step(tiny_decoder.config, GraphKey(2, 64, 64, True), seed=2)
    before = ar_step_logits(lean, step, bf16=False)
    with torch.no_grad():
        tiny_decoder.head[-1].bias.add_(1.0)
    assert torch.equal(ar_step_logits(lean, step, bf16=False), before)


def test_lean_decoder_needs_a_decoder_and_a_floating_dtype(tiny_decoder) -> None:
    with pytest.raises(TypeError, match="decoder must be a reasyn_ref Decoder, got Linear"):
        LeanDecoder(torch.nn.Linear(2, 2))
    with pytest.raises(
        ValueError, match=r"dtype must be a floating torch\.dtype, got torch\.int64"
    ):
        LeanDecoder(tiny_decoder, dtype=torch.long)
    with pytest.raises(TypeError, match=r"dtype must be a floating torch\.dtype, got 'bf16'"):
        LeanDecoder(tiny_decoder, dtype="bf16")


def test_lean_forward_checks_its_inputs(tiny_decoder) -> None:
    lean = LeanDecoder(tiny_decoder)
    step = random_step(tiny_decoder.config, GraphKey(2, 64, 64, True), seed=3)
    args = (step.tokens, step.memory, step.memory_padding_mask)
    with pytest.raises(TypeError, match=r"gather must be a torch\.long tensor \[B\]"):
        lean(*args, None)
    with pytest.raises(ValueError, match=r"memory must be torch\.float32 .* got torch\.float16"):
        lean(step.tokens, step.memory.half(), step.memory_padding_mask, step.gather)
    with pytest.raises(ValueError, match=r"tokens must be a torch\.long tensor"):
        lean(step.tokens.int(), *args[1:], step.gather)
    with pytest.raises(ValueError, match=r"gather must be \[B=2\]"):
        lean(*args, step.gather[:1])


def test_lean_sampler_needs_the_batched_bf16_path(tiny_decoder) -> None:
    with pytest.raises(ValueError, match="lean=True needs batched=True and bf16=True"):
        ARSampler(tiny_decoder, lean=True, bf16=False, batched=True, cudagraph=False)
    with pytest.raises(ValueError, match="lean=True needs batched=True and bf16=True"):
        ARSampler(tiny_decoder, lean=True, bf16=True, batched=False, cudagraph=False)
    with pytest.raises(TypeError, match="lean must be a bool, got 1"):
        ARSampler(tiny_decoder, lean=1, bf16=True, cudagraph=False)


@pytest.mark.slow
def test_lean_sampler_runs_the_lean_step(tiny_decoder, target) -> None:
    memory, mask = target
    sampler = ARSampler(tiny_decoder, lean=True, bf16=True, batched=True, cudagraph=False)
    upstream = ARSampler(tiny_decoder, bf16=True, batched=True, cudagraph=False)
    prefixes = [[tiny_decoder.config.start_token]] * 3

    def sample(s: ARSampler, seed: int) -> list[list[int]]:
        return s.sample(memory, mask, prefixes, torch.Generator().manual_seed(seed), max_len=12)

    # Same seed, same answer; and it is the lean step that ran (its logits differ from the
    # upstream step's, so over a few seeds the draws differ somewhere).
    assert sample(sampler, 0) == sample(sampler, 0)
    steps = []
    sampler.step_logits = lambda step, run=sampler.step_logits: steps.append(step) or run(step)
    sample(sampler, 0)
    lean_logits = ar_step_logits(sampler.lean_decoder, steps[0], bf16=False)
    upstream_logits = upstream.step_logits(steps[0])
    assert not torch.equal(lean_logits, upstream_logits)


def test_lean_graph_cache_and_pool_check_their_flag(tiny_decoder, tmp_path) -> None:
    with pytest.raises(TypeError, match="lean must be a bool, got 'yes'"):
        GraphCache(tiny_decoder, "cpu", lean="yes")
    checkpoint = tmp_path / "missing.pt"
    with pytest.raises(ValueError, match="lean=True needs bf16=True"):
        WorkerPool(checkpoint, 1, device_type="cpu", bf16=False, cudagraph=False, lean=True)
