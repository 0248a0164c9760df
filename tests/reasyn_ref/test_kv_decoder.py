"""The KV decoder on CPU at the tiny config: prefill and steps against the full-recompute
decoder (rows at different lengths and positions), writes in place at each row's own position,
the cache across targets, checkpoints, grad mode, eager steps, and input checks."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from reasyn_ref import (
    Decoder,
    EagerSteps,
    KVDecoder,
    StepBuffers,
    StepKey,
    expand_memory,
    load_checkpoint,
    save_checkpoint,
)
from reasyn_ref.model import with_bf16_matmul_weights
from reasyn_ref.sampler import pad_memory, pad_rows

START, END = 1, 2
# fp32 on the CPU: the two paths differ only in the order of their reductions.
FP32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(autouse=True)
def no_toggles_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REASYN_BF16", "REASYN_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)


def random_rows(lengths: list[int], seed: int) -> list[list[int]]:
    """A start token and random ids past the special tokens, one row per length."""
    generator = torch.Generator().manual_seed(seed)
    return [
        [START, *torch.randint(3, 272, (n - 1,), generator=generator).tolist()] for n in lengths
    ]


def full_logits(decoder: Decoder, rows: list[list[int]], memory: Tensor, mask: Tensor) -> Tensor:
    """The full-recompute decoder's logits at each row's last token."""
    tokens, gather = pad_rows(rows, decoder.config, bucket=False)
    with torch.no_grad():
        return decoder(tokens, *expand_memory(memory, mask, len(rows)), gather)


class Decoding:
    """Prefill then steps by hand on one set of buffers, for rows fed chosen tokens."""

    def __init__(self, kv: KVDecoder, key: StepKey) -> None:
        self.kv = kv
        self.buffers = kv.new_buffers(key, torch.float32)

    def start(self, rows: list[list[int]], memory: Tensor, mask: Tensor) -> Tensor:
        self.rows = [list(row) for row in rows]
        tokens, gather = pad_rows(self.rows, self.kv.config, bucket=True)
        assert tokens.shape[0] == self.buffers.key.batch
        with torch.no_grad():
            self.kv.load_target(self.buffers, memory, mask)
            return self.kv.prefill(self.buffers, tokens, gather)[: len(rows)]

    def feed(self, tokens: list[int]) -> Tensor:
        """Append one token per row and step; dummy rows feed the start token at 0."""
        for row, token in zip(self.rows, tokens, strict=True):
            row.append(token)
        dummies = self.buffers.key.batch - len(self.rows)
        self.buffers.inputs.copy_(
            torch.tensor(
                [
                    [row[-1] for row in self.rows] + [START] * dummies,
                    [len(row) - 1 for row in self.rows] + [0] * dummies,
                ]
            )
        )
        with torch.no_grad():
            return self.kv.step(self.buffers)[: len(self.rows)]


# --- agreement with the full decoder --------------------------------------------------------


def test_prefill_and_steps_agree_with_full_recompute(tiny_decoder, target):
    """Rows of lengths 1, 4 and 9 (so at positions 1, 4 and 9 on the first step) in a bucket
    of 4, fed random tokens for 12 steps: every step's logits are the full decoder's."""
    memory, mask = pad_memory(*target)
    decoding = Decoding(KVDecoder(tiny_decoder), StepKey(4, 64, memory.shape[1]))
    rows = random_rows([1, 4, 9], seed=0)
    got = decoding.start(rows, memory, mask)
    torch.testing.assert_close(got, full_logits(tiny_decoder, rows, memory, mask), **FP32_TOLERANCE)
    generator = torch.Generator().manual_seed(1)
    for step in range(12):
        fed = torch.randint(3, 272, (3,), generator=generator).tolist()
        got = decoding.feed(fed)
        want = full_logits(tiny_decoder, decoding.rows, memory, mask)
        torch.testing.assert_close(got, want, **FP32_TOLERANCE, msg=f"step {step}")


@pytest.mark.slow
def test_greedy_decoding_matches_the_full_decoder(tiny_decoder, target):
    """Each row fed its own argmax: the same tokens as greedy decoding with full recompute."""
    memory, mask = pad_memory(*target)
    rows = random_rows([2, 5, 3, 7, 1], seed=3)
    decoding = Decoding(KVDecoder(tiny_decoder), StepKey(8, 64, memory.shape[1]))
    logits = decoding.start(rows, memory, mask)
    full_rows = [list(row) for row in rows]
    for _ in range(20):
        full = full_logits(tiny_decoder, full_rows, memory, mask)
        for row, token in zip(full_rows, full.argmax(-1).tolist(), strict=True):
            row.append(token)
        logits = decoding.feed(logits.argmax(-1).tolist())
    assert decoding.rows == full_rows


@pytest.mark.slow  # compiles the two blocks (inductor's C++ on the CPU)
def test_compiled_blocks_compute_the_plain_step_and_repeat_themselves_exactly(tiny_decoder, target):
    """The same prefill and 6 steps, plain and with the compiled blocks: the logits and caches
    agree within fp32 rounding (inductor orders its reductions its own way), and the compiled
    step run twice on the same inputs is bit-identical (what its graph relies on)."""
    memory, mask = pad_memory(*target)
    key = StepKey(4, 64, memory.shape[1])
    rows = random_rows([1, 4, 9], seed=5)
    compiled = KVDecoder(tiny_decoder, compile_blocks=True)
    runs = [Decoding(kv, key) for kv in (KVDecoder(tiny_decoder), compiled, compiled)]
    for decoding in runs:
        decoding.start(rows, memory, mask)
    generator = torch.Generator().manual_seed(6)
    for step in range(6):
        fed = torch.randint(3, 272, (3,), generator=generator).tolist()
        plain, once, again = (decoding.feed(fed) for decoding in runs)
        torch.testing.assert_close(once, plain, **FP32_TOLERANCE, msg=f"step {step}")
        assert torch.equal(once, again), f"step {step}"
    plain_cache, once_cache, again_cache = (decoding.buffers.cache for decoding in runs)
    torch.testing.assert_close(once_cache, plain_cache, **FP32_TOLERANCE)
    assert torch.equal(once_cache, again_cache)


def test_a_step_writes_each_rows_keys_and_values_at_its_own_position_only(tiny_decoder, target):
    memory, mask = pad_memory(*target)
    decoding = Decoding(KVDecoder(tiny_decoder), StepKey(4, 64, memory.shape[1]))
    decoding.start(random_rows([1, 6, 3, 2], seed=4), memory, mask)
    before = decoding.buffers.cache.clone()
    decoding.feed([5, 6, 7, 8])
    changed = (decoding.buffers.cache != before).any(dim=-1)  # [layers, 2, Bb, S]
    where = {(b, s) for _, _, b, s in changed.nonzero().tolist()}
    assert where == {(0, 1), (1, 6), (2, 3), (3, 2)}
    assert changed[:, :, [0, 1, 2, 3], [1, 6, 3, 2]].all()  # every layer, keys and values


def test_buffers_reused_for_a_new_target_give_the_new_targets_answers(tiny_decoder, target):
    """The cache is not cleared between targets: a target's prefill and steps overwrite every
    position a query can see. Here the first target leaves long rows behind, the second
    target's rows are shorter and must not see them."""
    memory, mask = pad_memory(*target)
    # torch 2.7's randn_like takes no generator.
    other = torch.randn(memory.shape, generator=torch.Generator().manual_seed(5)).to(memory)
    decoding = Decoding(KVDecoder(tiny_decoder), StepKey(2, 64, memory.shape[1]))
    decoding.start(random_rows([20, 30], seed=6), memory, mask)
    for _ in range(5):
        decoding.feed([9, 10])
    rows = random_rows([2, 3], seed=7)
    decoding.start(rows, other, mask)
    for step in range(4):
        got = decoding.feed([11 + step, 12])
        want = full_logits(tiny_decoder, decoding.rows, other, mask)
        torch.testing.assert_close(got, want, **FP32_TOLERANCE)


def test_dummy_and_finished_rows_do_not_touch_the_real_rows(tiny_decoder, target):
    """The same two rows alone (bucket 2) and beside two rows frozen at their last position
    (bucket 4): the same logits."""
    memory, mask = pad_memory(*target)
    kv = KVDecoder(tiny_decoder)
    alone = Decoding(kv, StepKey(2, 64, memory.shape[1]))
    crowded = Decoding(kv, StepKey(4, 64, memory.shape[1]))
    rows = random_rows([3, 5], seed=8)
    frozen = random_rows([7, 2], seed=9)
    alone.start(rows, memory, mask)
    crowded.start(rows + frozen, memory, mask)
    for step in range(3):
        torch.testing.assert_close(
            crowded.feed([20 + step, 30, frozen[0][-1], frozen[1][-1]])[:2],
            alone.feed([20 + step, 30]),
            **FP32_TOLERANCE,
        )
        for row in crowded.rows[2:]:
            row.pop()  # keep the frozen rows at their last position


def test_a_checkpoint_loads_into_the_kv_decoder(tiny_decoder, target, tmp_path):
    path = tmp_path / "decoder.pt"
    save_checkpoint(path, tiny_decoder, tiny_decoder.config)
    memory, mask = pad_memory(*target)
    rows = random_rows([4, 2], seed=10)
    key = StepKey(2, 64, memory.shape[1])
    original = Decoding(KVDecoder(tiny_decoder), key)
    loaded = Decoding(KVDecoder(load_checkpoint(path)), key)
    assert torch.equal(loaded.start(rows, memory, mask), original.start(rows, memory, mask))
    assert torch.equal(loaded.feed([7, 8]), original.feed([7, 8]))


# --- eager steps ------------------------------------------------------------------------------


def test_eager_steps_give_fresh_buffers_and_fp32_logits_of_their_own(tiny_decoder):
    steps = EagerSteps(KVDecoder(tiny_decoder), bf16=False)
    key = StepKey(4, 64, 64)
    with steps.claim(key) as first, steps.claim(key) as second:
        assert first.buffers.key == key and first.buffers.cache is not second.buffers.cache
        logits = first.step(3)
        again = first.step(3)
    assert logits.dtype == torch.float32 and logits.shape == (3, tiny_decoder.config.vocab_size)
    assert logits.data_ptr() != again.data_ptr()


def test_eager_steps_need_a_kv_decoder_and_a_bool(tiny_decoder):
    with pytest.raises(TypeError, match=r"^kv must be a KVDecoder, got Decoder"):
        EagerSteps(tiny_decoder, bf16=False)
    with pytest.raises(TypeError, match=r"^bf16 must be a bool, got 1"):
        EagerSteps(KVDecoder(tiny_decoder), bf16=1)


# --- input checks ---------------------------------------------------------------------------


@pytest.fixture
def kv(tiny_decoder) -> KVDecoder:
    return KVDecoder(tiny_decoder)


@pytest.fixture
def buffers(kv, target) -> StepBuffers:
    """Buffers with a target loaded and two rows prefilled."""
    memory, mask = pad_memory(*target)
    buffers = kv.new_buffers(StepKey(2, 64, memory.shape[1]), torch.float32)
    tokens, gather = pad_rows(random_rows([3, 1], seed=13), kv.config, bucket=True)
    with torch.no_grad():
        kv.load_target(buffers, memory, mask)
        kv.prefill(buffers, tokens, gather)
    return buffers


def test_kv_decoder_needs_a_decoder():
    with pytest.raises(TypeError, match="decoder must be a reasyn_ref Decoder"):
        KVDecoder(torch.nn.Linear(2, 2))


def test_compile_blocks_must_be_a_bool(tiny_decoder):
    with pytest.raises(TypeError, match=r"^compile_blocks must be a bool, got 1"):
        KVDecoder(tiny_decoder, compile_blocks=1)


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        (StepKey(0, 64, 64), ValueError, "key.batch must be an int >= 1, got 0"),
        (StepKey(2, 513, 64), ValueError, "key.cache_len 513 exceeds the decoder's max_len 512"),
        (StepKey(2, 64, True), TypeError, "key.memory_len must be an int >= 1, got True"),
        (StepKey(2, 64.0, 64), TypeError, "key.cache_len must be an int >= 1, got 64.0"),
        ((2, 64), TypeError, r"key must be a StepKey \(batch, cache_len, memory_len\)"),
    ],
)
def test_new_buffers_refuses_bad_keys(kv, key, error, match):
    with pytest.raises(error, match=match):
        kv.new_buffers(key, torch.float32)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("cache", lambda b: b.cache.double(), r"buffers.cache must be torch.float32"),
        ("cross", lambda b: b.cross[:1].clone(), r"buffers.cross must be torch.float32 of shape"),
        (
            "cache",
            lambda b: b.cache.transpose(2, 3).contiguous().transpose(2, 3),
            r"buffers.cache must be contiguous",
        ),
        ("inputs", lambda b: b.inputs.int(), r"buffers.inputs must be torch.int64"),
        ("cross_mask", lambda b: b.cross_mask.bool(), r"buffers.cross_mask must be"),
        ("cache", lambda b: b.cache[0], r"buffers.cache must be \[L, 2, Bb, S, d\]"),
    ],
)
def test_a_step_refuses_buffers_that_do_not_fit(kv, buffers, field, value, match):
    setattr(buffers, field, value(buffers))
    with pytest.raises(ValueError, match=match):
        kv.step(buffers)


def test_a_step_refuses_positions_outside_the_cache_and_unknown_tokens(kv, buffers):
    buffers.inputs.copy_(torch.tensor([[5, 6], [3, 64]]))
    with pytest.raises(ValueError, match=r"positions holds values in \[3, 64\]"):
        kv.step(buffers)
    buffers.inputs.copy_(torch.tensor([[5, 272], [3, 1]]))
    with pytest.raises(ValueError, match=r"tokens holds values in \[5, 272\]"):
        kv.step(buffers)


@pytest.mark.parametrize(
    ("tokens", "gather", "match"),
    [
        (torch.ones(2, 65, dtype=torch.long), torch.zeros(2, dtype=torch.long), r"P <= cache_len"),
        (torch.ones(3, 4, dtype=torch.long), torch.zeros(3, dtype=torch.long), r"\[Bb=2, P\]"),
        (torch.ones(2, 4), torch.zeros(2, dtype=torch.long), "tokens must be a torch.long"),
        (torch.ones(2, 4, dtype=torch.long), torch.tensor([0, 4]), r"gather holds values"),
        (torch.ones(2, 4, dtype=torch.long), torch.zeros(3, dtype=torch.long), r"gather must be"),
        (torch.full((2, 4), -1), torch.zeros(2, dtype=torch.long), r"tokens holds values"),
    ],
)
def test_prefill_refuses_bad_inputs_before_writing_anything(kv, buffers, tokens, gather, match):
    before = buffers.cache.clone()
    with pytest.raises(ValueError, match=match):
        kv.prefill(buffers, tokens, gather)
    assert torch.equal(buffers.cache, before)


@pytest.mark.parametrize(
    ("memory", "mask", "match"),
    [
        (torch.zeros(1, 32, 32), torch.zeros(1, 32, dtype=torch.bool), r"memory must be one"),
        (torch.zeros(2, 64, 32), torch.zeros(2, 64, dtype=torch.bool), r"memory must be one"),
        (torch.zeros(1, 64, 32), torch.zeros(1, 64), r"memory_padding_mask must be a torch.bool"),
        (torch.zeros(1, 64, 32), torch.zeros(1, 63, dtype=torch.bool), r"must be \(1, 64\)"),
        (torch.zeros(1, 64, 32, dtype=torch.long), None, r"memory must be a floating-point"),
        (
            torch.zeros(1, 64, 32, dtype=torch.float64),
            torch.zeros(1, 64, dtype=torch.bool),
            r"memory must be torch.float32 \(the step's dtype, or under autocast the "
            r"decoder's\), got torch.float64 tensor of shape \(1, 64, 32\)",
        ),
    ],
)
def test_load_target_refuses_bad_memory_before_writing_anything(kv, buffers, memory, mask, match):
    before = (buffers.cross.clone(), buffers.cross_mask.clone())
    with pytest.raises(ValueError, match=match):
        kv.load_target(buffers, memory, mask)
    assert torch.equal(buffers.cross, before[0]) and torch.equal(buffers.cross_mask, before[1])


@pytest.mark.parametrize("bf16_weights", [False, True], ids=["fp32-weights", "bf16-weights"])
def test_under_autocast_memory_is_the_decoders_or_the_steps_dtype(tiny_decoder, bf16_weights):
    """As the sampler runs it on a GPU: the bf16 weight copy, fp32 memory, under autocast."""
    decoder = with_bf16_matmul_weights(tiny_decoder) if bf16_weights else tiny_decoder
    kv = KVDecoder(decoder)
    memory, mask = torch.zeros(1, 64, 32), torch.zeros(1, 64, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        buffers = kv.new_buffers(StepKey(2, 64, 64), kv.compute_dtype())
        for dtype in (torch.float32, torch.bfloat16):
            kv.load_target(buffers, memory.to(dtype), mask)
        with pytest.raises(ValueError, match=r"memory must be torch.bfloat16 or torch.float32"):
            kv.load_target(buffers, memory.double(), mask)


@pytest.mark.parametrize(
    ("dtype", "error", "shown"),
    [
        (torch.long, ValueError, "torch.int64"),
        (torch.bool, ValueError, "torch.bool"),
        ("float32", TypeError, "'float32'"),
        (None, TypeError, "None"),
    ],
)
def test_new_buffers_needs_a_floating_point_dtype(kv, dtype, error, shown):
    with pytest.raises(error, match=rf"dtype must be a floating-point torch.dtype.*, got {shown}$"):
        kv.new_buffers(StepKey(2, 64, 64), dtype)


def test_eager_slot_refuses_bad_rows(kv):
    with EagerSteps(kv, bf16=False).claim(StepKey(2, 64, 64)) as slot:
        for rows, error in ((0, ValueError), (3, ValueError), (True, TypeError), (1.0, TypeError)):
            with pytest.raises(error, match=r"rows must be an int in \[1, Bb=2\]"):
                slot.step(rows)


@pytest.mark.parametrize(
    ("method", "arguments", "match"),
    [
        (
            "load_target",
            lambda b, t, g: (b, [[0.0]], t),
            r"^memory must be a floating-point tensor",
        ),
        (
            "load_target",
            lambda b, t, g: (b, torch.zeros(1, 64, 32), [[False] * 64]),
            r"^memory_padding_mask must be a torch.bool tensor, got list",
        ),
        ("prefill", lambda b, t, g: (b, t.tolist(), g), r"^tokens must be a torch.long tensor"),
        ("prefill", lambda b, t, g: (b, t, g.tolist()), r"^gather must be a torch.long tensor"),
        ("step", lambda b, t, g: ({"inputs": b.inputs},), r"^buffers must be StepBuffers"),
    ],
)
def test_what_is_not_a_tensor_is_a_type_error(kv, buffers, method, arguments, match):
    tokens, gather = pad_rows(random_rows([3, 1], seed=13), kv.config, bucket=True)
    with pytest.raises(TypeError, match=match):
        getattr(kv, method)(*arguments(buffers, tokens, gather))


# --- grad mode --------------------------------------------------------------------------------


def decode(kv: KVDecoder, memory: Tensor, mask: Tensor) -> tuple[list[Tensor], StepBuffers]:
    """load_target, prefill and two steps on fresh buffers, in the caller's grad mode."""
    buffers = kv.new_buffers(StepKey(2, 64, memory.shape[1]), torch.float32)
    tokens, gather = pad_rows(random_rows([3, 1], seed=14), kv.config, bucket=True)
    kv.load_target(buffers, memory, mask)
    logits = [kv.prefill(buffers, tokens, gather)]
    for position in (3, 4):
        buffers.inputs.copy_(torch.tensor([[7, 8], [position, position - 2]]))
        logits.append(kv.step(buffers))
    return logits, buffers


def test_outside_no_grad_the_kv_decoder_computes_the_same_and_tracks_nothing(tiny_decoder, target):
    memory, mask = pad_memory(*target)
    kv = KVDecoder(tiny_decoder)
    with torch.no_grad():
        expected, expected_buffers = decode(kv, memory, mask)
    with torch.enable_grad():
        got, buffers = decode(kv, memory, mask)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b) and not a.requires_grad
    for name in ("inputs", "cache", "cross", "cross_mask"):
        assert torch.equal(getattr(buffers, name), getattr(expected_buffers, name))
        assert not getattr(buffers, name).requires_grad, name
    assert any(p.requires_grad for p in tiny_decoder.parameters())  # grads were possible
