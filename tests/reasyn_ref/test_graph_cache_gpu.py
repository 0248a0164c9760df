"""GraphCache on a GPU, at the default (upstream-sized) config in bf16: bit-identical to the
eager step, fresh answers for new inputs on cached keys, outputs of their own, the LRU, memory
given back, failures that leave nothing behind, threads, device binding, the graphs-on sampler;
and the figures (graph vs eager time, capture seconds) for the lead's report."""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.memory import settle
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import ARSampler, ARStep, Decoder, DecoderConfig
from reasyn_ref.graph_cache import GraphCache, GraphKey
from reasyn_ref.model import ar_step_logits
from reasyn_ref.sampler import pad_rows
from reasyn_ref.workloads import random_prefixes, random_step, seeded_decoder

pytestmark = needs_cuda
needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs 2 CUDA devices: binds a cache to the GPU that is not current",
)

# Keys of the varied cases: every dimension changes; with and without a padding mask; one
# target's memory shared by the batch (as the sampler passes it) and a memory per row.
KEYS = (
    GraphKey(1, 64, 64, True),
    GraphKey(2, 128, 64, True, shared_memory=True),
    GraphKey(4, 64, 128, False, shared_memory=True),
    GraphKey(8, 192, 64, True),
    GraphKey(16, 64, 256, True, shared_memory=True),
)


def eager(decoder: Decoder, step: ARStep) -> Tensor:
    return ar_step_logits(decoder, step, bf16=True)


def graphed(cache: GraphCache, step: ARStep) -> Tensor:
    return cache(step)


# --- the answers ---------------------------------------------------------------------------


def test_graphs_are_bit_identical_to_eager_over_varied_cases(decoder, device):
    cache = GraphCache(decoder, device, capacity=len(KEYS))
    cases = 13 * len(KEYS)  # 65 cases, interleaved so that every cached key sees new inputs
    mismatches = []
    for case in range(cases):
        key = KEYS[case % len(KEYS)]
        step = random_step(decoder.config, key, seed=case, device=device)
        got, want = graphed(cache, step), eager(decoder, step)
        assert got.dtype == torch.float32 and got.shape == (step.rows, decoder.config.vocab_size)
        if not torch.equal(got, want):
            worst = (got - want).abs().max().item()
            mismatches.append(f"case {case} at {key}: max |graph - eager| = {worst:g}")
    assert mismatches == []
    assert (cache.stats.captures, cache.stats.hits) == (len(KEYS), cases - len(KEYS))
    assert cache.stats.replays == cases


def vary(step: ARStep, what: str, config: DecoderConfig) -> ARStep:
    """``step`` with one input changed and everything else, shape and layout included, kept."""
    targets = 1 if step.memory.stride(0) == 0 else step.memory.shape[0]
    if what == "memory":
        memory = torch.randn_like(step.memory[:targets])
        return replace(step, memory=memory.expand_as(step.memory))
    if what == "memory_padding_mask":
        # The first half padded, the second real: position 0 is always real in random_step, and
        # no row is left without a real position (that would give NaN logits).
        padding = torch.zeros_like(step.memory_padding_mask[:targets])
        padding[:, : padding.shape[1] // 2] = True
        return replace(step, memory_padding_mask=padding.expand_as(step.memory_padding_mask))
    if what == "gather":
        gather = step.gather.clone()
        gather[0] = 0 if int(gather[0]) else step.tokens.shape[1] - 1
        return replace(step, gather=gather)
    tokens = step.tokens.clone()
    tokens[0, 0] = config.start_token + 7  # position 0 is seen by every later position
    return replace(step, tokens=tokens)


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared_memory", "memory_per_row"])
@pytest.mark.parametrize("what", ["memory", "memory_padding_mask", "gather", "tokens"])
def test_a_new_input_on_a_cached_key_gives_the_new_answer(decoder, device, what, shared_memory):
    """Upstream baked the encoder memory into its graphs: a new target with a cached shape got
    the old target's logits. Every input the forward reads must be refreshed on each call."""
    cache = GraphCache(decoder, device)
    key = GraphKey(4, 64, 64, True, shared_memory)
    step = random_step(decoder.config, key, seed=1, device=device)
    first = graphed(cache, step)
    changed = vary(step, what, decoder.config)
    again = graphed(cache, changed)
    assert cache.keys() == [key] and cache.stats.hits == 1
    assert torch.equal(again, eager(decoder, changed))
    assert not torch.equal(again, first), f"changing {what} changed nothing: a stale answer"


def test_an_output_is_unchanged_by_later_replays(decoder, device):
    cache = GraphCache(decoder, device)
    key = GraphKey(8, 64, 64, True)
    kept = graphed(cache, random_step(decoder.config, key, seed=0, device=device))
    copy = kept.clone()
    for seed in range(1, 5):
        graphed(cache, random_step(decoder.config, key, seed=seed, device=device))
    assert cache.stats.replays == 5
    assert torch.equal(kept, copy)


@pytest.mark.parametrize("lean", [False, True], ids=["exact", "lean"])
def test_the_graph_module_is_what_the_graphs_run(decoder, device, lean):
    """``graph_module`` is the module whose memory a replay reads: a weight changed in it in
    place reaches a graph captured before the change, and the decoder is not that module."""
    cache = GraphCache(decoder, device, lean=lean)
    module = cache.graph_module
    assert module is not decoder
    step = random_step(decoder.config, GraphKey(4, 64, 64, True), seed=3, device=device)
    before = graphed(cache, step)
    assert torch.equal(before, ar_step_logits(module, step, bf16=not lean))
    bias = module.head[-1] if lean else module.head[-1].bias  # the logits' bias
    with torch.no_grad():
        bias += 1.0
    after = graphed(cache, step)
    assert cache.stats.captures == 1
    assert torch.equal(after, ar_step_logits(module, step, bf16=not lean))
    assert not torch.equal(after, before)


# --- the LRU and memory --------------------------------------------------------------------


def test_the_lru_keeps_the_most_recent_keys(decoder, device):
    cache = GraphCache(decoder, device, capacity=3)
    k1, k2, k3, k4 = KEYS[:4]

    def call(key: GraphKey, seed: int) -> None:
        step = random_step(decoder.config, key, seed=seed, device=device)
        assert torch.equal(graphed(cache, step), eager(decoder, step))

    for seed, key in enumerate((k1, k2, k3, k4)):
        call(key, seed)
    assert cache.keys() == [k2, k3, k4]
    assert (cache.stats.captures, cache.stats.evictions, cache.stats.hits) == (4, 1, 0)
    call(k2, 10)  # a hit makes k2 the most recent
    assert cache.keys() == [k3, k4, k2]
    call(k1, 11)  # captured again; pushes out k3, now the oldest
    assert cache.keys() == [k4, k2, k1]
    assert (cache.stats.captures, cache.stats.evictions, cache.stats.hits) == (5, 2, 1)
    assert set(cache.stats.capture_seconds) == {k1, k2, k3, k4}
    assert all(seconds > 0 for seconds in cache.stats.capture_seconds.values())
    cache.clear()
    assert cache.keys() == []


@pytest.fixture(params=["torch", "nvml"])
def meter(request, device) -> Callable[[int], dict[str, int]]:
    """meter(index) -> this process's memory figures on torch device ``index``: the torch
    allocator's, or NVML's per-process figure (the plugin finds the NVML device by UUID, never
    by index: NVML ignores CUDA_VISIBLE_DEVICES). The NVML meter skips where NVML cannot see
    this process."""
    if request.param == "torch":
        return lambda index: {
            "torch allocated": torch.cuda.memory_allocated(index),
            "torch reserved": torch.cuda.memory_reserved(index),
        }
    status = devices.nvml_status()
    if not status.available:
        pytest.skip(f"NVML is unavailable here: {status.detail}")
    pid = os.getpid()

    def used(index: int) -> int | None:
        handle = devices.nvml_handle(torch.device("cuda", index))
        return devices.process_used_bytes(handle, pid)

    torch.zeros(1, device=device)  # this process now holds a context on `device`
    if used(device.index) is None:
        pytest.skip(
            f"NVML lists no memory for this process (pid {pid}) on {device} (PID namespace?)"
        )
    return lambda index: {"NVML process": used(index) or 0}


def test_memory_goes_back_after_evictions_and_clear(decoder, device, meter):
    """Capacity 1 and two large keys: every call evicts the other graph. Memory must stay at
    one graph's worth however often that happens, and clear() must bring it back to the start."""
    tolerance = 32 * MiB
    cache = GraphCache(decoder, device, capacity=1)
    step_a = random_step(decoder.config, GraphKey(32, 256, 64, True), seed=0, device=device)
    step_b = random_step(decoder.config, GraphKey(16, 256, 128, True), seed=1, device=device)

    def measure() -> dict[str, int]:
        settle(device)
        return meter(device.index)

    # First captures load kernels and give the side stream its cuBLAS workspace, for good.
    graphed(cache, step_a)
    graphed(cache, step_b)
    cache.clear()
    start = measure()
    graphed(cache, step_a)
    one_graph = measure()
    # The graph's pool is reserved, not allocated: at least one figure must see it.
    assert max(one_graph[name] - start[name] for name in start) > 2 * tolerance, one_graph
    for _ in range(4):
        graphed(cache, step_b)
        graphed(cache, step_a)
    cycled = measure()
    assert cache.stats.evictions == 1 + 8
    for name in start:
        growth = (cycled[name] - one_graph[name]) / MiB
        assert cycled[name] <= one_graph[name] + tolerance, f"{name} grew {growth:.1f} MiB"
    cache.clear()
    cleared = measure()
    assert cache.keys() == []
    for name in start:
        left = (cleared[name] - start[name]) / MiB
        assert cleared[name] <= start[name] + tolerance, f"{name}: {left:.1f} MiB not given back"


# --- failures ------------------------------------------------------------------------------


def fails_after(stage: Callable) -> Callable:
    """``stage`` that runs for real, then raises: the GPU work is done, the call still fails."""

    def run_then_raise(*args):
        stage(*args)
        raise RuntimeError("injected failure")

    return run_then_raise


@pytest.mark.parametrize("stage", ["warm_up", "capture"])
def test_a_failed_build_leaves_nothing_and_the_next_call_works(decoder, device, stage):
    cache = GraphCache(decoder, device)
    step = random_step(decoder.config, KEYS[1], seed=0, device=device)
    stream = torch.cuda.current_stream(device)
    setattr(cache, stage, fails_after(getattr(cache, stage)))
    with pytest.raises(RuntimeError, match="injected failure"):
        graphed(cache, step)
    assert cache.keys() == [] and cache.stats.captures == 0
    assert not cache.lock.locked()
    assert torch.cuda.current_stream(device) == stream
    delattr(cache, stage)
    assert torch.equal(graphed(cache, step), eager(decoder, step))
    assert cache.keys() == [KEYS[1]]


def test_a_failure_inside_the_capture_ends_it_and_the_next_call_works(
    decoder, device, failing_inside_capture
):
    cache = GraphCache(decoder, device)
    step = random_step(decoder.config, KEYS[1], seed=0, device=device)
    stream = torch.cuda.current_stream(device)
    cache.static_step = failing_inside_capture(cache.static_step)
    with pytest.raises(RuntimeError, match="injected failure inside the capture"):
        graphed(cache, step)
    assert cache.keys() == [] and not cache.lock.locked()
    assert torch.cuda.current_stream(device) == stream
    assert not torch.cuda.is_current_stream_capturing()
    del cache.static_step
    assert torch.equal(graphed(cache, step), eager(decoder, step))


@pytest.mark.parametrize("stage", ["replay", "copy_out"])
def test_a_failed_replay_keeps_a_valid_entry_and_the_next_call_works(decoder, device, stage):
    cache = GraphCache(decoder, device)
    first, second = (random_step(decoder.config, KEYS[1], seed=s, device=device) for s in (0, 1))
    graphed(cache, first)
    setattr(cache, stage, fails_after(getattr(cache, stage)))
    with pytest.raises(RuntimeError, match="injected failure"):
        graphed(cache, second)  # the static buffers now hold `second`'s inputs
    assert cache.keys() == [KEYS[1]] and not cache.lock.locked()
    delattr(cache, stage)
    assert torch.equal(graphed(cache, first), eager(decoder, first))
    assert cache.stats.captures == 1


# --- threads -------------------------------------------------------------------------------


def test_threads_sharing_a_cache_each_get_their_own_answers(decoder, device):
    cache = GraphCache(decoder, device, capacity=4)
    steps = {
        (thread, i): random_step(decoder.config, KEYS[thread], seed=10 * thread + i, device=device)
        for thread in range(4)
        for i in range(3)
    }
    wanted = {name: eager(decoder, step) for name, step in steps.items()}
    got: dict[tuple[int, int], Tensor] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run(thread: int) -> None:
        try:
            start.wait(timeout=60)
            for i in range(3):
                got[thread, i] = graphed(cache, steps[thread, i])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert all(torch.equal(got[name], wanted[name]) for name in steps)


def test_another_thread_using_cuda_during_a_capture_breaks_neither(decoder, device):
    """capture_error_mode="thread_local": a neighbour thread's cudaMalloc and sync in the middle
    of our capture must succeed, and so must the capture (under "global" both would fail)."""
    cache = GraphCache(decoder, device)
    step = random_step(decoder.config, KEYS[2], seed=0, device=device)
    want = eager(decoder, step)
    in_capture, neighbour_done = threading.Event(), threading.Event()
    neighbour_errors: list[BaseException] = []

    def neighbour() -> None:
        try:
            assert in_capture.wait(timeout=120), "the capture never started"
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
                # Larger than any cached block: the allocator has to call cudaMalloc.
                block = torch.ones(300 * MiB + 4099, dtype=torch.uint8, device=device)
                assert int(block.sum()) == block.numel()  # a sync on this thread's stream
        except BaseException as error:
            neighbour_errors.append(error)
        finally:
            neighbour_done.set()

    forward = cache.static_step

    def forward_meeting_the_neighbour(entry):
        if torch.cuda.is_current_stream_capturing():
            in_capture.set()
            assert neighbour_done.wait(timeout=120), "the neighbour thread never finished"
        return forward(entry)

    cache.static_step = forward_meeting_the_neighbour
    thread = threading.Thread(target=neighbour)
    thread.start()
    try:
        got = graphed(cache, step)
    finally:
        in_capture.set()
        thread.join(timeout=120)
    assert neighbour_errors == []
    assert torch.equal(got, want)


# --- guards and device binding ---------------------------------------------------------------


def test_the_device_must_be_the_decoders(decoder, device):
    other = torch.device("cuda", device.index + 1)
    with pytest.raises(ValueError, match=rf"device {other} is not the decoder's device {device}"):
        GraphCache(decoder, other)
    with pytest.raises(ValueError, match=rf"device cpu is not the decoder's device {device}"):
        GraphCache(decoder, "cpu")
    with torch.cuda.device(device):
        assert GraphCache(decoder, "cuda").device == device  # "cuda" is the current device


def test_inputs_on_the_host_or_of_another_dtype_are_refused(decoder, device):
    cache = GraphCache(decoder, device)
    step = random_step(decoder.config, KEYS[0], seed=0, device=device)
    on_host = step.to("cpu")
    with pytest.raises(
        ValueError, match=rf"tokens are on cpu; the graph cache is bound to {device}"
    ):
        graphed(cache, on_host)
    with pytest.raises(ValueError, match=r"memory must be torch.float32 .* got torch.bfloat16"):
        graphed(cache, replace(step, memory=step.memory.bfloat16()))
    assert cache.keys() == []


@needs_two_gpus
def test_a_cache_on_the_second_gpu_leaves_the_current_one_alone(meter):
    first, second = torch.device("cuda", 0), torch.device("cuda", 1)
    decoder = seeded_decoder(DecoderConfig(), 0, second)
    steps = [
        random_step(decoder.config, key, seed=i, device=second) for i, key in enumerate(KEYS[:2])
    ]
    wanted = [eager(decoder, step) for step in steps]
    settle(second)
    with torch.cuda.device(first):
        before = meter(first.index)
        cache = GraphCache(decoder, second)
        got = [graphed(cache, step) for step in steps + steps]
        torch.cuda.synchronize(second)
        after = meter(first.index)
        assert torch.cuda.current_device() == first.index
    assert cache.device == second and cache.stats.captures == 2
    assert all(out.device == second for out in got)
    assert all(torch.equal(out, want) for out, want in zip(got, wanted + wanted, strict=True))
    assert after == before, f"the cache on {second} changed memory on {first}"


# --- the sampler with graphs on --------------------------------------------------------------


def test_the_sampler_with_graphs_matches_the_sampler_without(decoder, device, monkeypatch):
    config = decoder.config
    on = ARSampler(decoder, cudagraph=True, bf16=True, batched=True, bucket=True)
    off = ARSampler(decoder, cudagraph=False, bf16=True, batched=True, bucket=True)
    assert isinstance(on.graph_cache, GraphCache) and off.graph_cache is None
    generator = torch.Generator().manual_seed(3)
    memory = torch.randn(1, 64, config.d_model, generator=generator).to(device)
    padding = torch.zeros(1, 64, dtype=torch.bool, device=device)
    padding[:, -8:] = True
    # Lengths on both sides of the 64 bucket, so the key changes while sampling.
    prefixes = random_prefixes(config, (1, 5, 17, 40, 63, 70), generator)

    def sample(sampler: ARSampler) -> list[list[int]]:
        seeded = torch.Generator(device).manual_seed(7)
        return sampler.sample(memory, padding, prefixes, seeded, max_len=96)

    assert sample(on) == sample(off)
    assert on.graph_cache.stats.replays > 0
    for rows in (prefixes[:1], prefixes[:3], prefixes):
        tokens, gather = pad_rows(rows, config, bucket=True)
        batch = tokens.shape[0]
        step = ARStep(
            tokens.to(device),
            memory.expand(batch, -1, -1),
            padding.expand(batch, -1),
            gather.to(device),
            len(rows),
        )
        assert torch.equal(on.step_logits(step), off.step_logits(step))
    monkeypatch.setenv("REASYN_CUDAGRAPH", "1")
    from_env = ARSampler(decoder, bf16=True, batched=True, bucket=True)
    assert isinstance(from_env.graph_cache, GraphCache)


# --- figures for the report ------------------------------------------------------------------


def median_ms(call: Callable[[], object], iterations: int = 200, warmups: int = 20) -> float:
    """Median milliseconds of one call between CUDA events, each call timed on its own."""
    for _ in range(warmups):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@pytest.mark.parametrize("batch", [1, 8])
def test_figures_graph_vs_eager(decoder, device, record_property, batch):
    """Graph vs eager on the AR forward at the default config, bf16, memory length 64, as the
    sampler calls it per step: staging the host layout, the forward, the fp32 copy."""
    config = decoder.config
    key = GraphKey(batch, 64, 64, True, shared_memory=batch > 1)  # one target, as sampled
    step = random_step(config, key, seed=0, device=device)
    host_tokens = step.tokens.cpu().pin_memory()
    host_gather = step.gather.cpu().pin_memory()
    cache = GraphCache(decoder, device)

    def staged() -> ARStep:
        tokens = host_tokens.to(device, non_blocking=True)
        gather = host_gather.to(device, non_blocking=True)
        return replace(step, tokens=tokens, gather=gather)

    eager_ms = median_ms(lambda: ar_step_logits(decoder, staged(), bf16=True))
    graph_ms = median_ms(lambda: cache(staged()))
    capture_seconds = cache.stats.capture_seconds[key]
    label = f"({batch},64)"
    record_property(f"eager_ms key={label}", round(eager_ms, 4))
    record_property(f"graph_ms key={label}", round(graph_ms, 4))
    record_property(f"speedup key={label}", round(eager_ms / graph_ms, 3))
    record_property(f"capture_seconds key={label}", round(capture_seconds, 4))
    print(
        f"FIGURE graph_vs_eager key={label} eager_ms={eager_ms:.3f} graph_ms={graph_ms:.3f} "
        f"speedup={eager_ms / graph_ms:.2f}"
    )
    print(f"FIGURE capture_seconds key={label} seconds={capture_seconds:.3f}")
    assert cache.stats.captures == 1
