"""The parity engine's own memory against the size of the outputs it compares.

A 64-case check of a step whose output is a (rows, vocabulary) float32 logits tensor, from
1 MiB up to 128 MiB (batch 256 at a 128k vocabulary, the size that made a check hold 17 GB
when it kept both outputs of every case), under three budgets for the earlier outputs the
storage rule keeps alive: the default (1 GiB), 8 MiB and none. On the GPU the figure is the allocator's peak during
the check over what was allocated before it (``peak_mib``), against ``bound_mib``: the budget
plus one case's work, a fixed number of outputs whatever the count of cases. On CPU a 32-case
check of one-row logits (0.5 MiB), and what it keeps alive when its last case runs
(``kept_mib``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch

from pytest_cudagraph.engines.parity import DEFAULT_OUTPUT_BUDGET, ParityChecker
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.skips import needs_cuda

CASES = 64
VOCABULARY = 2**17  # 128k tokens: a float32 row is 0.5 MiB
OUTPUT_MIB = [1, 16, 128]
BUDGETS = {"default": DEFAULT_OUTPUT_BUDGET, "small": 8 * MiB, "none": 0}
CPU_CASES = 32  # of one-row logits (0.5 MiB): CI keeps it short
# One case's work, in outputs: the eager output and its copy, the graphed output, and the
# comparison's temporaries (the differences, their masked copy, the mask).
OUTPUTS_PER_CASE = 8


def logits_step(rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A step from a (1, VOCABULARY) input to fresh (rows, VOCABULARY) logits."""

    def step(row: torch.Tensor) -> torch.Tensor:
        return row.expand(rows, -1) * 2.0

    return step


def one_row(generator: torch.Generator, case: int) -> torch.Tensor:
    return torch.randn(1, VOCABULARY, generator=generator, device=generator.device)


def rows_for(output_mib: int) -> int:
    return output_mib * MiB // (VOCABULARY * 4)


@needs_cuda
@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("output_mib", OUTPUT_MIB)
def test_parity_memory_gpu(cuda_benchmark, cuda_device, output_mib: int, budget: str) -> None:
    step = logits_step(rows_for(output_mib))
    checker = ParityChecker(cuda_device, output_budget_bytes=BUDGETS[budget])
    peaks = []

    def check() -> None:
        gc.collect()
        torch.cuda.synchronize(cuda_device)
        torch.cuda.reset_peak_memory_stats(cuda_device)
        before = torch.cuda.memory_allocated(cuda_device)
        result = checker.check(step, step, one_row, CASES)
        assert result.ok and result.checked == CASES, result.reason()
        peaks.append(torch.cuda.max_memory_allocated(cuda_device) - before)

    cuda_benchmark.pedantic(check, rounds=3, warmup_rounds=1)
    output_bytes = output_mib * MiB
    bound = min(BUDGETS[budget], CASES * output_bytes) + OUTPUTS_PER_CASE * output_bytes
    cuda_benchmark.extra_info.update(
        bench="parity_memory",
        device="cuda",
        output_mib=output_mib,
        budget=budget,
        budget_mib=BUDGETS[budget] / MiB,
        cases=CASES,
        peak_mib=max(peaks) / MiB,
        bound_mib=bound / MiB,
        kept_before_mib=2 * CASES * output_mib,  # both outputs of every case
    )
    assert max(peaks) <= bound, f"the check held {max(peaks) / MiB:.0f} MiB, over {bound / MiB:.0f}"


@pytest.mark.slow
@pytest.mark.parametrize("budget", list(BUDGETS))
def test_parity_memory_cpu(benchmark, budget: str) -> None:
    """On CPU: the time of the check, and the earlier outputs alive while its last case runs
    (weak references to each output's storage), which the budget bounds."""
    step = logits_step(1)
    refs = []

    def graphed(row: torch.Tensor) -> torch.Tensor:
        if len(refs) == CPU_CASES - 1:
            graphed.kept = sum(1 for ref in refs if not ref.expired())
        out = step(row)
        refs.append(torch.multiprocessing.reductions.StorageWeakRef(out.untyped_storage()))
        return out

    def check() -> None:
        refs.clear()
        gc.collect()
        result = ParityChecker("cpu", output_budget_bytes=BUDGETS[budget]).check(
            step, graphed, one_row, CPU_CASES
        )
        assert result.ok, result.reason()

    benchmark.pedantic(check, rounds=3, warmup_rounds=1)
    output_mib = VOCABULARY * 4 / MiB
    kept_mib = graphed.kept * output_mib
    benchmark.extra_info.update(
        bench="parity_memory",
        device="cpu",
        output_mib=output_mib,
        budget=budget,
        budget_mib=BUDGETS[budget] / MiB,
        cases=CPU_CASES,
        kept_mib=kept_mib,
    )
    assert kept_mib == min(BUDGETS[budget] / MiB, (CPU_CASES - 1) * output_mib)
