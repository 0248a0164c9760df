"""Incremental (KV-cache) sampling in tokens per second, graphs off and on, beside the
full-recompute sampler with graphs on, at batch 1, 8 and 64 to length 128.

The full-recompute baseline is measured here too (as ``test_bench_sampler.py`` measures it),
so that every ratio is taken within the run, whatever ``-k`` selects. As there, the decoder's
head is rigged never to choose END, so every row runs to ``SAMPLE_MAX_LEN`` and all three do the
same number of tokens; with the same seed, incremental graphs on must sample the very tokens
incremental graphs off did. The goal, for the report: incremental with graphs at batch 64
at least 4x the full-recompute graphed sampler (``speedup_vs_full_graph``).
"""

from __future__ import annotations

import pytest
import torch
from bench_workloads import SAMPLE_BATCHES, benchmark_sampling, endless_decoder

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import ARSampler, Decoder, KVSampler
from reasyn_ref.kv_graphs import StepGraphCache

pytestmark = needs_cuda


@pytest.fixture(scope="module")
def rigged_decoder(cuda_device: torch.device) -> Decoder:
    return endless_decoder(cuda_device)


def benchmark_sampler(
    benchmark, sampler: ARSampler | KVSampler, batch: int, variant: str
) -> list[list[int]]:
    """The timed run of ``sampler`` at ``batch`` rows; returns the sampled rows."""
    return benchmark_sampling(benchmark, sampler, batch, bench="incremental", variant=variant)


def record(benchmark, bench_results, variant: str, batch: int, **figures) -> None:
    """Store the median; tokens/s and the speedup over the full-recompute graphed sampler."""
    info = benchmark.extra_info
    median = bench_results.record(benchmark, ("incremental", variant, batch), **figures)
    bench_results.ratio(info, "tokens_per_s", info["tokens"], median)
    full = bench_results.get(("incremental", "full_recompute_graph", batch))
    bench_results.ratio(info, "speedup_vs_full_graph", full, median)


@pytest.mark.parametrize("batch", SAMPLE_BATCHES)
def test_full_recompute_graphs_on(batch, rigged_decoder, cuda_benchmark, bench_results):
    sampler = ARSampler(rigged_decoder, bf16=True, batched=True, bucket=True, cudagraph=True)
    benchmark_sampler(cuda_benchmark, sampler, batch, "full_recompute_graph")
    sampler.graph_cache.clear()  # give the graphs' memory back before the next benchmark
    record(cuda_benchmark, bench_results, "full_recompute_graph", batch)


@pytest.mark.parametrize("batch", SAMPLE_BATCHES)
def test_incremental_graphs_off(batch, rigged_decoder, cuda_benchmark, bench_results):
    sampler = KVSampler(rigged_decoder, bf16=True, cudagraph=False)
    rows = benchmark_sampler(cuda_benchmark, sampler, batch, "eager")
    record(cuda_benchmark, bench_results, "eager", batch, rows=rows)


@pytest.mark.parametrize("batch", SAMPLE_BATCHES)
def test_incremental_graphs_on(batch, rigged_decoder, cuda_benchmark, bench_results):
    sampler = KVSampler(rigged_decoder, bf16=True, cudagraph=True)
    rows = benchmark_sampler(cuda_benchmark, sampler, batch, "graph")
    assert isinstance(sampler.steps, StepGraphCache)
    sampler.steps.clear()
    eager_rows = bench_results.get(("incremental", "eager", batch), "rows")
    if eager_rows is not None:
        assert rows == eager_rows, "graphs on sampled other tokens than graphs off, same seed"
    record(cuda_benchmark, bench_results, "graph", batch)
    info = cuda_benchmark.extra_info
    eager = bench_results.get(("incremental", "eager", batch))
    bench_results.ratio(
        info, "speedup_vs_eager", eager, bench_results.get(("incremental", "graph", batch))
    )


# At batch 1, where a step is its kernels' launches and fused kernels count most.
@pytest.mark.parametrize("batch", [1])
def test_incremental_compiled_graphs_on(batch, rigged_decoder, cuda_benchmark, bench_results):
    """The sampler with the compiled blocks (``compile_blocks``), graphs on: its rounding is
    inductor's, so its tokens are not compared with the plain sampler's."""
    sampler = KVSampler(rigged_decoder, bf16=True, cudagraph=True, compile_blocks=True)
    benchmark_sampler(cuda_benchmark, sampler, batch, "compiled_graph")
    assert isinstance(sampler.steps, StepGraphCache)
    sampler.steps.clear()
    record(cuda_benchmark, bench_results, "compiled_graph", batch)
