"""On a GPU: the capture-clean forward at ReaSyn's dimensions makes no host sync under bf16
autocast (upstream's does) and computes upstream's bits, and the eager sampler runs end to end
with its transfer counts."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import ARSampler, Decoder, DecoderConfig, GraphKey
from reasyn_ref.model import step_context
from reasyn_ref.workloads import random_step, seeded_decoder, target_memory

pytestmark = needs_cuda

START = 1


@pytest.fixture(scope="module")
def target(decoder: Decoder) -> tuple[torch.Tensor, torch.Tensor]:
    """One target's memory [1, 64, 768] and mask, the last 8 positions padding, on the GPU."""
    return target_memory(decoder.config, 64, padded=8, seed=0, device="cuda")


def step_inputs(decoder: Decoder) -> tuple[torch.Tensor, ...]:
    """The forward's inputs of a bucketed step: 8 rows of up to 64 tokens, one target's
    memory expanded over them."""
    step = random_step(decoder.config, GraphKey(8, 64, 64, True, True), seed=1, device="cuda")
    return step.tokens, step.memory, step.memory_padding_mask, step.gather


def run_under_sync_errors(forward, inputs) -> None:
    """forward(*inputs) in bf16 autocast with any host sync raising; warmed up first so lazy
    one-time setup is not what is judged."""
    with step_context(inputs[0].device, bf16=True):
        forward(*inputs)
        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            forward(*inputs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def test_forward_makes_no_host_sync_in_bf16(decoder):
    run_under_sync_errors(decoder, step_inputs(decoder))


def test_upstream_forward_syncs_in_bf16(decoder):
    """The contrast that shows the check above can fail: upstream's mask comparison syncs."""
    mode = torch.cuda.get_sync_debug_mode()
    with pytest.raises(RuntimeError, match="synchroniz"):
        run_under_sync_errors(decoder.forward_upstream, step_inputs(decoder))
    assert torch.cuda.get_sync_debug_mode() == mode


@pytest.mark.parametrize("shared_memory", [True, False], ids=["expanded memory", "per-row memory"])
def test_memory_converted_once_equals_upstream_bit_for_bit_in_bf16(decoder, shared_memory):
    """The forward converts memory and mask once for all layers under autocast; upstream's
    converts them in every layer. On the GPU the memory's layout picks the matmul path, so
    both layouts are compared; eager and graphs share the forward, so only this can tell."""
    tokens, memory, mask, gather = step_inputs(decoder)
    if not shared_memory:
        memory = memory + torch.randn_like(memory)  # a contiguous [8, M, d]: a row each
    with step_context(tokens.device, bf16=True):
        expected = decoder.forward_upstream(tokens, memory, mask, gather)
        assert torch.equal(decoder(tokens, memory, mask, gather), expected)


def test_eager_bf16_sampler_end_to_end(decoder, target, transfers, watch_stages):
    sampler = ARSampler(decoder, bf16=True, batched=True, bucket=True, cudagraph=False)
    assert sampler.device == next(decoder.parameters()).device and sampler.graph_cache is None
    staged = watch_stages(sampler)
    prefixes = [[START], [START, 9], [START, 9, 10, 11]]
    transfers.clear()
    out = sampler.sample(
        *target, prefixes, torch.Generator(device="cuda").manual_seed(0), max_len=12
    )

    steps = max(len(seq) - len(prefix) for seq, prefix in zip(out, prefixes, strict=True))
    assert transfers == ["to", "to", "cpu"] * steps
    assert len(staged) == steps and all(pinned for _, _, pinned in staged)
    config = decoder.config
    for seq, prefix in zip(out, prefixes, strict=True):
        assert seq[: len(prefix)] == prefix and len(prefix) < len(seq) <= 12
        assert all(0 <= token < config.vocab_size for token in seq)
        assert seq[-1] == config.end_token or len(seq) == 12
        assert config.end_token not in seq[len(prefix) : -1]


@pytest.mark.parametrize("name", ["generator", "memory", "memory_padding_mask"])
def test_sample_refuses_arguments_off_the_decoders_device(decoder, target, name):
    sampler = ARSampler(decoder, bf16=True, cudagraph=False)
    memory, mask = target
    arguments = {
        "memory": memory,
        "memory_padding_mask": mask,
        "prefixes": [[START]],
        "generator": torch.Generator(device="cuda"),
    }
    arguments[name] = torch.Generator() if name == "generator" else arguments[name].cpu()
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        sampler.sample(**arguments)


def test_weights_drawn_on_the_gpu_are_seeded_and_keep_the_cpu_buffers():
    config = DecoderConfig.tiny()
    first = seeded_decoder(config, 3, "cuda", portable=False)
    again = seeded_decoder(config, 3, "cuda", portable=False)
    portable = seeded_decoder(config, 3, "cuda")
    weights = [name for name, _ in first.named_parameters()]
    assert all(p.device.type == "cuda" for p in first.state_dict().values())
    assert all(torch.equal(first.get_parameter(n), again.get_parameter(n)) for n in weights)
    assert not torch.equal(first.embed.weight, portable.embed.weight)  # another generator
    # Buffers are rebuilt on the CPU by a loaded checkpoint, so they must be the CPU's bits.
    assert torch.equal(first.positions, portable.positions)
    assert torch.equal(first.causal, portable.causal)
