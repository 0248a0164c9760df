"""The sampler end to end, in tokens per second, graphs off against graphs on.

The decoder's head is rigged never to choose the END token (its bias there is -1e4), so every
row runs to ``MAX_LEN`` and both modes do the same, fixed work: tokens per second then measures
the step loop, not the luck of when END is drawn. With the same seed, graphs on must sample the
very tokens graphs off did.
"""

from __future__ import annotations

import pytest
import torch
from bench_workloads import make_decoder, make_memory, needs_cuda

from reasyn_ref import Decoder
from reasyn_ref.sampler import ARSampler

pytestmark = needs_cuda

BATCHES = [1, 8, 64]
MAX_LEN = 128  # crosses one sequence bucket: keys (Bb, 64) and (Bb, 128)
ROUNDS = 3
SEED = 0


@pytest.fixture(scope="module")
def endless_decoder(cuda_device: torch.device) -> Decoder:
    decoder = make_decoder(cuda_device)
    with torch.no_grad():
        decoder.head[-1].bias[decoder.config.end_token] = -1e4
    return decoder


def _benchmark_sampling(benchmark, decoder: Decoder, batch: int, cudagraph: bool) -> list:
    """Time ``sample`` for ``batch`` rows from the start token; returns the sampled rows."""
    config = decoder.config
    sampler = ARSampler(decoder, bf16=True, batched=True, bucket=True, cudagraph=cudagraph)
    memory, mask = make_memory(config, sampler.device, SEED)
    prefixes = [[config.start_token]] * batch

    def arguments():
        generator = torch.Generator(sampler.device).manual_seed(SEED)
        return (memory, mask, prefixes, generator), {"max_len": MAX_LEN}

    # The warm-up round captures the graphs when they are on.
    rows = benchmark.pedantic(sampler.sample, setup=arguments, rounds=ROUNDS, warmup_rounds=1)
    tokens = sum(len(row) - 1 for row in rows)
    assert tokens == batch * (MAX_LEN - 1), "a row stopped early: the END rig did not hold"
    benchmark.extra_info.update(
        bench="sampler", variant="graph" if cudagraph else "eager", batch=batch, tokens=tokens
    )
    if sampler.graph_cache is not None:
        sampler.graph_cache.clear()  # give the graphs' memory back before the next benchmark
    return rows


@pytest.mark.parametrize("batch", BATCHES)
def test_graphs_off(batch, endless_decoder, cuda_benchmark, bench_results):
    rows = _benchmark_sampling(cuda_benchmark, endless_decoder, batch, cudagraph=False)
    info = cuda_benchmark.extra_info
    median = bench_results.record(cuda_benchmark, ("sampler", "eager", batch), rows=rows)
    bench_results.ratio(info, "tokens_per_s", info["tokens"], median)


@pytest.mark.parametrize("batch", BATCHES)
def test_graphs_on(batch, endless_decoder, cuda_benchmark, bench_results):
    rows = _benchmark_sampling(cuda_benchmark, endless_decoder, batch, cudagraph=True)
    eager_rows = bench_results.get(("sampler", "eager", batch), "rows")
    if eager_rows is not None:
        assert rows == eager_rows, "graphs on sampled other tokens than graphs off, same seed"
    info = cuda_benchmark.extra_info
    median = bench_results.record(cuda_benchmark, ("sampler", "graph", batch))
    bench_results.ratio(info, "tokens_per_s", info["tokens"], median)
    eager_median = bench_results.get(("sampler", "eager", batch))
    bench_results.ratio(info, "speedup_vs_eager", eager_median, median)
