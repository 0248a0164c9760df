"""StepGraphCache without a GPU: what its constructor refuses, and a slot used after its graph
was released (on a fake of torch.cuda)."""

from __future__ import annotations

import pytest
import torch
from cache_recorders import RecordingSteps

from reasyn_ref import KVDecoder, StepGraphCache, StepKey


@pytest.fixture
def kv(tiny_decoder) -> KVDecoder:
    return KVDecoder(tiny_decoder)


def test_the_step_graph_cache_refuses_what_it_cannot_capture(kv, monkeypatch):
    with pytest.raises(TypeError, match=r"^kv must be a KVDecoder, got Decoder"):
        StepGraphCache(kv.decoder)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"^StepGraphCache needs CUDA"):
        StepGraphCache(kv)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="needs the decoder on a CUDA device, it is on cpu"):
        StepGraphCache(kv)


@pytest.mark.parametrize("name", ["capacity", "warmups"])
@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (True, TypeError), ("3", TypeError)])
def test_capacity_and_warmups_must_be_positive_ints(kv, name, value, error):
    with pytest.raises(error, match=rf"^{name} must be an int >= 1, got {value!r}"):
        StepGraphCache(kv, **{name: value})


@pytest.mark.parametrize(("key", "error"), [(StepKey(0, 64, 64), ValueError), ((2, 64), TypeError)])
def test_a_claim_refuses_a_bad_key_before_building(fake_cuda, key, error):
    cache = RecordingSteps(fake_cuda, capacity=2)
    with pytest.raises(error, match=r"^key"), cache.claim(key):
        pass
    assert cache.calls == [] and cache.keys() == []


def test_a_slot_used_after_its_claim_was_released_is_refused(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=2)
    with cache.claim(StepKey(2, 64, 64)) as slot:
        with pytest.raises(ValueError, match=r"^rows must be an int in \[1, Bb=2\], got 3"):
            slot.step(3)
        with pytest.raises(TypeError, match=r"^rows must be an int in \[1, Bb=2\], got True"):
            slot.step(True)
    cache.clear()
    with pytest.raises(RuntimeError, match="this step graph was released"):
        slot.step(1)
