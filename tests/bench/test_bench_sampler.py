"""The sampler end to end, in tokens per second, graphs off against graphs on.

The decoder's head is rigged never to choose the END token (its bias there is -1e4), so every
row runs to ``SAMPLE_MAX_LEN`` and both modes do the same, fixed work: tokens per second then
measures the step loop, not the luck of when END is drawn. With the same seed, graphs on must
sample the very tokens graphs off did. The workload and its timed run: ``bench_workloads``.
"""

from __future__ import annotations

import pytest
import torch
from bench_workloads import SAMPLE_BATCHES, benchmark_sampling, endless_decoder

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import Decoder
from reasyn_ref.sampler import ARSampler

pytestmark = needs_cuda


@pytest.fixture(scope="module")
def rigged_decoder(cuda_device: torch.device) -> Decoder:
    return endless_decoder(cuda_device)


def sample_rows(benchmark, decoder: Decoder, batch: int, cudagraph: bool) -> list[list[int]]:
    """The timed run of the sampler, graphs on or off, at ``batch`` rows; returns the rows."""
    sampler = ARSampler(decoder, bf16=True, batched=True, bucket=True, cudagraph=cudagraph)
    variant = "graph" if cudagraph else "eager"
    rows = benchmark_sampling(benchmark, sampler, batch, bench="sampler", variant=variant)
    if sampler.graph_cache is not None:
        sampler.graph_cache.clear()  # give the graphs' memory back before the next benchmark
    return rows


@pytest.mark.parametrize("batch", SAMPLE_BATCHES)
def test_graphs_off(batch, rigged_decoder, cuda_benchmark, bench_results):
    rows = sample_rows(cuda_benchmark, rigged_decoder, batch, cudagraph=False)
    info = cuda_benchmark.extra_info
    median = bench_results.record(cuda_benchmark, ("sampler", "eager", batch), rows=rows)
    bench_results.ratio(info, "tokens_per_s", info["tokens"], median)


@pytest.mark.parametrize("batch", SAMPLE_BATCHES)
def test_graphs_on(batch, rigged_decoder, cuda_benchmark, bench_results):
    rows = sample_rows(cuda_benchmark, rigged_decoder, batch, cudagraph=True)
    eager_rows = bench_results.get(("sampler", "eager", batch), "rows")
    if eager_rows is not None:
        assert rows == eager_rows, "graphs on sampled other tokens than graphs off, same seed"
    info = cuda_benchmark.extra_info
    median = bench_results.record(cuda_benchmark, ("sampler", "graph", batch))
    bench_results.ratio(info, "tokens_per_s", info["tokens"], median)
    eager_median = bench_results.get(("sampler", "eager", batch))
    bench_results.ratio(info, "speedup_vs_eager", eager_median, median)
