"""The benchmarks against the report's plan, and their interleaved pairs with a fake timer (CPU).

The GPU benchmarks themselves run on a CUDA host (docs/benchmarks.md); what is checked here is
what they are made of: every variant the report lays out and judges is a benchmark variant,
every goal's benchmark records its figure, compile comes before the graphs at each key, and the
pairing's arithmetic.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest
import test_bench_ar_forward as ar_forward
import test_bench_kv_step as kv_step
from bench_report import BASELINED, FORWARD_VARIANTS, GOALS, PAIRED_COMPARISONS
from bench_workloads import PAIRS, PAIRS_BUDGET_S, paired


def variant_names() -> list[str]:
    return [v if isinstance(v, str) else v.values[0] for v in ar_forward.VARIANTS]


def test_every_variant_the_report_reads_is_benchmarked():
    benchmarked = set(variant_names())
    assert set(FORWARD_VARIANTS) == benchmarked
    forward = [g for g in GOALS.values() if g.where.get("bench") == "ar_forward"]
    judged = {g.where["variant"] for g in forward if "variant" in g.where}
    judged |= {v for g in forward for v in g.every.get("variant", ())}
    assert judged <= benchmarked
    assert {variant for variant, _, _ in PAIRED_COMPARISONS} <= benchmarked


def test_every_goals_benchmark_records_its_figure():
    """Read from the benchmarks' source, which the GPU ones need a CUDA host to run: each bench
    a goal or the report's baselined table reads is tagged by one file, which names each figure
    read from it (a median is pytest-benchmark's own)."""
    sources = {path.name: path.read_text() for path in Path(__file__).parent.glob("test_*.py")}
    read = [(goal.where["bench"], goal.figure) for goal in GOALS.values()]
    read += [(bench, name) for bench, names in BASELINED.items() for name in names]
    for bench, figure in read:
        [tagged] = [name for name, text in sources.items() if f'bench="{bench}"' in text]
        assert figure == "median_s" or figure in sources[tagged], (bench, figure)


def test_compile_runs_before_any_graph_of_its_key_and_is_marked_slow():
    """A graph alive while compile's trees record has crashed the process (docs/lean.md)."""
    names = variant_names()
    last_compile = max(names.index(v) for v in ar_forward.COMPILED)
    assert last_compile < min(names.index(v) for v in ("graph", "lean_graph"))
    slow = [
        v.values[0]
        for v in ar_forward.VARIANTS
        if not isinstance(v, str) and [m.name for m in v.marks] == ["slow"]
    ]
    assert slow == list(ar_forward.COMPILED)
    # compile of the upstream step is paired with the exact graph, of the lean step with the
    # lean graph: each compiles the very step its partner graph replays.
    assert ar_forward.COMPILED == {"compile": False, "compile_lean": True}


class FakeTimer:
    """``timer(call)``: the next of that call's scripted milliseconds, in call order."""

    def __init__(self, **ms: list[float]) -> None:
        self.scripts = {name: itertools.cycle(values) for name, values in ms.items()}
        self.calls: list[str] = []

    def __call__(self, call) -> float:
        self.calls.append(call.__name__)
        return next(self.scripts[call.__name__])


def eager() -> None: ...


def graph() -> None: ...


def test_pairs_interleave_the_two_calls_and_take_medians():
    timer = FakeTimer(eager=[10.0, 14.0, 12.0], graph=[2.0, 2.0, 4.0])
    result = paired(eager, graph, timer)
    assert result.pairs == PAIRS  # the first pair took 12 ms: well inside the budget
    assert timer.calls == ["eager", "graph"] * (PAIRS + 1)
    # The pairs (after the first, the sizing pair) cycle through (14, 2), (12, 4), (10, 2).
    timings = [(14.0, 2.0), (12.0, 4.0), (10.0, 2.0)] * (PAIRS // 3)
    assert result.speedup == pytest.approx(statistics.median(e / g for e, g in timings))
    assert result.speedup == pytest.approx(5.0)  # not 12 / 2, the ratio of the medians
    assert (result.slow_ms, result.fast_ms) == (12.0, 2.0)


@pytest.mark.parametrize(("first_ms", "pairs"), [(PAIRS_BUDGET_S * 1e3 / 7.5, 7), (1e5, 5)])
def test_pairs_are_fewer_when_the_first_pair_is_slow_but_at_least_five(first_ms, pairs):
    timer = FakeTimer(eager=[first_ms / 2], graph=[first_ms / 2])
    assert paired(eager, graph, timer).pairs == pairs


def test_the_kv_steps_compile_runs_first_at_each_batch_and_is_marked_slow():
    """Its partner graphs are captured inside it, after compile; the GPU recipe's compile step
    selects it by its id (-k compile)."""
    compile_, *graphs = kv_step.VARIANTS
    assert compile_.values == ("compile",) and [m.name for m in compile_.marks] == ["slow"]
    assert graphs == ["graph"]
