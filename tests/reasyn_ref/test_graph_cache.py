"""GraphCache without a GPU: the LRU policy, ARStep and the cache's input checks, the
constructor guards and the stages' public contract."""

from __future__ import annotations

import pytest
import torch
from cache_recorders import RecordingCache
from torch import nn

from reasyn_ref import ARStep, Decoder, DecoderConfig
from reasyn_ref.capture_cache import LRU
from reasyn_ref.graph_cache import (
    GraphCache,
    GraphKey,
    check_graph_inputs,
    check_graph_step,
)

CONFIG = DecoderConfig.tiny()
CPU = torch.device("cpu")

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


# --- input checks --------------------------------------------------------------------------


def step_inputs(batch=4, seq=64, memory_len=64, rows=3, mask=True, expanded=True):
    """A valid bucketed step on the CPU: memory expanded from one target, as the sampler does."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, CONFIG.vocab_size, (batch, seq), generator=generator)
    memory = torch.randn(1 if expanded else batch, memory_len, CONFIG.d_model, generator=generator)
    memory = memory.expand(batch, -1, -1)
    padding = torch.zeros(batch, memory_len, dtype=torch.bool) if mask else None
    gather = torch.zeros(batch, dtype=torch.long)
    return {
        "tokens": tokens,
        "memory": memory,
        "memory_padding_mask": padding,
        "gather": gather,
        "rows": rows,
    }


def check(inputs, device=CPU, memory_dtype=torch.float32):
    return check_graph_step(CONFIG, device, memory_dtype, ARStep(**inputs))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (dict(batch=4, seq=64, memory_len=64), GraphKey(4, 64, 64, True, True)),
        (dict(batch=1, seq=128, memory_len=256, rows=1), GraphKey(1, 128, 256, True, False)),
        (dict(batch=8, seq=512, memory_len=192, mask=False), GraphKey(8, 512, 192, False, True)),
        (dict(batch=2, rows=2, expanded=False), GraphKey(2, 64, 64, True, False)),
    ],
)
def test_the_key_holds_every_shape_and_layout_the_forward_depends_on(shape, expected):
    assert check(step_inputs(**shape)) == expected
    assert ARStep(**step_inputs(**shape)).key == expected


def test_a_memory_is_shared_only_when_one_row_is_viewed_over_the_batch():
    inputs = step_inputs(batch=4)
    assert check(inputs).shared_memory
    inputs["memory"] = inputs["memory"].contiguous()  # the same values, one row each
    assert not check(inputs).shared_memory
    assert GraphKey(4, 64, 64, True) == GraphKey(4, 64, 64, True, False)


def test_the_loose_form_before_ar_step_gives_the_same_key():
    inputs = step_inputs()
    loose = [inputs[name] for name in ("tokens", "memory", "memory_padding_mask", "gather")]
    key = check_graph_inputs(CONFIG, CPU, torch.float32, *loose, rows=inputs["rows"])
    assert key == check(inputs)
    with pytest.raises(TypeError, match=r"pass an ARStep alone"):
        check_graph_inputs(CONFIG, CPU, torch.float32, ARStep(**inputs), rows=3)
    with pytest.raises(TypeError, match=r"expected an ARStep, or tokens"):
        check_graph_inputs(CONFIG, CPU, torch.float32, *loose)


def test_a_step_moved_to_another_device_keeps_its_layout():
    step = ARStep(**step_inputs())
    moved = step.to("meta")
    assert moved.device == torch.device("meta") and moved.rows == step.rows
    assert moved.key == step.key  # the expanded memory is still one target's


def replaced(name, value, **shape):
    inputs = step_inputs(**shape)
    inputs[name] = value(inputs) if callable(value) else value
    return inputs


# A malformed step, whatever it runs on: ARStep refuses it.
@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        (replaced("gather", None), ValueError, r"gather is required"),
        (
            replaced("tokens", lambda i: i["tokens"].int()),
            ValueError,
            r"tokens must be a torch.long tensor",
        ),
        (replaced("tokens", [[1, 2]]), TypeError, r"tokens must be a torch.long tensor, got list"),
        (
            replaced("gather", lambda i: i["gather"].int()),
            ValueError,
            r"gather must be a torch.long tensor",
        ),
        (
            replaced("memory_padding_mask", lambda i: i["memory_padding_mask"].float()),
            ValueError,
            r"memory_padding_mask must be a torch.bool tensor",
        ),
        (
            replaced("memory", lambda i: i["memory"].to("meta")),
            ValueError,
            r"memory is on meta but tokens are on cpu",
        ),
        (
            replaced("gather", lambda i: i["gather"].to("meta")),
            ValueError,
            r"gather is on meta but tokens are on cpu",
        ),
        (
            replaced("memory", lambda i: i["memory"][:2]),
            ValueError,
            r"memory must be \[B=4, M >= 1, d\]",
        ),
        (
            replaced("memory", lambda i: i["memory"][:, :0]),
            ValueError,
            r"memory must be \[B=4, M >= 1, d\]",
        ),
        (replaced("rows", 0), ValueError, r"rows must be an int in \[1, B=4\], got 0"),
        (replaced("rows", 5), ValueError, r"rows must be an int in \[1, B=4\], got 5"),
        (replaced("rows", True), TypeError, r"rows must be an int in \[1, B=4\], got True"),
        (replaced("rows", 2.0), TypeError, r"rows must be an int in \[1, B=4\], got 2.0"),
    ],
)
def test_a_malformed_step_is_refused_with_the_rule_it_breaks(inputs, error, message):
    with pytest.raises(error, match=message):
        ARStep(**inputs)


# A well-formed step that no graph of this cache can run.
@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            replaced("memory", lambda i: i["memory"].double()),
            r"memory must be torch.float32 \(the decoder's parameter dtype\), got torch.float64",
        ),
        (
            replaced("memory", lambda i: torch.zeros(4, 64, 16)),
            r"memory must be \[B, M, d_model=32\]",
        ),
        (
            step_inputs(batch=3),
            r"tokens batch 3 is not a batch bucket \(a power of two; see bucket_batch\)",
        ),
        (
            step_inputs(seq=100),
            r"tokens length 100 is not a sequence bucket \(a multiple of 64 or max_len=512",
        ),
        (
            step_inputs(seq=576),
            r"tokens length 576 is not a sequence bucket",
        ),
        (
            step_inputs(memory_len=50),
            r"memory length 50 is not a memory bucket \(a positive multiple of 64\)",
        ),
    ],
)
def test_a_step_no_graph_runs_is_refused_with_the_rule_it_breaks(inputs, message):
    with pytest.raises(ValueError, match=message):
        check(inputs)


def test_inputs_on_another_device_than_the_cache_are_refused():
    with pytest.raises(ValueError, match=r"tokens are on cpu; the graph cache is bound to cuda:1"):
        check(step_inputs(), device=torch.device("cuda", 1))


def test_memory_must_have_the_decoders_dtype():
    inputs = step_inputs()
    assert check(inputs, memory_dtype=torch.float32) == GraphKey(4, 64, 64, True, True)
    with pytest.raises(ValueError, match=r"memory must be torch.bfloat16"):
        check(inputs, memory_dtype=torch.bfloat16)


# --- stages --------------------------------------------------------------------------------


def test_the_stages_are_public_methods_in_call_order():
    assert GraphCache.STAGES == ("warm_up", "capture", "replay", "copy_out")
    for stage in (*GraphCache.STAGES, "static_step"):
        assert callable(getattr(GraphCache, stage)), stage
        assert not stage.startswith("_")


# --- constructor guards --------------------------------------------------------------------


@pytest.fixture
def cuda_reported_available(monkeypatch):
    """Reach the guards past the CUDA check on a machine without CUDA; the guards under test
    fail before anything touches CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_without_cuda_the_cache_refuses_to_build(tiny_decoder, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        RuntimeError, match=r"^GraphCache needs CUDA: torch.cuda.is_available\(\) is False$"
    ):
        GraphCache(tiny_decoder, "cuda:0")


def test_a_decoder_on_the_cpu_is_refused(tiny_decoder, cuda_reported_available):
    with pytest.raises(
        ValueError,
        match=r"GraphCache needs the decoder on a CUDA device; its parameters are on cpu",
    ):
        GraphCache(tiny_decoder, "cuda:0")


def test_a_decoder_on_the_meta_device_is_refused(cuda_reported_available):
    decoder = Decoder(CONFIG).to("meta")
    with pytest.raises(ValueError, match=r"its parameters are on meta"):
        GraphCache(decoder, "cuda:0")


def test_a_decoder_without_parameters_is_refused(cuda_reported_available):
    with pytest.raises(ValueError, match=r"decoder has no parameters"):
        GraphCache(nn.Identity(), "cuda:0")


@pytest.mark.parametrize("name", ["capacity", "warmups"])
@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_capacity_and_warmups_must_be_positive_ints(tiny_decoder, name, value, error):
    with pytest.raises(error, match=rf"{name} must be an int >= 1, got {value!r}"):
        GraphCache(tiny_decoder, "cuda:0", **{name: value})


def cpu_step(batch: int) -> ARStep:
    return ARStep(**step_inputs(batch=batch, rows=1))


def test_a_call_runs_the_stages_in_order_building_only_on_a_new_key(no_cuda_context):
    cache = RecordingCache(capacity=2)
    assert cache(cpu_step(4)).shape == (1, CONFIG.vocab_size)
    assert cache.calls == ["warm_up", "capture", "replay", "copy_out"]
    cache.calls.clear()
    cache(cpu_step(4))
    assert cache.calls == ["replay", "copy_out"]
    cache(cpu_step(2))
    cache.calls.clear()
    cache(cpu_step(8))  # a third key in a cache of 2: the oldest (batch 4) goes
    assert cache.calls == ["warm_up", "capture", "release 4", "replay", "copy_out"]
    assert [key.batch for key in cache.keys()] == [2, 8]
    assert (cache.stats.captures, cache.stats.hits, cache.stats.replays) == (3, 1, 4)
    assert cache.stats.evictions == 1


@pytest.mark.parametrize("stage", ["warm_up", "capture"])
def test_a_failed_build_is_discarded_never_stored_and_frees_the_lock(no_cuda_context, stage):
    cache = RecordingCache(capacity=2, fail_at=stage)
    with pytest.raises(RuntimeError, match=f"injected at {stage}"):
        cache(cpu_step(4))
    assert cache.calls[-1] == "discard" and "replay" not in cache.calls
    assert cache.keys() == [] and cache.stats.captures == 0 and not cache.lock.locked()


@pytest.mark.parametrize("stage", ["replay", "copy_out"])
def test_a_failed_replay_keeps_the_entry_and_frees_the_lock(no_cuda_context, stage):
    cache = RecordingCache(capacity=2)
    cache(cpu_step(4))
    cache.fail_at = stage
    with pytest.raises(RuntimeError, match=f"injected at {stage}"):
        cache(cpu_step(4))
    assert [key.batch for key in cache.keys()] == [4] and not cache.lock.locked()
    assert "discard" not in cache.calls
