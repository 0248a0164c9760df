"""reasyn_ref.capture_cache without a GPU: the settings every graph cache checks first, and the shared
orchestration (build on first use, LRU eviction, discard of a failed build, the lock) as
StepGraphCache runs it; test_graph_cache.py covers it as GraphCache runs it."""

from __future__ import annotations

import pytest
import torch
from cache_recorders import RecordingSteps

from reasyn_ref import StepGraphCache, StepKey
from reasyn_ref.capture_cache import check_capture_settings
from reasyn_ref.kv_graphs import StepGraph


@pytest.mark.parametrize("name", ["capacity", "warmups"])
@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_capacity_and_warmups_are_counts(name, value, error):
    settings = {"capacity": 3, "warmups": 3, name: value}
    with pytest.raises(error, match=rf"{name} must be an int >= 1, got {value!r}"):
        check_capture_settings("SomeCache", **settings)


def test_without_cuda_the_error_names_the_cache(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"^SomeCache needs CUDA: torch\.cuda\.is_available"):
        check_capture_settings("SomeCache", 3, 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_capture_settings("SomeCache", 3, 3)  # valid settings with CUDA: no error


def claim(cache: StepGraphCache, batch: int) -> StepGraph:
    with cache.claim(StepKey(batch, 64, 64)) as slot:
        assert cache.lock.locked()  # the claim holds the lock for the whole target
        return slot


def test_a_claim_builds_only_on_a_new_key_and_evicts_the_oldest(no_cuda_context):
    cache = RecordingSteps(capacity=2)
    first = claim(cache, 4)
    assert cache.calls == ["warm_up", "capture"]
    assert claim(cache, 4) is first and cache.calls == ["warm_up", "capture"]
    claim(cache, 2)
    cache.calls.clear()
    claim(cache, 8)  # a third key in a cache of 2: the oldest (batch 4) goes
    assert cache.calls == ["warm_up", "capture", "release 4"]
    assert [key.batch for key in cache.keys()] == [2, 8] and not cache.lock.locked()
    assert (cache.stats.captures, cache.stats.hits, cache.stats.evictions) == (3, 1, 1)
    assert set(cache.stats.capture_seconds) == {StepKey(b, 64, 64) for b in (4, 2, 8)}


@pytest.mark.parametrize("stage", ["warm_up", "capture"])
def test_a_failed_build_is_discarded_never_stored_and_frees_the_lock(no_cuda_context, stage):
    cache = RecordingSteps(capacity=2, fail_at=stage)
    with pytest.raises(RuntimeError, match=f"injected at {stage}"):
        claim(cache, 4)
    assert cache.calls[-1] == "discard"
    assert cache.keys() == [] and cache.stats.captures == 0 and not cache.lock.locked()


def test_clear_state_zeroes_every_buffer_and_keeps_the_keys_in_order(no_cuda_context):
    cache = RecordingSteps(capacity=3)
    slots = [claim(cache, batch) for batch in (1, 2)]
    for slot in slots:
        for tensor in vars(slot.buffers).values():
            if isinstance(tensor, torch.Tensor):
                tensor.fill_(1)
    cache.clear_state()
    assert [key.batch for key in cache.keys()] == [1, 2]
    for slot in slots:
        buffers = slot.buffers
        for tensor in (buffers.inputs, buffers.cache, buffers.cross, buffers.cross_mask):
            assert not tensor.any()
    assert cache.stats.captures == 2 and not cache.lock.locked()
