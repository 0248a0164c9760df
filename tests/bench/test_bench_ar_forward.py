"""The AR forward at the default config, memory length 64, per (batch, seq) key: the upstream
eager step, the same step on bf16 weights (what the exact graphs replay), the lean step,
torch.compile "reduce-overhead" of each of the two steps the graphs replay (the same weights,
dtypes and work as its graph), and the graph caches of the exact and the lean step.

Every variant is timed the same way: one call per round (input staging, forward and the fp32
copy of the logits, as the sampler makes it once per step) between device synchronizations. The
variants of one key run next to each other, partners first (``VARIANTS`` order), so that each
benchmark finds its partners' figures in ``bench_results`` and the GPU is in the same state for
all of them. Where two sides are close, their ratio is timed again in interleaved pairs
(``paired``), which keeps clock drift out of it: a graph against its own eager step, and each
compiled step against its graph. compile runs before the key's graphs are captured (a graph
kept alive while compile's CUDA-graph trees record has crashed the process: docs/lean.md), and
its partner graph is captured once its trees have recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import pytest
import torch
from bench_workloads import (
    COMPILE_TOLERANCE,
    FORWARD_KEYS,
    MEMORY_LEN,
    forward_inputs,
    key_id,
    paired,
    warm_up,
)

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref.graph_cache import GraphCache
from reasyn_ref.lean import LeanDecoder
from reasyn_ref.model import ar_step_logits, step_context, with_bf16_matmul_weights

pytestmark = needs_cuda

# Each compiled variant: the step it compiles is the one of the graph cache (lean or not)
# that it is paired with.
COMPILED = {"compile": False, "compile_lean": True}
VARIANTS = [
    "eager",
    "eager_bf16",
    "lean_eager",
    *(pytest.param(v, marks=pytest.mark.slow) for v in COMPILED),  # seconds of compiling
    "graph",
    "lean_graph",
]


def _first_call(step: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    """Seconds of ``step``'s first call, device work included, and its output."""
    start = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def _relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("variant", VARIANTS)  # the inner loop: a key's variants together
@pytest.mark.parametrize("key", FORWARD_KEYS, ids=key_id)
def test_ar_forward(key, variant, default_decoder, cuda_device, cuda_benchmark, bench_results):
    ar_step = forward_inputs(default_decoder.config, key, cuda_device)
    upstream = ar_step_logits(default_decoder, ar_step, bf16=True)
    if variant == "eager":
        figures = _benchmark_upstream(default_decoder, ar_step, cuda_benchmark)
    else:
        lean = variant.startswith("lean") or COMPILED.get(variant, False)
        cache = GraphCache(default_decoder, cuda_device, lean=lean)
        if variant in COMPILED:
            figures = _benchmark_compile(cache, ar_step, upstream, cuda_benchmark)
        elif variant in ("eager_bf16", "lean_eager"):
            figures = _benchmark_eager_step(cache, ar_step, upstream, cuda_benchmark)
        else:
            figures = _benchmark_graph(cache, ar_step, cuda_benchmark)
        cache.clear()
    info = cuda_benchmark.extra_info
    info.update(figures, bench="ar_forward", variant=variant, key=list(key), memory_len=MEMORY_LEN)
    median = bench_results.record(cuda_benchmark, ("ar_forward", variant, key), **figures)
    eager_median = bench_results.get(("ar_forward", "eager", key))
    bench_results.ratio(info, "speedup_vs_eager", eager_median, median)


def _benchmark_upstream(decoder, ar_step, benchmark) -> dict:
    step = partial(ar_step_logits, decoder, ar_step, bf16=True)
    warm_up(step)
    benchmark(step)
    return {}


def _benchmark_eager_step(cache, ar_step, upstream, benchmark) -> dict:
    """The eager step a cache's graphs replay, and how far its logits are from upstream's."""
    step = partial(cache.eager, ar_step)
    logits = step()
    warm_up(step)
    benchmark(step)
    return {
        "max_rel_diff": _relative_difference(logits, upstream),
        "argmax_agreement": (logits.argmax(-1) == upstream.argmax(-1)).float().mean().item(),
    }


def _benchmark_graph(cache, ar_step, benchmark) -> dict:
    """A cache's graph: its build seconds (buffers, warm-ups, capture: the first call), its
    replay time, its speed-up over its own eager step in interleaved pairs, and its build in
    those eager steps. Its answer must be its eager step's, bit for bit."""
    step, eager = partial(cache, ar_step), partial(cache.eager, ar_step)
    capture_s, first = _first_call(step)
    assert torch.equal(first, eager()), "graph logits differ from its eager step"
    warm_up(step)
    benchmark(step)
    pairs = paired(eager, step)
    return {
        "capture_s": capture_s,
        "own_eager": "lean_eager" if cache.lean else "eager_bf16",
        "speedup_vs_own_eager": pairs.speedup,
        "build_in_eager_steps": capture_s * 1e3 / pairs.slow_ms,
    }


def _benchmark_compile(cache, ar_step, upstream, benchmark) -> dict:
    """torch.compile "reduce-overhead" of the step ``cache``'s graphs replay (the lean step, or
    the decoder's bf16-weight copy under autocast: the same weights, dtypes and work), from a
    cold compile cache so the compile seconds are what a fresh process pays; then ``cache``'s
    graph, captured once compile's trees have recorded, against it in interleaved pairs."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees
    from torch._inductor.utils import fresh_inductor_cache

    device, bf16 = ar_step.device, not cache.lean
    own_eager = cache.eager(ar_step)
    torch._dynamo.reset()
    counters.clear()
    with fresh_inductor_cache():
        module = (
            LeanDecoder(cache.decoder) if cache.lean else with_bf16_matmul_weights(cache.decoder)
        )
        compiled = torch.compile(module, mode="reduce-overhead", dynamic=False)
        step = partial(ar_step_logits, compiled, ar_step, bf16=bf16)
        compile_s, _ = _first_call(step)
        warm_up(step)  # CUDA-graph trees record on a later call than the first
        with step_context(device, bf16=bf16):
            forward_args = (ar_step.tokens, ar_step.memory, ar_step.memory_padding_mask)
            raw_dtype = compiled(*forward_args, ar_step.gather).dtype  # the output is not kept
        assert raw_dtype == torch.bfloat16, f"compiled forward ran in {raw_dtype}, not bf16"
        skips = counters["inductor"]["cudagraph_skips"]
        assert skips == 0, f"torch.compile skipped CUDA graphs {skips} time(s): not reduce-overhead"
        graphs = counters["stats"]["unique_graphs"]  # more than one: graph breaks
        logits = step()
        off_own = _relative_difference(logits, own_eager)
        assert off_own <= COMPILE_TOLERANCE, (
            f"compiled logits off their eager step by {off_own:.3g}"
        )
        benchmark(step)
        graph = partial(cache, ar_step)
        warm_up(graph)  # the first call captures
        pairs = paired(step, graph)
        cache.clear()
    del compiled, step
    torch._dynamo.reset()
    reset_cudagraph_trees()  # frees their memory pool (torch 2.7's dynamo.reset() does not)
    return {
        "compile_s": compile_s,
        "max_rel_diff": _relative_difference(logits, upstream),
        "fx_graphs": graphs,
        "graph_speedup_paired": pairs.speedup,
        "paired_graph": "lean_graph" if cache.lean else "graph",
    }
