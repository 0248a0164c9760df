"""What the benchmarks run on: the plan (the keys, steps and targets the report's goals judge,
imported from scripts/bench_report.py), the workload (reasyn_ref.workloads: the default-config
decoder and its inputs in the sampler's bucketed layout), the samplers' timed run, runs of the
conformance suite in fresh processes, interleaved pairs of timed calls, and the in-run store the
ratios are computed from."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_report import FORWARD_KEYS, KV_BATCHES, STEP_KINDS, SUITE_TARGETS

from reasyn_ref import ARSampler, Decoder, KVSampler
from reasyn_ref.workloads import MEMORY_LEN, forward_inputs, make_decoder, make_memory, warm_up

__all__ = [
    "COMPILE_TOLERANCE",
    "FORWARD_KEYS",
    "KV_BATCHES",
    "MEMORY_LEN",
    "SAMPLE_BATCHES",
    "SAMPLE_MAX_LEN",
    "STEP_KINDS",
    "SUITE_TARGETS",
    "BenchResults",
    "Paired",
    "SuiteRun",
    "benchmark_sampling",
    "endless_decoder",
    "forward_inputs",
    "host_bound_first",
    "key_id",
    "make_decoder",
    "make_memory",
    "paired",
    "run_suite",
    "warm_up",
]

# Benchmarks of host-bound work run before the others: after torch.compile the process keeps
# inductor's worker processes and hundreds of thousands of objects, and host-bound timings taken
# after it read slower (docs/benchmarks.md, "Order").
HOST_BOUND_FIRST = (
    "test_bench_conformance_suite.py",
    "test_bench_emulation.py",
    "test_bench_plugin_overhead.py",
    "test_bench_recording.py",
    "test_bench_replay_efficiency.py",
)

# compile may reorder bf16 arithmetic, so its logits only agree with its eager step's to within
# this fraction of the largest eager logit (a few bf16 ulps).
COMPILE_TOLERANCE = 5e-2

# Interleaved (slow, fast) call pairs behind a paired speed-up, and the seconds they may take.
PAIRS = 30
PAIRS_BUDGET_S = 5.0

# The samplers' workload: SAMPLE_BATCHES rows from the start token to SAMPLE_MAX_LEN tokens (it
# crosses one sequence bucket: keys (Bb, 64) and (Bb, 128)), timed over SAMPLE_ROUNDS rounds.
SAMPLE_BATCHES = [1, 8, 64]
SAMPLE_MAX_LEN = 128
SAMPLE_ROUNDS = 3
SAMPLE_SEED = 0


def key_id(key: tuple[int, int]) -> str:
    return f"{key[0]}x{key[1]}"


def endless_decoder(device: torch.device) -> Decoder:
    """The benchmark decoder with its head rigged never to choose END (bias -1e4 there), so every
    row runs to SAMPLE_MAX_LEN: tokens per second then measures the step loop, not
    the luck of when END is drawn."""
    decoder = make_decoder(device)
    with torch.no_grad():
        decoder.head[-1].bias[decoder.config.end_token] = -1e4
    return decoder


def benchmark_sampling(
    benchmark: Any, sampler: ARSampler | KVSampler, batch: int, **info: Any
) -> list[list[int]]:
    """Time ``sampler.sample`` for ``batch`` rows from the start token to SAMPLE_MAX_LEN, seeded
    with SAMPLE_SEED (a warm-up round first: it captures the graphs when they are on); returns
    the sampled rows. Stores ``info``, the batch and the tokens sampled in
    ``benchmark.extra_info``."""
    config = sampler.config
    memory, mask = make_memory(config, sampler.device, SAMPLE_SEED)
    prefixes = [[config.start_token]] * batch

    def arguments():
        generator = torch.Generator(sampler.device).manual_seed(SAMPLE_SEED)
        return (memory, mask, prefixes, generator), {"max_len": SAMPLE_MAX_LEN}

    rows = benchmark.pedantic(
        sampler.sample, setup=arguments, rounds=SAMPLE_ROUNDS, warmup_rounds=1
    )
    tokens = sum(len(row) - 1 for row in rows)
    assert tokens == batch * (SAMPLE_MAX_LEN - 1), "a row stopped early: the END rig did not hold"
    benchmark.extra_info.update(info, batch=batch, tokens=tokens)
    return rows


@dataclass(frozen=True)
class SuiteRun:
    """One run of the conformance suite in a fresh process: ``suite_s`` is its time as pytest
    counts it (the session time in its JUnit report: interpreter start, torch's import and
    loading the target's module come before it), ``wall_s`` the whole process's."""

    returncode: int
    output: str
    suite_s: float
    wall_s: float
    passed: int
    skipped: int
    failed: int


def run_suite(
    target: str, junit: Path, *options: str, env: Mapping[str, str] | None = None
) -> SuiteRun:
    """The suite on ``target`` with ``options``, in a fresh pytest process with ``env`` on top
    of this one's; AssertionError when it wrote no JUnit report."""
    # A clean child: not an xdist worker, no options of ours leaking in.
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "pytest_cudagraph.conformance",
        "--cudagraph-target", target, "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
        *options,
    ]  # fmt: skip
    start = time.perf_counter()
    finished = subprocess.run(
        command, env={**child_env, **(env or {})}, capture_output=True, text=True, timeout=600
    )
    wall_s = time.perf_counter() - start
    output = finished.stdout + finished.stderr
    assert junit.exists(), f"the suite wrote no report:\n{output[-3000:]}"
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {name: int(suite.get(name, 0)) for name in ("tests", "failures", "errors", "skipped")}
    failed = counts["failures"] + counts["errors"]
    return SuiteRun(
        returncode=finished.returncode,
        output=output,
        suite_s=float(suite.get("time")),
        wall_s=wall_s,
        passed=counts["tests"] - failed - counts["skipped"],
        skipped=counts["skipped"],
        failed=failed,
    )


def cuda_ms(call: Callable[[], Any]) -> float:
    """Milliseconds of one ``call`` alone on the device, between CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@dataclass(frozen=True)
class Paired:
    """Interleaved (slow, fast) timings: ``speedup`` is the median of the per-pair ratios
    slow ms / fast ms, ``slow_ms`` and ``fast_ms`` the medians of each side."""

    speedup: float
    slow_ms: float
    fast_ms: float
    pairs: int


def paired(
    slow: Callable[[], Any], fast: Callable[[], Any], timer: Callable[..., float] = cuda_ms
) -> Paired:
    """Time ``slow`` and ``fast`` in interleaved pairs (``timer(call)`` gives one call's ms):
    both calls of a pair see the same clocks and temperature, so drift that a comparison of
    two separately timed medians would take for a difference cancels. PAIRS pairs, fewer when
    they would take more than PAIRS_BUDGET_S (at least 5)."""
    first = timer(slow) + timer(fast)
    count = max(5, min(PAIRS, int(PAIRS_BUDGET_S * 1e3 / first)))
    timings = [(timer(slow), timer(fast)) for _ in range(count)]
    return Paired(
        speedup=statistics.median(s / f for s, f in timings),
        slow_ms=statistics.median(s for s, _ in timings),
        fast_ms=statistics.median(f for _, f in timings),
        pairs=count,
    )


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


def host_bound_first(items: list[Any], folder: Path) -> None:
    """Reorder ``items`` in place: of those in ``folder``, HOST_BOUND_FIRST's modules first,
    each group in its own order; the slots of items elsewhere are left alone."""
    slots = [index for index, item in enumerate(items) if item.path.parent == folder]
    ordered = sorted(
        (items[index] for index in slots), key=lambda item: item.path.name not in HOST_BOUND_FIRST
    )
    for index, item in zip(slots, ordered, strict=True):
        items[index] = item
