"""Benchmarks of the reference graph cache, run with pytest-benchmark.

Each benchmark describes itself in ``extra_info`` (``bench``, ``variant``, ``key``, ...) for
scripts/bench_report.py and stores its median in ``bench_results``; a benchmark whose partner
already ran in this session (eager before compile before graph: the order of the test
functions) records the ratio to it. Ratios are never taken across runs.

Storage and the committed baseline are kept per stack by the plugin: the commands in tox.ini
and docs/benchmarks.md name ``{cudagraph_stack_id}`` in their benchmark paths.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_workloads import BenchResults, host_bound_first, make_decoder

from reasyn_ref import Decoder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    host_bound_first(items, Path(__file__).parent)


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_generate_json(benchmarks: list[Any]) -> Generator[None, object, object]:
    """A benchmark that timed no round (interrupted, as the GPU recipe interrupts a step at its
    limit, or its call raised) is left out of the JSON: pytest-benchmark would fail writing it,
    and lose every finished benchmark's figures with it."""
    benchmarks[:] = [benchmark for benchmark in benchmarks if benchmark.stats.data]
    return (yield)


@pytest.fixture(scope="session")
def bench_results() -> BenchResults:
    return BenchResults()


@pytest.fixture(scope="session")
def default_decoder(cuda_device: torch.device) -> Decoder:
    """The default-config decoder on this process's GPU, shared by the benchmarks."""
    return make_decoder(cuda_device)
