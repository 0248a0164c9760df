"""GraphCache without a GPU: the cache's checks of a step, its stages, the constructor guards,
and a call's orchestration on a fake of torch.cuda (stages in order, build on a new key only,
failures that leave the cache consistent, replays counted where the graph replays)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from cache_recorders import RELEASE, RecordingCache
from step_inputs import CONFIG, KEYED_SHAPES, replaced, step_inputs
from torch import nn

from pytest_cudagraph.engines.state import load_state, module_state, state_differences
from reasyn_ref import ARStep, Decoder
from reasyn_ref.graph_cache import GraphCache, GraphKey, check_graph_step, graph_step_module
from reasyn_ref.lean import LeanDecoder

CPU = torch.device("cpu")

# --- input checks --------------------------------------------------------------------------


def check(inputs, device=CPU, memory_dtype=torch.float32):
    return check_graph_step(CONFIG, device, memory_dtype, ARStep(**inputs))


@pytest.mark.parametrize(
    ("shape", "expected"),
    KEYED_SHAPES,
)
def test_the_cache_keys_a_step_on_its_shapes_and_layout(shape, expected):
    assert check(step_inputs(**shape)) == expected == ARStep(**step_inputs(**shape)).key


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


@pytest.mark.parametrize("decoder", [nn.Identity(), nn.Linear(2, 2)], ids=["Identity", "Linear"])
def test_what_is_not_a_decoder_is_refused(decoder, cuda_reported_available):
    with pytest.raises(TypeError, match=r"^decoder must be a reasyn_ref Decoder, got"):
        GraphCache(decoder, "cuda:0")


@pytest.mark.parametrize(
    ("device", "error"),
    [(1.5, TypeError), (None, TypeError), (True, TypeError), ("gpu", ValueError), (-1, ValueError)],
)
def test_a_device_that_is_not_one_is_refused_naming_it(tiny_decoder, device, error):
    with pytest.raises(error, match=r"^device must be a torch.device, a device string or an"):
        GraphCache(tiny_decoder, device)


@pytest.mark.parametrize("name", ["capacity", "warmups"])
@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_capacity_and_warmups_must_be_positive_ints(tiny_decoder, name, value, error):
    with pytest.raises(error, match=rf"{name} must be an int >= 1, got {value!r}"):
        GraphCache(tiny_decoder, "cuda:0", **{name: value})


# --- what the graphs run ------------------------------------------------------------------


def storages(module: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


@pytest.mark.parametrize("lean", [False, True], ids=["exact", "lean"])
def test_the_graph_step_module_is_a_copy_of_its_own_alike_to_another(tiny_decoder, lean):
    """What the module-state check relies on: the eager side's copy and the cache's take each
    other's state piece by piece, and neither shares memory with the decoder or the other."""
    one, two = (graph_step_module(tiny_decoder, lean=lean) for _ in range(2))
    assert isinstance(one, LeanDecoder if lean else Decoder) and one is not tiny_decoder
    assert not storages(one) & storages(two) and not storages(one) & storages(tiny_decoder)
    if not lean:  # the bf16 matmul copy (with_bf16_matmul_weights)
        assert one.head[-1].weight.dtype == torch.bfloat16
    load_state(two, module_state(one))  # fits: ValueError on any path, shape or dtype apart


@pytest.mark.parametrize("lean", [False, True], ids=["exact", "lean"])
def test_the_graph_step_keeps_no_state_however_often_it_runs(tiny_decoder, lean):
    """A cache builds a graph by running the step four times (three warm-ups, the capture):
    the copy that ran four times ends in the state of one that ran once."""
    built, called = (graph_step_module(tiny_decoder, lean=lean) for _ in range(2))
    step = ARStep(**step_inputs(batch=4, rows=3))
    # On the CPU the exact step's bf16 autocast is not on by itself (``model.step_context``).
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
    with torch.no_grad(), contextlib.nullcontext() if lean else autocast:
        for module in (built,) * 4 + (called,):
            module(step.tokens, step.memory, step.memory_padding_mask, step.gather)
    assert state_differences(module_state(called), module_state(built)) == []


# --- a call, on a fake of torch.cuda -------------------------------------------------------


def cpu_step(batch: int) -> ARStep:
    return ARStep(**step_inputs(batch=batch, rows=1))


def test_a_call_runs_the_stages_in_order_building_only_on_a_new_key(fake_cuda):
    cache = RecordingCache(fake_cuda, capacity=2)
    assert cache(cpu_step(4)).shape == (1, CONFIG.vocab_size)
    assert cache.calls == ["warm_up", "capture", "replay", "copy_out"]
    cache.calls.clear()
    cache(cpu_step(4))
    assert cache.calls == ["replay", "copy_out"]
    cache(cpu_step(2))
    cache.calls.clear()
    cache(cpu_step(8))  # a third key in a cache of 2: the oldest (batch 4) goes, memory released
    assert cache.calls == ["warm_up", "capture", *RELEASE, "replay", "copy_out"]
    assert [key.batch for key in cache.keys()] == [2, 8]
    assert (cache.stats.captures, cache.stats.hits, cache.stats.replays) == (3, 1, 4)
    assert cache.stats.evictions == 1


def test_a_call_refreshes_every_input_the_graph_reads(fake_cuda):
    cache = RecordingCache(fake_cuda, capacity=2)
    step = cpu_step(4)
    cache(step)
    [entry] = [cache.entries.get(key) for key in cache.keys()]
    assert torch.equal(entry.tokens, step.tokens) and torch.equal(entry.gather, step.gather)
    assert torch.equal(entry.memory, step.memory[:1])  # a shared memory is staged as one row
    assert torch.equal(entry.memory_padding_mask, step.memory_padding_mask)


def test_a_call_takes_an_ar_step_only(fake_cuda):
    cache = RecordingCache(fake_cuda, capacity=2)
    inputs = step_inputs()
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 5 were given"):
        cache(inputs["tokens"], inputs["memory"], inputs["memory_padding_mask"], inputs["gather"])
    with pytest.raises(TypeError, match=r"^step must be an ARStep, got Tensor"):
        cache(inputs["tokens"])
    with pytest.raises(TypeError, match=r"^step must be an ARStep, got dict"):
        cache(inputs)
    assert cache.calls == [] and cache.keys() == []


def test_a_replay_that_skips_the_graph_is_not_counted(fake_cuda):
    class Bypassing(RecordingCache):
        """Refreshes the inputs and returns the last output without replaying the graph."""

        def replay(self, entry, step):
            self.record("replay")

    cache = Bypassing(fake_cuda, capacity=2)
    cache(cpu_step(4))
    cache(cpu_step(4))
    assert cache.calls.count("replay") == 2 and cache.stats.replays == 0


@pytest.mark.parametrize("stage", ["warm_up", "capture"])
def test_a_failed_build_is_released_never_stored_and_frees_the_lock(fake_cuda, stage):
    cache = RecordingCache(fake_cuda, capacity=2, fail_at=stage)
    with pytest.raises(RuntimeError, match=f"injected at {stage}"):
        cache(cpu_step(4))
    assert cache.calls[-len(RELEASE) :] == RELEASE and "replay" not in cache.calls
    assert cache.keys() == [] and cache.stats.captures == 0 and not cache.lock.locked()


@pytest.mark.parametrize(("stage", "replays"), [("replay", 1), ("copy_out", 2)])
def test_a_failed_replay_keeps_the_entry_and_frees_the_lock(fake_cuda, stage, replays):
    cache = RecordingCache(fake_cuda, capacity=2)
    cache(cpu_step(4))
    cache.fail_at = stage
    with pytest.raises(RuntimeError, match=f"injected at {stage}"):
        cache(cpu_step(4))
    assert [key.batch for key in cache.keys()] == [4] and not cache.lock.locked()
    assert "reset" not in cache.calls
    assert cache.stats.replays == replays  # a replay stage that failed first replayed nothing
