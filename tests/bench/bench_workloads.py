"""What the benchmarks run on: the shapes, the workload (reasyn_ref.workloads: the default-config
decoder and its inputs in the sampler's bucketed layout), and the in-run store the ratios are
computed from."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reasyn_ref.workloads import MEMORY_LEN, forward_inputs, make_decoder, make_memory, warm_up

__all__ = [
    "FORWARD_KEYS",
    "MEMORY_LEN",
    "BenchResults",
    "forward_inputs",
    "key_id",
    "make_decoder",
    "make_memory",
    "needs_cuda",
    "warm_up",
]

# (bucketed batch, bucketed sequence) of the AR forward; memory length MEMORY_LEN throughout.
FORWARD_KEYS = [(1, 64), (8, 64), (16, 128), (64, 128), (256, 512)]

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: GPU benchmark (torch.cuda.is_available() is False)",
)


def key_id(key: tuple[int, int]) -> str:
    return f"{key[0]}x{key[1]}"


class BenchResults:
    """Figures of this session's benchmarks by label, e.g. ("ar_forward", "eager", (8, 64)):
    the median in seconds and any other figure a partner benchmark needs."""

    def __init__(self) -> None:
        self._figures: dict[tuple[Any, ...], dict[str, Any]] = {}

    def record(self, benchmark: Any, label: tuple[Any, ...], **figures: Any) -> float | None:
        """Store ``benchmark``'s median (seconds) and ``figures`` under ``label``; returns the
        median, or None when benchmarks are disabled (the function ran once, untimed)."""
        if benchmark.stats is None:
            return None
        median = benchmark.stats.stats.median
        self._figures[label] = {"median_s": median, **figures}
        return median

    def get(self, label: tuple[Any, ...], figure: str = "median_s") -> Any:
        """A figure stored under ``label`` in this session, None when it was not measured."""
        return self._figures.get(label, {}).get(figure)

    @staticmethod
    def ratio(info: dict[str, Any], name: str, numerator: Any, denominator: Any) -> None:
        """info[name] = numerator / denominator when both were measured in this run."""
        if numerator is not None and denominator:
            info[name] = numerator / denominator
