"""KVSampler on the CPU (graphs off): rows run to max_len or the end token, seeds, one copy each
way per step, and the arguments it refuses."""

from __future__ import annotations

import pytest
import torch

from reasyn_ref import Decoder, KVSampler
from reasyn_ref.workloads import random_prefixes

START, END = 1, 2


@pytest.fixture(autouse=True)
def no_toggles_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REASYN_BF16", "REASYN_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)


def rigged(decoder: Decoder, token: int) -> Decoder:
    """The decoder made to prefer ``token`` whatever the input."""
    with torch.no_grad():
        decoder.head[-1].weight.zero_()
        decoder.head[-1].bias.fill_(-100.0)
        decoder.head[-1].bias[token] = 100.0
    return decoder


def test_sampler_runs_rows_to_max_len_or_end(tiny_decoder, target):
    prefixes = [[START], [START, 5], [START, 5, 6, 7, 8], [START, 3, END], [START] * 7]
    sampler = KVSampler(rigged(tiny_decoder, 7))
    out = sampler.sample(*target, prefixes, torch.Generator().manual_seed(0), max_len=7)
    grown = [prefix + [7] * (7 - len(prefix)) for prefix in prefixes[:3]]
    assert out == [*grown, prefixes[3], prefixes[4]]
    ended = KVSampler(rigged(tiny_decoder, END))
    assert ended.sample(*target, prefixes[:2], torch.Generator(), max_len=7) == [
        [START, END],
        [START, 5, END],
    ]


@pytest.mark.slow
def test_sampler_same_seed_same_tokens(tiny_decoder, target):
    sampler = KVSampler(tiny_decoder, temperature=1.0)
    prefixes = random_prefixes(tiny_decoder.config, [1, 4, 2], torch.Generator().manual_seed(12))
    runs = [
        sampler.sample(*target, prefixes, torch.Generator().manual_seed(seed), max_len=30)
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_sampler_stages_one_copy_each_way_per_step(tiny_decoder, target, transfers):
    sampler = KVSampler(rigged(tiny_decoder, 7))
    transfers.clear()
    sampler.sample(*target, [[START], [START, 5]], torch.Generator(), max_len=7)
    # The prefill: tokens and gather over, the first draw back; then 5 steps of one each way.
    assert transfers == ["to", "to", "cpu"] + ["cpu"] * 5


def test_sampler_refuses_graphs_on_the_cpu(tiny_decoder):
    with pytest.raises(ValueError, match="cudagraph=True needs bf16=True"):
        KVSampler(tiny_decoder, cudagraph=True, bf16=False)
    with pytest.raises(ValueError, match="cudagraph=True needs"):
        KVSampler(tiny_decoder, cudagraph=True, bf16=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"decoder": "not a decoder"}, TypeError, "decoder must be a reasyn_ref Decoder"),
        ({"temperature": 0}, ValueError, "temperature must be a finite number >= 1.18e-38"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": "0.1"}, TypeError, "temperature must be a finite number"),
        ({"graph_capacity": 0}, ValueError, "graph_capacity must be an int >= 1, got 0"),
        ({"graph_capacity": 2.0}, TypeError, "graph_capacity must be an int >= 1, got 2.0"),
        ({"compile_blocks": "yes"}, TypeError, "compile_blocks must be a bool, got .yes."),
    ],
)
def test_sampler_refuses_bad_construction(tiny_decoder, kwargs, error, match):
    arguments = {"decoder": tiny_decoder, **kwargs}
    with pytest.raises(error, match=match):
        KVSampler(arguments.pop("decoder"), **arguments)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"max_len": 513}, r"max_len must be an int in \[1, config.max_len=512\], got 513"),
        ({"prefixes": [[START] * 9]}, r"prefixes\[0\] has length 9"),
        ({"prefixes": [[START, 400]]}, r"prefixes\[0\] holds token id 400"),
        ({"memory": torch.zeros(1, 20, 5)}, r"memory must be \[1, M >= 1, d_model"),
    ],
)
def test_sampler_refuses_bad_sample_arguments(tiny_decoder, target, change, match):
    memory, mask = target
    arguments = {
        "memory": memory,
        "memory_padding_mask": mask,
        "prefixes": [[START]],
        "generator": torch.Generator(),
        "max_len": 8,
        **change,
    }
    with pytest.raises(ValueError, match=match):
        KVSampler(tiny_decoder).sample(**arguments)


def test_a_generator_that_is_not_one_is_a_type_error(tiny_decoder, target):
    with pytest.raises(TypeError, match=r"^generator must be a torch.Generator on the decoder's"):
        KVSampler(tiny_decoder).sample(*target, [[START]], None, max_len=8)
