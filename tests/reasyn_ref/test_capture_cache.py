"""reasyn_ref.capture_cache without a GPU: the LRU policy, the settings every graph cache checks
first, the stages both caches share, and the shared orchestration (build on first use, LRU
eviction, discard and release of a failed build, replay counting, the lock) as StepGraphCache
runs it on a fake of torch.cuda; test_graph_cache.py covers it as GraphCache runs it."""

from __future__ import annotations

import pytest
import torch
from cache_recorders import RELEASE, RecordingSteps

from reasyn_ref import GraphCache, StepGraphCache, StepKey
from reasyn_ref.capture_cache import LRU, CaptureCache, check_capture_settings, live
from reasyn_ref.kv_decoder import claimed
from reasyn_ref.kv_graphs import StepGraph

# --- LRU policy ----------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used_first():
    lru: LRU[str, int] = LRU(3)
    assert lru.put("a", 1) == []
    assert lru.put("b", 2) == []
    assert lru.put("c", 3) == []
    assert lru.get("a") == 1  # a becomes the most recent; b is now the oldest
    assert lru.put("d", 4) == [("b", 2)]
    assert lru.keys() == ["c", "a", "d"]
    assert lru.put("e", 5) == [("c", 3)]
    assert lru.keys() == ["a", "d", "e"]
    assert len(lru) == 3 and "c" not in lru and "a" in lru


def test_lru_put_of_a_present_key_replaces_it_and_makes_it_most_recent():
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.put("a", 10) == []
    assert lru.keys() == ["b", "a"]
    assert lru.get("a") == 10


def test_lru_values_are_oldest_first_and_leave_the_order_alone():
    lru: LRU[str, int] = LRU(3)
    for value, key in enumerate("abc"):
        lru.put(key, value)
    assert lru.values() == [0, 1, 2]
    assert lru.keys() == ["a", "b", "c"]


def test_a_released_part_of_an_entry_is_refused_by_name_and_a_live_one_passes():
    assert live(0) == 0  # a falsy part is still there
    with pytest.raises(RuntimeError, match="this graph entry was released"):
        live(None)


def test_a_released_step_graph_refuses_its_buffers(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=1)
    first = claim(cache, 4)
    claim(cache, 2)  # evicts the first
    with pytest.raises(RuntimeError, match="this step slot was released"):
        claimed(first)


def test_lru_get_of_a_missing_key_changes_nothing():
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("z") is None
    assert lru.keys() == ["a", "b"]


def test_lru_of_capacity_one_keeps_only_the_newest():
    lru: LRU[str, int] = LRU(1)
    lru.put("a", 1)
    assert lru.put("b", 2) == [("a", 1)]
    assert lru.keys() == ["b"]


def test_lru_pop_all_empties_it_oldest_first():
    lru: LRU[str, int] = LRU(3)
    for value, key in enumerate("abc"):
        lru.put(key, value)
    lru.get("a")
    assert lru.pop_all() == [("b", 1), ("c", 2), ("a", 0)]
    assert lru.keys() == [] and len(lru) == 0


@pytest.mark.parametrize(
    ("capacity", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("3", TypeError)],
)
def test_lru_capacity_must_be_a_positive_int(capacity, error):
    with pytest.raises(error, match=r"capacity must be an int >= 1"):
        LRU(capacity)


# --- settings ------------------------------------------------------------------------------


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


# --- stages ----------------------------------------------------------------------------------


def test_both_caches_run_the_shared_stages_and_graph_cache_adds_copy_out():
    assert CaptureCache.STAGES == ("warm_up", "capture", "replay")
    assert StepGraphCache.STAGES == CaptureCache.STAGES
    assert GraphCache.STAGES == (*CaptureCache.STAGES, "copy_out")
    for cache in (StepGraphCache, GraphCache):
        for stage in (*cache.STAGES, "static_step", "new_entry"):
            assert callable(getattr(cache, stage)) and not stage.startswith("_"), stage


# --- orchestration, as StepGraphCache runs it ------------------------------------------------


def claim(cache: StepGraphCache, batch: int) -> StepGraph:
    with cache.claim(StepKey(batch, 64, 64)) as slot:
        assert cache.lock.locked()  # the claim holds the lock for the whole target
        return slot


def test_a_claim_builds_only_on_a_new_key_and_evicts_the_oldest(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=2)
    first = claim(cache, 4)
    assert cache.calls == ["warm_up", "capture"]
    assert claim(cache, 4) is first and cache.calls == ["warm_up", "capture"]
    claim(cache, 2)
    cache.calls.clear()
    claim(cache, 8)  # a third key in a cache of 2: the oldest (batch 4) goes, memory released
    assert cache.calls == ["warm_up", "capture", *RELEASE]
    assert first.graph is None and first.buffers is None
    assert [key.batch for key in cache.keys()] == [2, 8] and not cache.lock.locked()
    assert (cache.stats.captures, cache.stats.hits, cache.stats.evictions) == (3, 1, 1)
    assert set(cache.stats.capture_seconds) == {StepKey(b, 64, 64) for b in (4, 2, 8)}


@pytest.mark.parametrize("stage", ["warm_up", "capture"])
def test_a_failed_build_is_released_never_stored_and_frees_the_lock(fake_cuda, stage):
    cache = RecordingSteps(fake_cuda, capacity=2, fail_at=stage)
    with pytest.raises(RuntimeError, match=f"injected at {stage}"):
        claim(cache, 4)
    assert cache.calls[-len(RELEASE) :] == RELEASE
    assert cache.keys() == [] and cache.stats.captures == 0 and not cache.lock.locked()


def test_a_capture_left_open_is_ended_before_the_entry_is_released(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=2)
    fake_cuda.end_capture_fails = True
    with pytest.raises(RuntimeError, match="ending the capture failed"):
        claim(cache, 4)
    assert cache.calls == ["warm_up", "capture", "capture_end", *RELEASE]
    assert not fake_cuda.capturing and cache.keys() == []


def test_replays_are_counted_where_the_graph_replays(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=2)
    with cache.claim(StepKey(2, 64, 64)) as slot:
        for _ in range(3):
            assert slot.step(2).shape == (2, cache.kv.config.vocab_size)
        assert cache.stats.replays == slot.graph.replays == 3
        cache.fail_at = "replay"  # a replay stage that fails before the graph runs
        with pytest.raises(RuntimeError, match="injected at replay"):
            slot.step(2)
    assert cache.stats.replays == slot.graph.replays == 3


def test_clear_state_zeroes_every_buffer_and_keeps_the_keys_in_order(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=3)
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


def test_clear_releases_every_entry_and_keeps_the_cache_usable(fake_cuda):
    cache = RecordingSteps(fake_cuda, capacity=3)
    slots = [claim(cache, batch) for batch in (1, 2)]
    cache.calls.clear()
    cache.clear()
    assert cache.calls == ["synchronize", "reset", "reset", "empty_cache"]
    assert cache.keys() == [] and all(slot.graph is None for slot in slots)
    assert claim(cache, 1).graph is not None and cache.stats.captures == 3
