"""The shared workloads: each lands where it says, and a seed always gives the same values."""

from __future__ import annotations

import pytest
import torch

from reasyn_ref import ARStep, DecoderConfig, GraphKey, bucket_batch
from reasyn_ref.workloads import random_prefixes, random_step, target_memory

CONFIG = DecoderConfig.tiny()
KEYS = [
    GraphKey(1, 64, 64, True),
    GraphKey(2, 128, 64, True, shared_memory=True),
    GraphKey(4, 64, 128, False, shared_memory=True),
    GraphKey(8, 192, 64, True),
    GraphKey(16, 512, 256, True, shared_memory=True),
]


def same_step(a: ARStep, b: ARStep) -> bool:
    names = ("tokens", "memory", "memory_padding_mask", "gather")
    return a.rows == b.rows and all(
        (getattr(a, n) is None and getattr(b, n) is None)
        or torch.equal(getattr(a, n), getattr(b, n))
        for n in names
    )


@pytest.mark.parametrize("key", KEYS, ids=str)
def test_a_random_step_lands_in_its_key_in_the_samplers_layout(key):
    for seed in range(5):
        step = random_step(CONFIG, key, seed=seed)
        assert step.key == key
        assert bucket_batch(step.rows) == key.batch
        real = step.tokens[: step.rows]
        assert (real[:, 0] == CONFIG.start_token).all()
        lengths = step.gather[: step.rows] + 1
        assert int(lengths.max()) > key.seq - 64 or key.seq == 64
        for row, length in zip(real, lengths.tolist(), strict=True):
            assert (row[length:] == CONFIG.pad_token).all()
            assert not torch.isin(row[1:length], torch.tensor([0, 1, 2])).any()
        if key.has_mask:
            assert not step.memory_padding_mask.all(dim=1).any(), "a row with no real memory"


def test_a_seed_gives_the_same_step_and_another_seed_another():
    key = KEYS[1]
    assert same_step(random_step(CONFIG, key, seed=3), random_step(CONFIG, key, seed=3))
    assert not same_step(random_step(CONFIG, key, seed=3), random_step(CONFIG, key, seed=4))


def test_rows_may_be_chosen_within_the_batch_bucket():
    assert random_step(CONFIG, GraphKey(8, 64, 64, True, True), seed=0, rows=8).rows == 8
    key = GraphKey(8, 64, 64, True, True)
    assert random_step(CONFIG, key, seed=0, rows=5).rows == 5  # the fewest that bucket to 8
    with pytest.raises(ValueError, match=r"rows must be an int in \[5, batch=8\], got 4"):
        random_step(CONFIG, key, seed=0, rows=4)
    with pytest.raises(TypeError, match=r"rows must be an int in \[5, batch=8\], got True"):
        random_step(CONFIG, key, seed=0, rows=True)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (GraphKey(3, 64, 64, True), r"is not bucketed"),
        (GraphKey(4, 100, 64, True), r"is not bucketed"),
        (GraphKey(1, 64, 64, True, shared_memory=True), r"a shared memory needs batch > 1"),
    ],
)
def test_a_key_no_step_can_have_is_refused(key, message):
    with pytest.raises(ValueError, match=message):
        random_step(CONFIG, key, seed=0)


def test_target_memory_pads_its_tail_and_repeats_for_a_seed():
    memory, mask = target_memory(CONFIG, 64, padded=8, seed=1)
    assert memory.shape == (1, 64, CONFIG.d_model) and memory.dtype == torch.float32
    assert mask.tolist() == [[False] * 56 + [True] * 8]
    again, _ = target_memory(CONFIG, 64, padded=8, seed=1)
    assert torch.equal(memory, again)
    assert not torch.equal(memory, target_memory(CONFIG, 64, seed=2)[0])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"padded": 64}, ValueError),
        ({"padded": -1}, ValueError),
        ({"padded": 1.0}, TypeError),
        ({"seed": -1}, ValueError),
    ],
)
def test_target_memory_refuses_bad_arguments(kwargs, error):
    with pytest.raises(error):
        target_memory(CONFIG, 64, **({"seed": 0} | kwargs))


def test_random_prefixes_start_with_start_and_avoid_the_special_tokens():
    prefixes = random_prefixes(CONFIG, [1, 5, 300], torch.Generator().manual_seed(0))
    assert [len(p) for p in prefixes] == [1, 5, 300]
    assert all(p[0] == CONFIG.start_token for p in prefixes)
    drawn = {token for p in prefixes for token in p[1:]}
    assert drawn.isdisjoint({0, 1, 2}) and max(drawn) < CONFIG.vocab_size
