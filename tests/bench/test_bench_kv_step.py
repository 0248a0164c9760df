"""One decode step of the KV decoder at batch 1, 8 and 64 (cache 128 positions, memory 64), as
the sampler runs it (bf16 weight copy under bf16 autocast): torch.compile of that step, and the
cache's graph of it.

A timed call is one step and the fp32 copy of its logits, between device synchronizations, as
the sampler makes it once per token. compile is ``torch.compile(KVDecoder.step, mode="default",
fullgraph=True)``: "reduce-overhead" skips CUDA graphs on this step (it writes its inputs, the
cache), so this is the best compile of the same step. Against it, in interleaved pairs: the
cache's graph, and the cache's graph of the compiled blocks (``compile_blocks``), whose
kernels and device time per token are recorded there too (the benchmarks that compile run in
one step of the GPU recipe). The graph records its kernels and device time per token
(profiler) and is checked bit-identical to its own eager step (``EagerSteps``). compile runs
first at each batch, then the graph (as in ``test_bench_ar_forward.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest
import torch
from bench_workloads import (
    COMPILE_TOLERANCE,
    KV_BATCHES,
    MEMORY_LEN,
    make_memory,
    paired,
    warm_up,
)
from device_profile import profile_device_ops, summarize

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import EagerSteps, KVDecoder, StepGraphCache, StepKey
from reasyn_ref.kv_decoder import StepBuffers, claimed
from reasyn_ref.model import step_context, with_bf16_matmul_weights

pytestmark = needs_cuda

CACHE_LEN = 128  # the sampler's cache for rows of up to 128 tokens
PROFILED_STEPS = 20
VARIANTS = [pytest.param("compile", marks=pytest.mark.slow), "graph"]


def loaded(kv: KVDecoder, buffers: StepBuffers) -> StepBuffers:
    """``buffers`` holding a target and a step's inputs: every row at position 63, the middle
    of the cache (the step does the same work at any position), over a zeroed cache: a graph's
    buffers hold what its warm-up and capture wrote, an eager step's fresh ones do not, and
    the step reads every position up to its own."""
    buffers.cache.zero_()
    memory, mask = make_memory(kv.config, kv.device, seed=0)
    with step_context(kv.device, bf16=True):
        kv.load_target(buffers, memory, mask)
    buffers.inputs[0].fill_(kv.config.start_token)
    buffers.inputs[1].fill_(CACHE_LEN // 2 - 1)
    return buffers


def fp32_step(kv_step, buffers: StepBuffers, device: torch.device) -> torch.Tensor:
    with step_context(device, bf16=True):
        return kv_step(buffers).to(torch.float32, copy=True)


@pytest.mark.parametrize("variant", VARIANTS)  # the inner loop: a batch's variants together
@pytest.mark.parametrize("batch", KV_BATCHES)
def test_kv_step(batch, variant, default_decoder, cuda_device, cuda_benchmark):
    weights = with_bf16_matmul_weights(default_decoder)
    key = StepKey(batch, CACHE_LEN, MEMORY_LEN)
    info = cuda_benchmark.extra_info
    info.update(bench="kv_step", variant=variant, batch=batch, cache_len=CACHE_LEN)
    if variant == "compile":
        info.update(_benchmark_compile(KVDecoder(weights), key, cuda_benchmark))
    else:
        info.update(_benchmark_graph(KVDecoder(weights), key, cuda_benchmark))


@contextlib.contextmanager
def graph_step(kv: KVDecoder, key: StepKey) -> Iterator[Callable[[], torch.Tensor]]:
    """The cache's graph of ``kv``'s step at ``key`` (captured on entry) with a target and
    inputs loaded, as a call: a replay and its copy-out."""
    graphs = StepGraphCache(kv, capacity=1)
    with graphs.claim(key) as slot:
        loaded(kv, claimed(slot))
        yield partial(slot.step, key.batch)
    graphs.clear()


def per_token(step: Callable[[], object], prefix: str = "") -> dict:
    """The kernels and copies one call of ``step`` runs, and their device time (profiler)."""
    device = summarize(profile_device_ops(step, PROFILED_STEPS), PROFILED_STEPS)
    return {
        f"{prefix}kernels_per_token": round(device.ops_per_call),
        f"{prefix}device_ms_per_token": device.device_us_per_call / 1e3,
    }


def _benchmark_graph(kv: KVDecoder, key: StepKey, benchmark) -> dict:
    """A replay and its copy-out; the replay must equal its eager step bit for bit."""
    with graph_step(kv, key) as step, EagerSteps(kv, bf16=True).claim(key) as eager_slot:
        loaded(kv, claimed(eager_slot))
        assert torch.equal(step(), eager_slot.step(key.batch)), "graph differs from eager step"
        warm_up(step)
        benchmark(step)
        return per_token(step)


def _benchmark_compile(kv: KVDecoder, key: StepKey, benchmark) -> dict:
    """compile of the step (on buffers of its own), from a cold compile cache, within bf16
    rounding of the eager step; then each graph paired against it."""
    from torch._inductor.utils import fresh_inductor_cache

    device = kv.device
    with step_context(device, bf16=True):
        buffers = loaded(kv, kv.new_buffers(key, kv.compute_dtype()))
    eager = fp32_step(kv.step, buffers, device)
    torch._dynamo.reset()
    with fresh_inductor_cache():
        compiled = torch.compile(kv.step, mode="default", fullgraph=True, dynamic=False)
        step = partial(fp32_step, compiled, buffers, device)
        start = time.perf_counter()
        logits = step()
        torch.cuda.synchronize()
        figures: dict[str, float] = {"compile_s": time.perf_counter() - start}
        off = ((logits - eager).abs().max() / eager.abs().max()).item()
        assert off <= COMPILE_TOLERANCE, f"compiled logits off their eager step by {off:.3g}"
        warm_up(step)
        benchmark(step)
        figures.update(per_token(step), max_rel_diff_vs_eager=off)
        with graph_step(kv, key) as graph:
            warm_up(graph)
            figures["graph_speedup_paired"] = paired(step, graph).speedup
        with graph_step(KVDecoder(kv.decoder, compile_blocks=True), key) as blocks_graph:
            warm_up(blocks_graph)
            pairs = paired(step, blocks_graph)
            figures.update(
                compiled_graph_speedup_paired=pairs.speedup,
                compiled_graph_ms=pairs.fast_ms,
                **per_token(blocks_graph, prefix="compiled_graph_"),
            )
    torch._dynamo.reset()
    return figures
