"""The lean step on a GPU, at the default (upstream-sized) config: its graphs replay it bit for
bit, a cached key gives fresh answers, the exact cache's eager step is the upstream one, the lean
step stays within LEAN_TOLERANCE of upstream (figures recorded for the report), and the lean
sampler samples the same with graphs on and off."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import ARSampler
from reasyn_ref.graph_cache import GraphCache, GraphKey
from reasyn_ref.lean import LEAN_TOLERANCE, LeanDecoder
from reasyn_ref.model import ar_step_logits
from reasyn_ref.workloads import random_prefixes, random_step

pytestmark = needs_cuda

# Batch 1 to 256, sequences to max_len, memories shared or per row, with and without a mask.
KEYS = (
    GraphKey(1, 64, 64, True),
    GraphKey(2, 128, 64, True, shared_memory=True),
    GraphKey(4, 64, 128, False, shared_memory=True),
    GraphKey(8, 192, 64, True),
    GraphKey(16, 64, 256, True, shared_memory=True),
    GraphKey(64, 128, 64, True, shared_memory=True),
    GraphKey(256, 512, 64, True, shared_memory=True),
)


def test_lean_graphs_replay_the_lean_step_bit_for_bit(decoder, device):
    cache = GraphCache(decoder, device, lean=True, capacity=len(KEYS))
    lean = LeanDecoder(decoder)  # a second copy of the same weights: the same step
    mismatches = []
    for case in range(3 * len(KEYS)):
        key = KEYS[case % len(KEYS)]
        step = random_step(decoder.config, key, seed=case, device=device)
        got = cache(step)
        for name, want in (
            ("cache.eager", cache.eager(step)),
            ("LeanDecoder", ar_step_logits(lean, step, bf16=False)),
        ):
            if not torch.equal(got, want):
                mismatches.append(f"case {case} at {key}: graph != {name}")
    assert mismatches == []
    assert cache.stats.captures == len(KEYS)


@pytest.mark.parametrize("what", ["memory", "gather", "tokens"])
def test_a_cached_lean_key_gives_fresh_answers(decoder, device, what):
    cache = GraphCache(decoder, device, lean=True)
    step = random_step(decoder.config, GraphKey(4, 64, 64, True, True), seed=1, device=device)
    first = cache(step)
    if what == "memory":
        changed = replace(step, memory=torch.randn_like(step.memory[:1]).expand_as(step.memory))
    elif what == "gather":
        gather = step.gather.clone()
        gather[0] = 0 if int(gather[0]) else step.tokens.shape[1] - 1
        changed = replace(step, gather=gather)
    else:
        tokens = step.tokens.clone()
        tokens[0, 0] = decoder.config.start_token + 7
        changed = replace(step, tokens=tokens)
    again = cache(changed)
    assert cache.stats.hits == 1
    assert torch.equal(again, cache.eager(changed))
    assert not torch.equal(again[0], first[0]), f"changing {what} changed nothing: a stale answer"


def test_the_exact_caches_eager_step_is_the_upstream_step(decoder, device):
    cache = GraphCache(decoder, device)
    for seed, key in enumerate(KEYS[:4]):
        step = random_step(decoder.config, key, seed=seed, device=device)
        assert torch.equal(cache.eager(step), ar_step_logits(decoder, step, bf16=True))


def test_the_lean_step_stays_within_tolerance_of_upstream(decoder, device, record_property):
    lean = LeanDecoder(decoder)
    worst, agree, rows = 0.0, 0, 0
    for case in range(4 * len(KEYS)):
        step = random_step(decoder.config, KEYS[case % len(KEYS)], seed=100 + case, device=device)
        upstream = ar_step_logits(decoder, step, bf16=True)
        got = ar_step_logits(lean, step, bf16=False)
        worst = max(worst, ((got - upstream).abs().max() / upstream.abs().max()).item())
        agree += int((got.argmax(-1) == upstream.argmax(-1)).sum())
        rows += step.rows
    record_property("lean_max_rel_diff", worst)
    record_property("lean_argmax_agreement", agree / rows)
    assert worst <= LEAN_TOLERANCE
    assert agree / rows >= 0.95, f"the lean step picks upstream's argmax in {agree}/{rows} rows"


def test_the_lean_sampler_samples_the_same_with_graphs_on_and_off(decoder, device):
    config = decoder.config
    on = ARSampler(decoder, cudagraph=True, bf16=True, batched=True, bucket=True, lean=True)
    off = ARSampler(decoder, cudagraph=False, bf16=True, batched=True, bucket=True, lean=True)
    assert on.graph_cache.lean and off.lean_decoder is not None
    generator = torch.Generator().manual_seed(3)
    memory = torch.randn(1, 64, config.d_model, generator=generator).to(device)
    padding = torch.zeros(1, 64, dtype=torch.bool, device=device)
    padding[:, -8:] = True
    prefixes = random_prefixes(config, (1, 5, 17, 40, 63, 70), generator)  # keys change

    def sample(sampler: ARSampler) -> list[list[int]]:
        seeded = torch.Generator(device).manual_seed(7)
        return sampler.sample(memory, padding, prefixes, seeded, max_len=96)

    assert sample(on) == sample(off)
    assert on.graph_cache.stats.replays > 0
