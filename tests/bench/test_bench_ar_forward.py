"""The AR forward at the default config in bf16 (memory length 64): eager, torch.compile
"reduce-overhead" and the graph cache, per (batch, seq) key.

Every variant is timed the same way: one call per round (input staging, forward and the fp32
copy of the logits, as the sampler makes it once per step) between device synchronizations.
The test functions run in this order, eager, compile, graph, so that each key's graph
benchmark finds its partners' figures in ``bench_results`` and records the ratios in this run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import pytest
import torch
from bench_workloads import FORWARD_KEYS, MEMORY_LEN, forward_inputs, key_id, needs_cuda, warm_up

from reasyn_ref.graph_cache import GraphCache
from reasyn_ref.model import ar_step_logits, step_context

pytestmark = needs_cuda

# torch.compile takes seconds per shape: only the two small keys the goals are about.
COMPILE_KEYS = [(1, 64), (8, 64)]
# compile may reorder bf16 arithmetic, so its logits only agree with eager's to within this
# fraction of the largest eager logit (a few bf16 ulps).
COMPILE_TOLERANCE = 5e-2


def _info(variant: str, key: tuple[int, int]) -> dict:
    return {"bench": "ar_forward", "variant": variant, "key": list(key), "memory_len": MEMORY_LEN}


def _first_call(step: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    """Seconds of ``step``'s first call, device work included, and its output."""
    start = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


@pytest.mark.parametrize("key", FORWARD_KEYS, ids=key_id)
def test_eager(key, default_decoder, cuda_device, cuda_benchmark, bench_results):
    ar_step = forward_inputs(default_decoder.config, key, cuda_device)
    step = partial(ar_step_logits, default_decoder, ar_step, bf16=True)
    warm_up(step)
    cuda_benchmark(step)
    cuda_benchmark.extra_info.update(_info("eager", key))
    bench_results.record(cuda_benchmark, ("ar_forward", "eager", key))


@pytest.mark.slow
@pytest.mark.parametrize("key", COMPILE_KEYS, ids=key_id)
def test_compile(key, default_decoder, cuda_device, cuda_benchmark, bench_results):
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees
    from torch._inductor.utils import fresh_inductor_cache

    ar_step = forward_inputs(default_decoder.config, key, cuda_device)
    eager = ar_step_logits(default_decoder, ar_step, bf16=True)
    torch._dynamo.reset()
    counters.clear()
    # A cold compile cache, so that the compile seconds are what a fresh process pays.
    with fresh_inductor_cache():
        compiled = torch.compile(default_decoder, mode="reduce-overhead", dynamic=False)
        step = partial(ar_step_logits, compiled, ar_step, bf16=True)
        compile_s, _ = _first_call(step)
        warm_up(step)  # CUDA-graph trees record on a later call than the first
        with step_context(cuda_device, bf16=True):
            forward_args = (ar_step.tokens, ar_step.memory, ar_step.memory_padding_mask)
            raw_dtype = compiled(*forward_args, ar_step.gather).dtype  # the output is not kept
        assert raw_dtype == torch.bfloat16, f"compiled forward ran in {raw_dtype}, not bf16"
        skips = counters["inductor"]["cudagraph_skips"]
        assert skips == 0, f"torch.compile skipped CUDA graphs {skips} time(s): not reduce-overhead"
        graphs = counters["stats"]["unique_graphs"]  # more than one: graph breaks
        max_rel_diff = ((step() - eager).abs().max() / eager.abs().max()).item()
        assert max_rel_diff <= COMPILE_TOLERANCE, f"compiled logits off eager by {max_rel_diff:.3g}"
        cuda_benchmark(step)
    info = cuda_benchmark.extra_info
    info.update(
        _info("compile", key), compile_s=compile_s, max_rel_diff=max_rel_diff, fx_graphs=graphs
    )
    label = ("ar_forward", "compile", key)
    median = bench_results.record(cuda_benchmark, label, compile_s=compile_s)
    eager_median = bench_results.get(("ar_forward", "eager", key))
    bench_results.ratio(info, "speedup_vs_eager", eager_median, median)
    del compiled, step
    torch._dynamo.reset()
    reset_cudagraph_trees()  # frees their memory pool (torch 2.7's dynamo.reset() does not)


@pytest.mark.parametrize("key", FORWARD_KEYS, ids=key_id)
def test_graph(key, default_decoder, cuda_device, cuda_benchmark, bench_results):
    ar_step = forward_inputs(default_decoder.config, key, cuda_device)
    eager = ar_step_logits(default_decoder, ar_step, bf16=True)
    cache = GraphCache(default_decoder, cuda_device)
    step = partial(cache, ar_step)
    capture_s, first = _first_call(step)  # buffers, warm-ups, capture and the first replay
    assert torch.equal(first, eager), "graph logits differ from eager: the cache is not exact"
    warm_up(step)
    cuda_benchmark(step)
    info = cuda_benchmark.extra_info
    info.update(
        _info("graph", key),
        capture_s=capture_s,
        cache_capture_s=sum(cache.stats.capture_seconds.values()),
    )
    median = bench_results.record(cuda_benchmark, ("ar_forward", "graph", key))
    eager_label, compile_label = ("ar_forward", "eager", key), ("ar_forward", "compile", key)
    bench_results.ratio(info, "speedup_vs_eager", bench_results.get(eager_label), median)
    bench_results.ratio(info, "speedup_vs_compile", bench_results.get(compile_label), median)
    compile_s = bench_results.get(compile_label, "compile_s")
    bench_results.ratio(info, "compile_over_capture", compile_s, capture_s)
    cache.clear()
