"""What the plugin's own checks cost: a 64-case parity check and the NVML memory readings.

On the GPU the parity check compares the graph cache with its eager step at the default config
over four keys, the way a user's test does (graphs captured in the warm-up round), for the exact
step (eager: the upstream step) and the lean step (eager: the lean step run eagerly); beside its
time, the checker's own share: the check against the same 128 calls alone, in interleaved
rounds. On CPU it runs the same check at the tiny config with eager on both sides: the engine's
own cost (inputs, seeded RNG, comparison), so that CI keeps it running.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from functools import partial

import pytest
import torch
from bench_workloads import MEMORY_LEN, STEP_KINDS

from pytest_cudagraph.engines.parity import ParityChecker
from pytest_cudagraph.skips import needs_cuda
from reasyn_ref import ARStep, Decoder, DecoderConfig, expand_memory
from reasyn_ref.graph_cache import GraphCache
from reasyn_ref.model import ar_step_logits
from reasyn_ref.workloads import seeded_decoder

CASES = 64
PARITY_KEYS = [(1, 64), (2, 64), (4, 128), (8, 64)]  # cases cycle over them
ROUNDS = 3
PAIRS = 5  # interleaved (calls alone, check) rounds behind checker_s


def parity_inputs(config: DecoderConfig, generator: torch.Generator, case: int) -> ARStep:
    """One AR step at key PARITY_KEYS[case % 4], every tensor drawn on the device from the
    checker's ``generator`` (unlike ``reasyn_ref.workloads.random_step``, which lays rows out
    on the host: this benchmark times the checker's own input cost): right-padded rows of
    random lengths (the first one full), gather at each row's end, one target's memory with a
    random amount of padding, expanded over the rows."""
    batch, seq = PARITY_KEYS[case % len(PARITY_KEYS)]
    device = generator.device

    def draw(low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=generator, device=device)

    lengths = draw(1, seq + 1, (batch,))
    # Not lengths[0] = seq: that copies from the host and waits for the device.
    lengths[:1].fill_(seq)
    tokens = draw(3, config.vocab_size, (batch, seq))
    tokens[:, 0] = config.start_token
    padding = torch.arange(seq, device=device) >= lengths[:, None]
    tokens = tokens.masked_fill(padding, config.pad_token)
    memory = torch.randn(1, MEMORY_LEN, config.d_model, generator=generator, device=device)
    mask = torch.arange(MEMORY_LEN, device=device) >= MEMORY_LEN - draw(0, 16, (1, 1))
    memory, mask = expand_memory(memory, mask, batch)
    return ARStep(tokens, memory, mask, lengths - 1, batch)


def benchmark_parity_check(benchmark, decoder: Decoder, eager, graphed) -> None:
    """Time one 64-case check of ``graphed`` against ``eager``; every case must match exactly."""
    result = benchmark.pedantic(
        checker_for(decoder).check,
        args=(eager, graphed, partial(parity_inputs, decoder.config), CASES),
        rounds=ROUNDS,
        warmup_rounds=1,
    )
    assert result.ok and result.checked == CASES, result.reason()


def checker_for(decoder: Decoder) -> ParityChecker:
    return ParityChecker(next(decoder.parameters()).device)


def checker_share(decoder: Decoder, eager, graphed) -> tuple[float, float]:
    """(seconds of the check's 128 calls alone, the checker's own seconds), as medians over
    PAIRS interleaved rounds of the whole check and of the same calls without it (inputs drawn
    beforehand, one synchronization at the end): the two are host-bound seconds that drift
    from round to round, so each round of one is set against its neighbour of the other."""
    device = next(decoder.parameters()).device
    make_inputs = partial(parity_inputs, decoder.config)
    inputs = [make_inputs(torch.Generator(device).manual_seed(case), case) for case in range(CASES)]
    checker = checker_for(decoder)

    def calls_alone() -> None:
        for step in inputs:
            eager(step)
            graphed(step)

    def seconds(run: Callable[[], object]) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    pairs = [
        (seconds(calls_alone), seconds(lambda: checker.check(eager, graphed, make_inputs, CASES)))
        for _ in range(PAIRS)
    ]
    alone = statistics.median(alone for alone, _ in pairs)
    return alone, statistics.median(check - alone for alone, check in pairs)


@pytest.mark.slow
def test_parity_check_cpu_tiny(benchmark):
    decoder = seeded_decoder(DecoderConfig.tiny(), 0)
    eager = partial(ar_step_logits, decoder, bf16=True)
    benchmark_parity_check(benchmark, decoder, eager, eager)
    benchmark.extra_info.update(
        bench="plugin_overhead", variant="parity_check", device="cpu", config="tiny", cases=CASES
    )


@needs_cuda
@pytest.mark.parametrize("step_kind", STEP_KINDS)
def test_parity_check_gpu_default(step_kind, cuda_benchmark, cuda_device, default_decoder):
    lean = step_kind == "lean"
    cache = GraphCache(default_decoder, cuda_device, lean=lean, capacity=len(PARITY_KEYS))
    eager = cache.eager if lean else partial(ar_step_logits, default_decoder, bf16=True)
    benchmark_parity_check(cuda_benchmark, default_decoder, eager, cache)
    cuda_benchmark.extra_info.update(
        bench="plugin_overhead",
        variant="parity_check",
        device="cuda",
        config="default",
        step=step_kind,
        cases=CASES,
        captures=cache.stats.captures,
    )
    # The checker's own share: inputs drawn twice a case, seeding, storage rule, comparisons.
    alone, checker_s = checker_share(default_decoder, eager, cache)
    cuda_benchmark.extra_info.update(calls_alone_s=alone, checker_s=checker_s)
    cache.clear()


@needs_cuda
@pytest.mark.parametrize("reading", ["baseline", "in_block"])
def test_nvml_reading(cuda_benchmark, device_memory, reading):
    """One settled NVML reading: "baseline" is ``sample()`` (a full garbage collection, what a
    baseline and any exact reading cost); "in_block" is ``young_sample()`` right after a full
    reading, as a measured block ends (gc's young generations only)."""
    # A full collection's cost grows with the objects gc tracks, and earlier compile benchmarks
    # leave inductor's loaded: load them here too, so the figure is the same whatever ran first.
    import torch._inductor.compile_fx  # noqa: F401

    def full_reading() -> None:
        device_memory.sample()

    if reading == "baseline":
        cuda_benchmark(device_memory.sample)
    else:  # as at a measured block's end: a young reading after the full one of its baseline
        cuda_benchmark.pedantic(device_memory.young_sample, setup=full_reading, rounds=20)
    cuda_benchmark.extra_info.update(
        bench="plugin_overhead",
        variant="nvml_reading",
        reading=reading,
        device="cuda",
        config="-",
        tracked_objects=len(gc.get_objects()),
    )
