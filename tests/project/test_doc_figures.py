"""The run's figures in the docs' prose are the committed baseline's: each claim below is the
sentence a doc must hold, its figures computed from the baseline JSON with the report's own
functions. A new baseline changes them, and this test names each sentence to update.
reports/bench-h200.md must be the report script's output over that JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import bench_report as report
import pytest

ROOT = Path(__file__).resolve().parents[2]
[BASELINE] = sorted((ROOT / "benchmarks" / "baseline").glob("*H200/baseline.json"))
RUN = json.loads(BASELINE.read_text())
ENTRIES = report.load_entries(RUN)
FORWARD = report.forward_by_key(ENTRIES)
SATURATED = (256, 512)


def figure(variant: str, key: tuple[int, int], name: str) -> float:
    return FORWARD[key][variant][name]


def span(values: list[float], digits: int, unit: str = "") -> str:
    """``lo{unit} to hi{unit}``, each with ``digits`` decimals."""
    return f"{min(values):.{digits}f}{unit} to {max(values):.{digits}f}{unit}"


def ms_ratios(numerator: str, denominator: str) -> dict[tuple[int, int], float]:
    """Per key, numerator's median over denominator's (above 1: the denominator is faster)."""
    return {
        key: by[numerator]["median_ms"] / by[denominator]["median_ms"]
        for key, by in FORWARD.items()
        if numerator in by and denominator in by
    }


def efficiency(step: str, key: tuple[int, int], name: str = "efficiency") -> float:
    [found] = report.select(ENTRIES, bench="replay_efficiency", step=step, key=key)
    return found[name]


def overhead(**where: object) -> dict:
    [found] = report.select(ENTRIES, bench="plugin_overhead", **where)
    return found


def commit_claim() -> str:
    commit = RUN["commit_info"]
    state = "with uncommitted changes: `--check` refuses it" if commit["dirty"] else "a clean tree"
    return f"Its `commit_info` names {commit['id'][:7]}, {state}"


def verdict_claim() -> str:
    verdicts = [result.verdict for result in report.judge_goals(ENTRIES).values()]
    met, missed = verdicts.count("met"), verdicts.count("missed")
    return f"it meets {met}, misses {missed} and leaves {len(verdicts) - met - missed} unmeasured"


def own_eager_claims() -> list[str]:
    lean, exact = (figure(v, SATURATED, "speedup_vs_own_eager") for v in ("lean_graph", "graph"))
    below = [
        FORWARD[key][variant]["speedup_vs_own_eager"]
        for key in FORWARD
        if key < SATURATED
        for variant in ("graph", "lean_graph")
    ]
    return [
        f"its own eager step at (256, 512): paired {lean:.3f}** (the exact graph: {exact:.3f})",
        f"Below that key a graph is {span(below, 2, 'x')} faster than its own eager step",
    ]


def efficiency_claims() -> list[str]:
    ops = [efficiency(step, (1, 64), "device_ops_per_call") for step in report.STEP_KINDS]
    above = [efficiency(s, k) for s in report.STEP_KINDS for k in report.FORWARD_KEYS[1:]]
    return [
        f"Replay efficiency at (1, 64): {efficiency('lean', (1, 64)):.3f} for the lean step** "
        f"(the exact step: {efficiency('exact', (1, 64)):.3f})",
        f"A call there is {min(ops)} to {max(ops)} device operations",
        f"From (8, 64) up the figure is {span(above, 3)}",
        f"in the committed run they are {efficiency('exact', (1, 64), 'device_ops_per_call')} and "
        f"{efficiency('exact', (8, 64), 'device_ops_per_call')}, at an efficiency of "
        f"{efficiency('exact', (1, 64)):.3f} and {efficiency('exact', (8, 64)):.3f}",
    ]


def nvml_figures() -> tuple[float, int]:
    full = overhead(variant="nvml_reading", reading="baseline")
    return full["median_ms"], full["tracked_objects"]


def compile_claims() -> list[str]:
    fast = ms_ratios("compile", "lean_graph")
    exact = ms_ratios("compile", "graph")
    wins = [key for key, ratio in exact.items() if ratio >= 1]
    loses = [ratio for ratio in exact.values() if ratio < 1]
    every = "at every key" if min(fast.values()) >= 1 else "NOT at every key"
    return [
        f"the lean graph is {span(list(fast.values()), 2, 'x')} faster {every}",
        f"the exact graph is faster only at {' and '.join(map(str, wins))} "
        f"({' and '.join(f'{exact[k]:.2f}x' for k in wins)}) and {span(loses, 2, 'x')} of it above",
    ]


def parity_claim() -> str:
    exact, lean = (
        overhead(variant="parity_check", device="cuda", step=s) for s in ("exact", "lean")
    )
    return (
        f"the 64-case parity check of the exact step, {exact['median_s']:.3f} s (the lean "
        f"step's {lean['median_s']:.3f} s)"
    )


def lean_claims() -> list[str]:
    rel = [by["lean_eager"]["max_rel_diff"] for by in FORWARD.values()]
    agreement = [100 * by["lean_eager"]["argmax_agreement"] for by in FORWARD.values()]
    build = [figure("lean_graph", key, "capture_s") for key in ((1, 64), SATURATED)]
    compile_s = [by["compile"]["compile_s"] for by in FORWARD.values()]
    return [
        "faster than `torch.compile` of the upstream step on the same weights at every benchmark "
        f"key, {span(list(ms_ratios('compile', 'lean_graph').values()), 2, 'x')} (medians)",
        f"stays between {span(rel, 4).replace(' to ', ' and ')} in the committed run, and picks "
        f"upstream's argmax in {min(agreement):.3g} to {max(agreement):.3g}% of rows",
        f"{span(list(ms_ratios('graph', 'lean_graph').values()), 2, 'x')} faster per step than "
        "the exact graphs",
        f"{build[0]:.3f} s at (1, 64) and {build[1]:.3f} s at (256, 512) on the H200",
        f"spent {span(compile_s, 1)} s per key on the same weights in the same run",
    ]


def benchmarks_claims() -> list[str]:
    nvml_ms, objects = nvml_figures()
    eager_16 = FORWARD[(16, 128)]
    return [
        commit_claim(),
        verdict_claim(),
        *own_eager_claims(),
        *efficiency_claims(),
        f"The NVML reading with a full collection: {nvml_ms:.0f} ms**, with {objects:,} objects",
        parity_claim(),
        *compile_claims(),
        f"bf16-weight eager step at (16, 128) took {eager_16['eager_bf16']['median_ms']:.3f} ms "
        f"where upstream eager took {eager_16['eager']['median_ms']:.3f} ms",
    ]


def plugin_claims() -> list[str]:
    nvml_ms, objects = nvml_figures()
    return [
        f"({nvml_ms:.0f} ms a reading on the H200 host with torch and inductor loaded, {objects:,}"
    ]


def emulation_claims() -> list[str]:
    """The emulation goal, measured on a CPU machine (benchmarks/cpu/emulation.json)."""
    run = json.loads((ROOT / "benchmarks" / "cpu" / "emulation.json").read_text())
    [bench] = run["benchmarks"]
    info = bench["extra_info"]
    return [
        f"at {run['commit_info']['id'][:7]} (a clean tree, `benchmarks/cpu/emulation.json`): "
        f"`vs_dry_run` {info['vs_dry_run']:.2f}, the emulated suite {info['suite_s']:.2f} s "
        f"against its dry run's {info['dry_run_s']:.2f} s"
    ]


CLAIMS: dict[str, Callable[[], list[str]]] = {
    "docs/benchmarks.md": lambda: [*benchmarks_claims(), *emulation_claims()],
    "docs/lean.md": lean_claims,
    "docs/plugin.md": plugin_claims,
}


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("doc", sorted(CLAIMS))
def test_the_docs_figures_are_the_committed_runs(doc: str) -> None:
    text = flat((ROOT / doc).read_text())
    missing = [claim for claim in CLAIMS[doc]() if flat(claim) not in text]
    assert not missing, f"{doc} should say, from {BASELINE.relative_to(ROOT)}:\n" + "\n".join(
        missing
    )


def test_the_committed_report_is_the_scripts_output_over_the_baseline() -> None:
    committed = (ROOT / "reports" / "bench-h200.md").read_text()
    assert committed == report.render_markdown(RUN), (
        "reports/bench-h200.md is stale: python scripts/bench_report.py "
        f"{BASELINE.relative_to(ROOT)} --out reports/bench-h200.md"
    )
