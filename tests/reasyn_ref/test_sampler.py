"""The batched AR sampler on CPU: layout, batched vs per-row logits, sampling, stops, toggles,
guards and input checks."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from reasyn_ref import ARSampler, ARStep, Decoder, bucket_batch, expand_memory
from reasyn_ref.sampler import MIN_TEMPERATURE, pad_memory, pad_rows

START, END, PAD = 1, 2, 0
TOGGLES = {
    "REASYN_BATCHED_AR": ("batched", True),
    "REASYN_BF16": ("bf16", False),
    "REASYN_BUCKET": ("bucket", True),
    "REASYN_CUDAGRAPH": ("cudagraph", False),
}


@pytest.fixture(autouse=True)
def no_toggles_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the toggles they mean; the caller's environment must not leak in."""
    for name in TOGGLES:
        monkeypatch.delenv(name, raising=False)


def rigged(decoder: Decoder, token: int) -> Decoder:
    """The decoder with its head's last layer made to prefer ``token`` whatever the input."""
    last = decoder.head[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(-100.0)
        last.bias[token] = 100.0
    return decoder


# --- layout --------------------------------------------------------------------------------


def padded(rows: list[list[int]], batch: int, length: int) -> list[list[int]]:
    """The expected layout, written out: rows right-padded, then dummy rows."""
    real = [row + [PAD] * (length - len(row)) for row in rows]
    return real + [[START] + [PAD] * (length - 1)] * (batch - len(rows))


def test_pad_rows_bucketed_layout(tiny_decoder):
    rows = [[1, 7, 8], [1], [1, *range(3, 72)]]  # lengths 3, 1, 70
    tokens, gather = pad_rows(rows, tiny_decoder.config, bucket=True)
    assert tokens.dtype == gather.dtype == torch.long
    assert tokens.tolist() == padded(rows, 4, 128)
    assert gather.tolist() == [2, 0, 69, 0]


def test_pad_rows_unbucketed_layout(tiny_decoder):
    rows = [[1, 7, 8], [1], [1, *range(3, 72)]]
    tokens, gather = pad_rows(rows, tiny_decoder.config, bucket=False)
    assert tokens.tolist() == padded(rows, 3, 70)
    assert gather.tolist() == [2, 0, 69]


# Rigged to always sample 7 from prefixes of lengths 1, 2 and 5 up to max_len 7: the rows
# finish after 6, 5 and 2 steps.
PREFIXES = [[1], [1, 5], [1, 5, 6, 7, 8]]


def grown(step: int) -> list[list[int]]:
    """The unfinished rows of PREFIXES at the start of ``step`` (from 0) when 7 is always drawn."""
    rows = [prefix + [7] * step for prefix in PREFIXES]
    return [row for row in rows if len(row) < 7]


@pytest.mark.parametrize("bucket", [True, False])
def test_every_step_stages_the_padded_layout_of_the_active_rows(
    tiny_decoder, target, watch_stages, bucket
):
    sampler = ARSampler(rigged(tiny_decoder, 7), batched=True, bucket=bucket)
    staged = watch_stages(sampler)
    out = sampler.sample(*target, PREFIXES, torch.Generator().manual_seed(0), max_len=7)
    assert out == [prefix + [7] * (7 - len(prefix)) for prefix in PREFIXES]
    assert len(staged) == 6
    for step, (tokens, gather, _) in enumerate(staged):
        rows = grown(step)
        longest = max(map(len, rows))
        batch, length = (bucket_batch(len(rows)), 64) if bucket else (len(rows), longest)
        assert tokens.tolist() == padded(rows, batch, length), step
        assert gather.tolist() == [len(r) - 1 for r in rows] + [0] * (batch - len(rows)), step


def test_per_row_path_stages_each_row_alone_at_its_length(tiny_decoder, target, watch_stages):
    sampler = ARSampler(rigged(tiny_decoder, 7), batched=False, bucket=True)
    staged = watch_stages(sampler)
    sampler.sample(*target, PREFIXES, torch.Generator().manual_seed(0), max_len=7)
    expected = [[row] for step in range(6) for row in grown(step)]
    assert [tokens.tolist() for tokens, _, _ in staged] == expected
    assert [gather.tolist() for _, gather, _ in staged] == [[len(r[0]) - 1] for r in expected]


@pytest.mark.parametrize(("batched", "copies"), [(True, 6), (False, 13)])
def test_one_copy_each_way_per_step(tiny_decoder, target, transfers, batched, copies):
    """Each step (each row's step on the per-row path) copies tokens and gather to the device
    once each and the sampled tokens back once; nothing else crosses."""
    sampler = ARSampler(rigged(tiny_decoder, 7), batched=batched)
    transfers.clear()
    sampler.sample(*target, PREFIXES, torch.Generator().manual_seed(0), max_len=7)
    assert transfers == ["to", "to", "cpu"] * copies


def test_bucketing_pads_the_targets_memory_to_a_multiple_of_64_masked(target):
    memory, mask = target  # 20 positions, the last 4 already padding
    padded, padded_mask = pad_memory(memory, mask)
    assert padded.shape == (1, 64, memory.shape[2])
    assert torch.equal(padded[:, :20], memory) and not padded[:, 20:].any()
    assert torch.equal(padded_mask[:, :20], mask) and padded_mask[:, 20:].all()
    same, same_mask = pad_memory(padded, padded_mask)
    assert same is padded and same_mask is padded_mask


def test_padded_memory_leaves_the_logits_within_tolerance(tiny_decoder, target, exact_fp32):
    memory, mask = target
    tokens, gather = pad_rows([[1, 7, 9], [1, 4]], tiny_decoder.config, bucket=True)
    plain = tiny_decoder(tokens, *expand_memory(memory, mask, 2), gather)
    padded = tiny_decoder(tokens, *expand_memory(*pad_memory(memory, mask), 2), gather)
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)


def test_cpu_staging_is_not_pinned(tiny_decoder, target, watch_stages):
    sampler = ARSampler(tiny_decoder)
    staged = watch_stages(sampler)
    sampler.sample(*target, [[START]], torch.Generator().manual_seed(0), max_len=3)
    assert staged and not any(pinned for _, _, pinned in staged)


# --- batched vs per-row logits (as upstream tested it) --------------------------------------


@pytest.fixture
def exact_fp32():
    """fp32 without TF32 and the math attention backend, restored afterwards."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.set_float32_matmul_precision(precision)


def alone(row: list[int], config, target: tuple[Tensor, Tensor]) -> ARStep:
    """Upstream's per-row step: the row at its exact length, the target's own memory."""
    tokens, gather = pad_rows([row], config, bucket=False)
    return ARStep(tokens, *target, gather, rows=1)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3, 9])
@pytest.mark.parametrize("longest", [1, 63, 64, 65, 511, 512])
def test_batched_logits_match_per_row_logits(tiny_decoder, target, exact_fp32, longest, batch):
    config = tiny_decoder.config
    generator = torch.Generator().manual_seed(1000 * longest + batch)
    lengths = [longest, *torch.randint(1, longest + 1, (batch - 1,), generator=generator).tolist()]
    rows = [
        [START, *torch.randint(3, config.vocab_size, (n - 1,), generator=generator).tolist()]
        for n in lengths
    ]
    sampler = ARSampler(tiny_decoder, batched=True, bucket=True)

    tokens, gather = pad_rows(rows, config, bucket=True)
    step = ARStep(tokens, *expand_memory(*target, len(tokens)), gather, rows=batch)
    batched = sampler.step_logits(step)
    per_row = torch.cat([sampler.step_logits(alone(row, config, target)) for row in rows])

    assert batched.dtype == per_row.dtype == torch.float32
    assert batched.shape == (batch, config.vocab_size)
    total_variation = 0.5 * (
        torch.softmax(batched / 0.1, -1) - torch.softmax(per_row / 0.1, -1)
    ).abs().sum(-1)
    assert total_variation.max().item() < 1e-4
    lo, hi = config.reaction_tokens
    assert torch.equal(batched[:, lo:hi].topk(16).indices, per_row[:, lo:hi].topk(16).indices)


# --- sampling --------------------------------------------------------------------------------


def test_draws_are_from_the_softmax_at_temperature_with_the_callers_generator(
    tiny_decoder, target, monkeypatch
):
    sampler = ARSampler(tiny_decoder, temperature=0.7)
    logits_seen, draws = [], []
    step, multinomial = sampler.step_logits, torch.multinomial

    def step_spy(*args, **kwargs):
        logits_seen.append(step(*args, **kwargs))
        return logits_seen[-1]

    def multinomial_spy(probs, num_samples, *, generator=None):
        draws.append((probs, num_samples, generator))
        return multinomial(probs, num_samples, generator=generator)

    monkeypatch.setattr(sampler, "step_logits", step_spy)
    monkeypatch.setattr(torch, "multinomial", multinomial_spy)
    generator = torch.Generator().manual_seed(0)
    sampler.sample(*target, [[START], [START, 5]], generator, max_len=3)
    assert len(draws) == len(logits_seen) == 2
    for logits, (probs, num_samples, used) in zip(logits_seen, draws, strict=True):
        assert logits.shape == (len(probs), 272) and num_samples == 1 and used is generator
        torch.testing.assert_close(probs, torch.softmax(logits / 0.7, dim=-1))


@pytest.mark.slow
@pytest.mark.parametrize("batched", [True, False])
def test_same_seed_same_tokens_and_only_the_generator_is_used(tiny_decoder, target, batched):
    sampler = ARSampler(tiny_decoder, temperature=1.0, batched=batched)
    prefixes = [[START], [START, 9], [START, 9, 10]]
    global_rng = torch.get_rng_state()
    first = sampler.sample(*target, prefixes, torch.Generator().manual_seed(7), max_len=24)
    second = sampler.sample(*target, prefixes, torch.Generator().manual_seed(7), max_len=24)
    assert first == second
    assert torch.equal(torch.get_rng_state(), global_rng)
    assert all(seq[: len(p)] == p for seq, p in zip(first, prefixes, strict=True))


@pytest.mark.slow
def test_different_seeds_draw_different_tokens(tiny_decoder, target):
    # At temperature 5 the tiny model's distribution is near uniform over 272 ids: 8 rows of
    # up to 23 draws agreeing by chance is out of the question.
    sampler = ARSampler(tiny_decoder, temperature=5.0)
    prefixes = [[START]] * 8
    first = sampler.sample(*target, prefixes, torch.Generator().manual_seed(1), max_len=24)
    second = sampler.sample(*target, prefixes, torch.Generator().manual_seed(2), max_len=24)
    assert first != second


def counting_step(step: ARStep) -> Tensor:
    """Fake step logits that pick last + 1, or END after 6; only the rows' last real tokens
    (read through gather) decide, so a wrong layout changes the result."""
    tokens, rows = step.tokens, step.rows
    last = tokens[torch.arange(tokens.shape[0]), step.gather][:rows]
    chosen = torch.where(last == 6, END, last + 1)
    logits = torch.full((rows, 272), -1e4)
    logits[torch.arange(rows), chosen] = 0.0
    return logits


@pytest.mark.parametrize("batched", [True, False])
def test_a_row_that_samples_end_stops_while_others_continue(tiny_decoder, target, batched):
    sampler = ARSampler(tiny_decoder, batched=batched)
    sampler.step_logits = counting_step
    prefixes = [[START, 3], [START, 5], [START, 4]]
    out = sampler.sample(*target, prefixes, torch.Generator().manual_seed(0))
    assert out == [[START, 3, 4, 5, 6, END], [START, 5, 6, END], [START, 4, 5, 6, END]]
    assert prefixes == [[START, 3], [START, 5], [START, 4]]  # the caller's lists are untouched


def test_a_decoder_rigged_to_end_stops_after_one_step(tiny_decoder, target, watch_stages):
    sampler = ARSampler(rigged(tiny_decoder, END))
    staged = watch_stages(sampler)
    prefixes = [[START], [START, 9, 10], [START, 11]]
    out = sampler.sample(*target, prefixes, torch.Generator().manual_seed(0))
    assert out == [[*p, END] for p in prefixes]
    assert len(staged) == 1


def test_rows_stop_at_max_len(tiny_decoder, target):
    sampler = ARSampler(rigged(tiny_decoder, 7))
    out = sampler.sample(
        *target, [[START], [START, 9, 9]], torch.Generator().manual_seed(0), max_len=10
    )
    assert out == [[START] + [7] * 9, [START, 9, 9] + [7] * 7]


def test_rows_stop_at_the_configs_max_len_by_default(tiny_decoder, target):
    max_len = tiny_decoder.config.max_len
    sampler = ARSampler(rigged(tiny_decoder, 7))
    out = sampler.sample(*target, [[START] * (max_len - 2)], torch.Generator().manual_seed(0))
    assert out == [[START] * (max_len - 2) + [7, 7]]


def test_finished_prefixes_are_returned_as_they_are(tiny_decoder, target, watch_stages):
    sampler = ARSampler(tiny_decoder)
    staged = watch_stages(sampler)
    prefixes = [[START, 5, END], [START, 5, 6, 7]]
    assert (
        sampler.sample(*target, prefixes, torch.Generator().manual_seed(0), max_len=4) == prefixes
    )
    assert staged == []


# --- toggles and guards ----------------------------------------------------------------------


def test_defaults_without_environment(tiny_decoder):
    sampler = ARSampler(tiny_decoder)
    assert (sampler.batched, sampler.bf16, sampler.bucket, sampler.cudagraph) == (
        True,
        False,
        True,
        False,
    )
    assert sampler.graph_cache is None
    assert sampler.temperature == 0.1
    assert sampler.device == torch.device("cpu")


@pytest.mark.parametrize("variable", ["REASYN_BATCHED_AR", "REASYN_BF16", "REASYN_BUCKET"])
def test_environment_sets_a_toggle_and_an_explicit_argument_wins(
    tiny_decoder, monkeypatch, variable
):
    attribute, default = TOGGLES[variable]
    monkeypatch.setenv(variable, "0" if default else "1")
    assert getattr(ARSampler(tiny_decoder), attribute) is (not default)
    assert getattr(ARSampler(tiny_decoder, **{attribute: default}), attribute) is default


def test_explicit_cudagraph_off_wins_over_the_environment(tiny_decoder, monkeypatch):
    monkeypatch.setenv("REASYN_CUDAGRAPH", "1")
    with pytest.raises(ValueError, match="cudagraph=True needs bf16=True"):
        ARSampler(tiny_decoder)  # the environment turned graphs on
    sampler = ARSampler(tiny_decoder, cudagraph=False)
    assert sampler.cudagraph is False and sampler.graph_cache is None


@pytest.mark.parametrize("variable", sorted(TOGGLES))
def test_garbage_in_the_environment_is_refused_naming_it(tiny_decoder, monkeypatch, variable):
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ValueError, match=variable):
        ARSampler(tiny_decoder)


GRAPH_ON = {"cudagraph": True, "batched": True, "bucket": True, "bf16": True}


@pytest.mark.parametrize(
    ("off", "message"),
    [
        ("batched", r"cudagraph=True needs batched=True \(REASYN_BATCHED_AR=1\)"),
        ("bucket", r"cudagraph=True needs bucket=True \(REASYN_BUCKET=1\)"),
        (
            "bf16",
            r"cudagraph=True needs bf16=True \(REASYN_BF16=1\): graphs capture the bf16 autocast path",
        ),
    ],
)
def test_cudagraph_needs_the_path_graphs_capture(tiny_decoder, monkeypatch, off, message):
    monkeypatch.setitem(sys.modules, "reasyn_ref.graph_cache", None)  # importing it would fail
    with pytest.raises(ValueError, match=message):
        ARSampler(tiny_decoder, **(GRAPH_ON | {off: False}))


def test_cudagraph_needs_cuda(tiny_decoder, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasyn_ref.graph_cache", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"cudagraph=True needs CUDA"):
        ARSampler(tiny_decoder, **GRAPH_ON)


def test_cudagraph_needs_the_decoder_on_cuda(tiny_decoder, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasyn_ref.graph_cache", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(
        ValueError, match="cudagraph=True needs the decoder on a CUDA device, it is on cpu"
    ):
        ARSampler(tiny_decoder, **GRAPH_ON)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kwargs", "error"),
    [
        ("temperature", {"temperature": 0}, ValueError),
        ("temperature", {"temperature": -0.5}, ValueError),
        ("temperature", {"temperature": 1e-40}, ValueError),
        ("temperature", {"temperature": math.nan}, ValueError),
        ("temperature", {"temperature": math.inf}, ValueError),
        ("temperature", {"temperature": True}, TypeError),
        ("temperature", {"temperature": "0.1"}, TypeError),
        ("graph_capacity", {"graph_capacity": 0}, ValueError),
        ("graph_capacity", {"graph_capacity": "3"}, TypeError),
        ("decoder", {"decoder": torch.nn.Linear(2, 2)}, TypeError),
    ],
)
def test_constructor_refuses_bad_arguments(tiny_decoder, name, kwargs, error):
    with pytest.raises(error, match=rf"^{name}\b"):
        ARSampler(**({"decoder": tiny_decoder} | kwargs))


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-30])
def test_a_tiny_temperature_samples_the_most_likely_token(tiny_decoder, target, temperature):
    sampler = ARSampler(tiny_decoder, temperature=temperature)
    seen = []
    step_logits = sampler.step_logits

    def spy(step):
        seen.append(step_logits(step))
        return seen[-1]

    sampler.step_logits = spy
    prefixes = [[START, 5], [START, 9]]
    rows = sampler.sample(*target, prefixes, torch.Generator().manual_seed(0), max_len=3)
    assert len(seen) == 1  # one step
    assert [row[-1] for row in rows] == seen[0].argmax(dim=-1).tolist()


def not_finite(value: float):
    def change(a):
        memory = a["memory"].clone()
        memory[0, 3, 5] = value
        return a | {"memory": memory}

    return change


def each_row(rows):
    yield from rows


# (argument the error must name, valid arguments -> bad ones, the error's type)
BAD_SAMPLE_ARGUMENTS = [
    pytest.param(
        "memory",
        lambda a: (
            a
            | {
                "memory": a["memory"].expand(2, -1, -1),
                "memory_padding_mask": a["memory_padding_mask"].expand(2, -1),
            }
        ),
        ValueError,
        id="two targets",
    ),
    pytest.param(
        "memory", lambda a: a | {"memory": torch.zeros(1, 20, 16)}, ValueError, id="width mismatch"
    ),
    pytest.param(
        "memory", lambda a: a | {"memory": a["memory"].long()}, ValueError, id="integer memory"
    ),
    pytest.param(
        "memory", lambda a: a | {"memory": a["memory"].double()}, ValueError, id="float64 memory"
    ),
    pytest.param(
        "memory", lambda a: a | {"memory": a["memory"].bfloat16()}, ValueError, id="bf16 memory"
    ),
    pytest.param("memory", not_finite(math.nan), ValueError, id="NaN memory"),
    pytest.param("memory", not_finite(math.inf), ValueError, id="inf memory"),
    pytest.param("memory", not_finite(-math.inf), ValueError, id="-inf memory"),
    pytest.param(
        "memory",
        lambda a: (
            a
            | {"memory": a["memory"][:, :0], "memory_padding_mask": a["memory_padding_mask"][:, :0]}
        ),
        ValueError,
        id="memory length 0",
    ),
    pytest.param("memory", lambda a: a | {"memory": a["memory"][0]}, ValueError, id="2-d memory"),
    pytest.param("memory", lambda a: a | {"memory": [[0.0]]}, TypeError, id="a list"),
    pytest.param(
        "memory_padding_mask",
        lambda a: a | {"memory_padding_mask": a["memory_padding_mask"][:, :19]},
        ValueError,
        id="mask shape mismatch",
    ),
    pytest.param(
        "memory_padding_mask",
        lambda a: a | {"memory_padding_mask": a["memory_padding_mask"].float()},
        ValueError,
        id="float mask",
    ),
    pytest.param(
        "memory_padding_mask",
        lambda a: a | {"memory_padding_mask": torch.ones_like(a["memory_padding_mask"])},
        ValueError,
        id="all padding",
    ),
    pytest.param("prefixes", lambda a: a | {"prefixes": []}, ValueError, id="no rows"),
    pytest.param("prefixes", lambda a: a | {"prefixes": "abc"}, TypeError, id="a string"),
    pytest.param("prefixes", lambda a: a | {"prefixes": 42}, TypeError, id="an int"),
    pytest.param(
        "prefixes", lambda a: a | {"prefixes": each_row([[START]])}, TypeError, id="a generator"
    ),
    pytest.param("prefixes", lambda a: a | {"prefixes": [[START], []]}, ValueError, id="empty row"),
    pytest.param(
        "prefixes", lambda a: a | {"prefixes": [[START, 272]]}, ValueError, id="id = vocab"
    ),
    pytest.param(
        "prefixes", lambda a: a | {"prefixes": [[START, -1]]}, ValueError, id="negative id"
    ),
    pytest.param("prefixes", lambda a: a | {"prefixes": [[START, 3.0]]}, TypeError, id="float id"),
    pytest.param("prefixes", lambda a: a | {"prefixes": [[True]]}, TypeError, id="bool id"),
    pytest.param(
        "prefixes",
        lambda a: a | {"prefixes": [[START] * 9], "max_len": 8},
        ValueError,
        id="row over max_len",
    ),
    pytest.param("max_len", lambda a: a | {"max_len": 513}, ValueError, id="max_len over config"),
    pytest.param("max_len", lambda a: a | {"max_len": 0}, ValueError, id="max_len 0"),
    pytest.param("max_len", lambda a: a | {"max_len": 8.0}, TypeError, id="float max_len"),
    pytest.param("generator", lambda a: a | {"generator": None}, TypeError, id="no generator"),
    pytest.param("generator", lambda a: a | {"generator": 7}, TypeError, id="a seed"),
]


@pytest.mark.parametrize(("name", "change", "error"), BAD_SAMPLE_ARGUMENTS)
def test_sample_refuses_bad_input_naming_it(
    tiny_decoder, target, watch_stages, name, change, error
):
    sampler = ARSampler(tiny_decoder)
    staged = watch_stages(sampler)
    generator = torch.Generator().manual_seed(0)
    memory, mask = target
    valid = {
        "memory": memory,
        "memory_padding_mask": mask,
        "prefixes": [[START]],
        "generator": generator,
    }
    with pytest.raises(error, match=rf"^{name}\b"):
        sampler.sample(**change(valid))
    assert staged == []  # refused before any step ran
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())


def test_step_logits_takes_an_ar_step(tiny_decoder):
    with pytest.raises(TypeError, match=r"^step must be an ARStep, got tuple"):
        ARSampler(tiny_decoder).step_logits((1, 2))


# What only the decoder can judge: the step itself is well-formed.
BAD_STEP_ARGUMENTS = [
    pytest.param("tokens", lambda a: a | {"tokens": a["tokens"] + 300}, id="id past vocab"),
    pytest.param("gather", lambda a: a | {"gather": torch.tensor([64, 0])}, id="gather = L"),
    pytest.param(
        "memory",
        lambda a: a | {"memory": torch.zeros(2, 20, 16)},
        id="width mismatch",
    ),
    pytest.param("memory", lambda a: a | {"memory": a["memory"].double()}, id="float64 memory"),
]


@pytest.mark.parametrize(("name", "change"), BAD_STEP_ARGUMENTS)
def test_step_logits_refuses_what_the_decoder_cannot_run_naming_it(
    tiny_decoder, target, name, change
):
    sampler = ARSampler(tiny_decoder)
    tokens, gather = pad_rows([[START, 5], [START]], tiny_decoder.config, bucket=True)
    memory, mask = expand_memory(*target, 2)
    valid = {
        "tokens": tokens,
        "memory": memory,
        "memory_padding_mask": mask,
        "gather": gather,
        "rows": 2,
    }
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        sampler.step_logits(ARStep(**change(valid)))
