"""Benchmarks of the reference graph cache (issue 7), run with pytest-benchmark.

Each benchmark describes itself in ``extra_info`` (``bench``, ``variant``, ``key``, ...) for
scripts/bench_report.py and stores its median in ``bench_results``; a benchmark whose partner
already ran in this session (eager before compile before graph: the order of the test
functions) records the ratio to it. Ratios are never taken across runs.

Storage is kept per stack (bench_storage.py). That needs this conftest loaded before
pytest-benchmark opens its storage, i.e. tests/bench named on the command line
(``pytest tests/bench ...``), as tox, scripts/gpu_suite.sh and docs/benchmarks.md do.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from bench_storage import baseline_file, per_stack_storage, stack_id
from bench_workloads import BenchResults, make_decoder

from reasyn_ref import Decoder


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-baseline",
        action="store_true",
        default=False,
        help="compare with this stack's committed baseline (benchmarks/baseline/<stack-id>/)",
    )


# Neither tryfirst nor trylast: after the cudagraph plugin binds this process's GPU (tryfirst;
# stack_id() starts CUDA), before pytest-benchmark opens its storage (trylast).
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes tens of seconds (torch.compile)")
    if not config.pluginmanager.hasplugin("benchmark"):
        return
    if config.pluginmanager.hasplugin("pytest-benchmark"):
        # pytest-benchmark's session is up and its storage open: this conftest was loaded
        # while collecting, too late to choose the storage.
        storage_used = ("benchmark_save", "benchmark_autosave", "benchmark_compare")
        if any(config.getoption(name) for name in storage_used):
            warnings.warn(
                pytest.PytestConfigWarning(
                    "benchmark storage is not per stack in this run: name tests/bench on the "
                    "command line (`pytest tests/bench ...`)"
                ),
                stacklevel=1,
            )
        return
    stack = stack_id()
    config.option.benchmark_storage = per_stack_storage(config.option.benchmark_storage, stack)
    if config.getoption("bench_baseline"):
        try:
            config.option.benchmark_compare = str(baseline_file(config.rootpath, stack))
        except ValueError as error:
            raise pytest.UsageError(f"--bench-baseline: {error}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not config.pluginmanager.hasplugin("benchmark"):
        return []
    return [f"bench: stack {stack_id()}, storage {config.option.benchmark_storage}"]


@pytest.fixture(scope="session")
def bench_results() -> BenchResults:
    return BenchResults()


@pytest.fixture(scope="session")
def default_decoder(cuda_device: torch.device) -> Decoder:
    """The default-config decoder on this process's GPU, shared by the benchmarks."""
    return make_decoder(cuda_device)
