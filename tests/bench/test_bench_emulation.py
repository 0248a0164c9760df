"""What judging emulated CUDA graphs costs the conformance suite on the CPU, on the graphed-layer
example (``make_graphed_callables`` around an encoder layer).

Without CUDA the suite runs the checks that judge graphs on graphs emulated on the CPU
(``--cudagraph-emulate``, on by default there); off, it runs the CPU dry run and the contract.
``vs_dry_run`` is the emulated suite's time over the dry run's, each as pytest counts it (both
sessions start with torch imported: neither pays it), each run in a fresh process with every GPU
hidden, so that the figure is the CPU's on any host: the median over interleaved rounds of the
two, so that both see the same load on a shared machine.
"""

from __future__ import annotations

import statistics

import pytest
from bench_workloads import SuiteRun, run_suite

GRAPHED_LAYER = "pytest_cudagraph.examples.graphed_layer_target:make_target"
ROUNDS = 3
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.slow  # whole suite runs, emulated ones of many seconds
def test_emulation_overhead(benchmark, tmp_path):
    runs: dict[str, list[SuiteRun]] = {"off": [], "on": []}

    def suite(emulate: str) -> None:
        junit = tmp_path / f"{emulate}-{len(runs[emulate])}.xml"
        run = run_suite(GRAPHED_LAYER, junit, "--cudagraph-emulate", emulate, env=CPU_ONLY)
        assert run.returncode == 0, f"the suite failed, emulation {emulate}:\n{run.output[-3000:]}"
        runs[emulate].append(run)

    # Each timed round (emulated) follows its own dry run (the untimed setup): one pair a round.
    benchmark.pedantic(suite, args=("on",), setup=lambda: suite("off"), rounds=ROUNDS)
    pairs = list(zip(runs["off"], runs["on"], strict=True))
    dry_run, emulated = runs["off"][-1], runs["on"][-1]
    # Emulation runs the checks that judge graphs, which the dry run skips.
    assert emulated.passed > dry_run.passed, (dry_run, emulated)
    benchmark.extra_info.update(
        bench="emulation",
        target=GRAPHED_LAYER,
        vs_dry_run=statistics.median(on.suite_s / off.suite_s for off, on in pairs),
        suite_s=statistics.median(on.suite_s for _, on in pairs),
        dry_run_s=statistics.median(off.suite_s for off, _ in pairs),
        dry_run_wall_s=statistics.median(off.wall_s for off, _ in pairs),
        pairs=len(pairs),
        passed=emulated.passed,
        skipped=emulated.skipped,
        dry_run_passed=dry_run.passed,
    )
