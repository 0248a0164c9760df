"""Turn a pytest-benchmark JSON written by tests/bench into a markdown report and a PNG plot.

    python scripts/bench_report.py BENCH.json [MORE.json ...] --out reports/bench-h200.md --plot reports/bench-h200.png

The benchmarks describe themselves in ``extra_info`` (``bench``, ``variant``, ``key``, ...) and
store the ratios they computed within their run (``speedup_vs_eager``, ...); this script only
lays those figures out and judges them against ``GOALS`` (``--check``: exit 1 unless every goal
is met, at every key, step and target it names, on a run recorded at a clean commit). Speed
goals live here, never in unit tests. The plot needs matplotlib, which is
not a dependency of the package: without it the markdown is still written and the plot is
skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

# The bound reasyn_ref.lean.LEAN_TOLERANCE states for the lean step's logits (largest absolute
# difference from the upstream step over the largest absolute upstream logit). Kept here so
# that the report needs neither torch nor the package; tests/scripts/test_bench_report.py holds
# the two equal.
LEAN_TOLERANCE = 3e-2


# The benchmark plan: what a full run of tests/bench measures, and so what an "every key",
# "every step" or "every target" goal needs measured. tests/bench imports these (this script
# needs neither torch nor the package to run).
FORWARD_KEYS = ((1, 64), (8, 64), (16, 128), (64, 128), (256, 512))  # (batch, sequence)
STEP_KINDS = ("exact", "lean")  # the graph cache's two steps: upstream-exact and lean
SUITE_TARGETS = ("reasyn", "reasyn-lean")  # the bundled conformance targets timed
KV_BATCHES = (1, 8, 64)  # the batches the KV decoder's step is timed at
EVERY_KEY = {"key": FORWARD_KEYS}


@dataclass(frozen=True)
class Goal:
    """A threshold on one figure of the entries matching ``where``. ``every`` maps fields to
    the values each of which an entry must cover (every key, every step, every target): one
    not measured leaves the goal incomplete. Where several entries match, the worst counts."""

    threshold: float
    figure: str
    where: dict[str, Any] = field(default_factory=dict)
    at_least: bool = True
    every: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def admits(self, entry: dict[str, Any]) -> bool:
        return all(_field(entry, k) == _plain(v) for k, v in self.where.items()) and all(
            _field(entry, k) in values for k, values in self.every.items()
        )

    def judge(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold

    def required(self) -> list[dict[str, Any]]:
        """One dict of field values per entry the goal needs (one empty dict without
        ``every``)."""
        names = list(self.every)
        return [dict(zip(names, values, strict=True)) for values in product(*self.every.values())]


def _plain(value: Any) -> Any:
    """JSON gives keys as lists; goals and the plan write them as tuples."""
    return tuple(value) if isinstance(value, list) else value


def _field(entry: dict[str, Any], name: str) -> Any:
    return _plain(entry.get(name))


def _forward(variant: str, **where: Any) -> dict[str, Any]:
    return {"bench": "ar_forward", "variant": variant, **where}


# The project's goals, written before the runs that judge them; a goal a run misses is reported
# missed and keeps its threshold (docs/benchmarks.md gives their history). "Exact graph": the
# graph cache of the upstream-bit-identical step; "lean graph": the graph cache of the lean
# step; "own eager": the eager step a graph replays. "Paired": the median over interleaved
# calls of the two sides, so that both see the same clocks.
GOALS: dict[str, Goal] = {
    "exact graph vs upstream eager at (1, 64)": Goal(
        5.0, "speedup_vs_eager", _forward("graph", key=(1, 64))
    ),
    "exact graph vs upstream eager at (8, 64)": Goal(
        4.5, "speedup_vs_eager", _forward("graph", key=(8, 64))
    ),
    "exact graph vs its own eager, every key (paired)": Goal(
        1.0, "speedup_vs_own_eager", _forward("graph"), every=EVERY_KEY
    ),
    "exact graph vs torch.compile of the upstream step at (8, 64) (paired)": Goal(
        1.0, "graph_speedup_paired", _forward("compile", key=(8, 64))
    ),
    "exact graph build s, every key": Goal(
        1.0, "capture_s", _forward("graph"), at_least=False, every=EVERY_KEY
    ),
    "lean graph vs torch.compile of the lean step, every key (paired)": Goal(
        1.0, "graph_speedup_paired", _forward("compile_lean"), every=EVERY_KEY
    ),
    "lean graph graph vs its own eager, every key (paired)": Goal(
        1.0, "speedup_vs_own_eager", _forward("lean_graph"), every=EVERY_KEY
    ),
    "lean graph logits vs upstream, max relative difference, every key": Goal(
        LEAN_TOLERANCE, "max_rel_diff", _forward("lean_eager"), at_least=False, every=EVERY_KEY
    ),
    "lean graph build s, every key": Goal(
        1.0, "capture_s", _forward("lean_graph"), at_least=False, every=EVERY_KEY
    ),
    # A build runs three warm-ups and a capture, about four of its eager steps: twice that.
    "graph build in its own eager steps, every key, both steps": Goal(
        8.0,
        "build_in_eager_steps",
        {"bench": "ar_forward"},
        at_least=False,
        every={"variant": ("graph", "lean_graph"), **EVERY_KEY},
    ),
    "replay efficiency, every key, both steps": Goal(
        0.9, "efficiency", {"bench": "replay_efficiency"}, every={**EVERY_KEY, "step": STEP_KINDS}
    ),
    "sampler tokens/s, graphs on vs off at batch 8": Goal(
        3.0, "speedup_vs_eager", {"bench": "sampler", "variant": "graph", "batch": 8}
    ),
    "incremental graphed vs full-recompute graphed sampler at batch 64": Goal(
        4.0, "speedup_vs_full_graph", {"bench": "incremental", "variant": "graph", "batch": 64}
    ),
    # A step of at most 0.5 ms with the draw, on the way to 4,000.
    "incremental graphed sampler tokens/s at batch 1": Goal(
        2000.0, "tokens_per_s", {"bench": "incremental", "variant": "graph", "batch": 1}
    ),
    "KV step graph vs torch.compile of the same step, every batch (paired)": Goal(
        1.0,
        "graph_speedup_paired",
        {"bench": "kv_step", "variant": "compile"},
        every={"batch": KV_BATCHES},
    ),
    "64-case parity check on the GPU, seconds, every step": Goal(
        0.5,
        "median_s",
        {"bench": "plugin_overhead", "variant": "parity_check", "device": "cuda"},
        at_least=False,
        every={"step": STEP_KINDS},
    ),
    "parity checker's own share of a 64-case GPU check, seconds, every step": Goal(
        0.1,
        "checker_s",
        {"bench": "plugin_overhead", "variant": "parity_check", "device": "cuda"},
        at_least=False,
        every={"step": STEP_KINDS},
    ),
    "NVML reading with a full collection (a baseline's), seconds": Goal(
        0.05,
        "median_s",
        {"bench": "plugin_overhead", "variant": "nvml_reading", "reading": "baseline"},
        at_least=False,
    ),
    "conformance suite, seconds as pytest counts them, every target": Goal(
        10.0,
        "suite_s",
        {"bench": "conformance_suite"},
        at_least=False,
        every={"target": SUITE_TARGETS},
    ),
    "conformance suite failures, every target": Goal(
        0, "failed", {"bench": "conformance_suite"}, at_least=False, every={"target": SUITE_TARGETS}
    ),
    # The suite on a compiled example (torch.compile, cudagraph trees) over what the example's
    # own code takes to compile and capture its graph: each in a fresh process.
    "conformance suite on the compiled decode-token example vs its own compile and capture": Goal(
        2.0, "vs_compile_and_capture", {"bench": "compiled_example"}, at_least=False
    ),
    # The suite on the CPU judging emulated graphs, over the same suite with emulation off (the
    # dry run and the contract): each in a fresh process, in interleaved rounds.
    "conformance suite on the graphed-layer example, emulated vs its CPU dry run (paired)": Goal(
        3.0, "vs_dry_run", {"bench": "emulation"}, at_least=False
    ),
    # A capture of the exact graph under CaptureCounter(record=True) over one under
    # CaptureCounter(): what recording what a capture reads costs the capture.
    "capture recorded vs unrecorded, exact graph, every key (paired)": Goal(
        1.5, "recording_overhead", {"bench": "recording"}, at_least=False, every=EVERY_KEY
    ),
    # Everything load_checkpoint checks (the archive's CRCs, names, shapes, dtypes, finite
    # values) and builds, over reading the same file with torch.load alone.
    "checkpoint load vs a bare torch.load of the file, upstream config (paired)": Goal(
        3.0, "vs_bare_load", {"bench": "checkpoint_load"}, at_least=False
    ),
}

# The AR forward variants in the order the tables give them, and their names there.
FORWARD_VARIANTS = {
    "eager": "upstream eager",
    "eager_bf16": "eager, bf16 weights",
    "compile": "compile (upstream step)",
    "graph": "exact graph",
    "lean_eager": "lean eager",
    "compile_lean": "compile (lean step)",
    "lean_graph": "lean graph",
}
# The faster of the two eager steps of the exact path at a key: not a benchmark of its own.
BEST_EAGER = "best eager"
# The plot's bars per key, in order: (variant or BEST_EAGER, legend label).
PLOT_BARS = (
    ("eager", "upstream eager (fp32 weights, bf16 autocast)"),
    (BEST_EAGER, "best eager (faster of upstream and bf16 weights)"),
    ("compile", 'torch.compile "reduce-overhead" of the upstream step, bf16 weights'),
    ("graph", "exact graph (bit-identical to upstream)"),
    ("compile_lean", 'torch.compile "reduce-overhead" of the lean step'),
    ("lean_graph", "lean graph (graph of the lean step)"),
)
# The head-to-heads of medians the prose under the AR forward tables states, key by key.
COMPARISONS = (
    ("lean_graph", "compile_lean", "The lean graph against compile of the lean step"),
    ("lean_graph", "compile", "The lean graph against compile of the upstream step"),
    ("graph", "compile", "The exact graph against compile of the upstream step"),
    ("lean_graph", "graph", "The lean graph against the exact graph"),
    ("graph", BEST_EAGER, "The exact graph against the best eager"),
)
# The benchmarks that set something against its own baseline in the same run: bench -> (its
# figure, the seconds measured, the baseline's seconds), as their entries name them.
BASELINED = {
    "compiled_example": ("vs_compile_and_capture", "suite_s", "compile_and_capture_s"),
    "emulation": ("vs_dry_run", "suite_s", "dry_run_s"),
    "recording": ("recording_overhead", "recorded_capture_s", "unrecorded_capture_s"),
}
# The paired head-to-heads: (the entry's variant, its paired figure, what the figure says).
PAIRED_COMPARISONS = (
    ("compile_lean", "graph_speedup_paired", "The lean graph against compile of the lean step"),
    ("compile", "graph_speedup_paired", "The exact graph against compile of the upstream step"),
    ("graph", "speedup_vs_own_eager", "The exact graph against its own eager step"),
    ("lean_graph", "speedup_vs_own_eager", "The lean graph against its own eager step"),
)


@dataclass(frozen=True)
class GoalResult:
    """A goal's worst figure over its matching entries and where it was (empty when its
    entries carry no step, target, key or batch; figure None when no entry measured it), and
    the entries it needs that the run did not measure."""

    goal: Goal
    figure: float | None
    worst_at: str
    unmeasured: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        if self.figure is None:
            return "not measured"
        if not self.goal.judge(self.figure):
            return "missed"
        return "incomplete" if self.unmeasured else "met"


def load_entries(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat dict per benchmark: its extra_info plus its median (``median_s``,
    ``median_ms``). Entries without a ``bench`` tag are not ours and are left out."""
    entries = []
    for benchmark in report.get("benchmarks", []):
        info = dict(benchmark.get("extra_info") or {})
        if "bench" not in info:
            continue
        median = benchmark["stats"]["median"]
        info.update(median_s=median, median_ms=median * 1e3)
        entries.append(info)
    return entries


def select(entries: Iterable[dict[str, Any]], **where: Any) -> list[dict[str, Any]]:
    return [e for e in entries if all(_field(e, k) == _plain(v) for k, v in where.items())]


def judge_goals(entries: list[dict[str, Any]]) -> dict[str, GoalResult]:
    """Each goal's result: the worst figure of the entries it admits, and which of the
    entries it needs were not measured."""
    results = {}
    for name, goal in GOALS.items():
        measured = [e for e in entries if goal.admits(e) and goal.figure in e]
        label = partial(_entry_label, variant="variant" in goal.every)
        unmeasured = tuple(
            label(needed) for needed in goal.required() if needed and not select(measured, **needed)
        )
        if not measured:
            results[name] = GoalResult(goal, None, "", unmeasured)
            continue
        pick = min if goal.at_least else max
        worst = pick(measured, key=lambda e: e[goal.figure])
        results[name] = GoalResult(goal, worst[goal.figure], label(worst), unmeasured)
    return results


def refusals(report: dict[str, Any]) -> list[str]:
    """Why a run cannot be judged: no benchmarks of tests/bench in it, or no clean tree to
    attribute its figures to (pytest-benchmark's ``commit_info``)."""
    found = []
    if not load_entries(report):
        found.append("no benchmarks of tests/bench in this run")
    commit = report.get("commit_info") or {}
    if not commit.get("id"):
        found.append("the run names no commit (commit_info has no id)")
    elif commit.get("dirty"):
        found.append(
            f"the run was recorded on a dirty tree (commit {commit['id'][:7]} with uncommitted "
            "changes): its figures belong to no commit"
        )
    return found


# What makes two runs' machines the same stack (pytest-cudagraph's machine_info).
STACK_FIELDS = ("python_version", "torch", "torch_cuda", "nvidia_driver", "gpus")


def stack_line(machine_info: dict[str, Any]) -> str:
    """Python, torch, CUDA, driver and GPUs, from the machine info pytest-cudagraph adds."""
    counts = Counter(machine_info.get("gpus") or [])
    gpus = ", ".join(gpu if n == 1 else f"{n} x {gpu}" for gpu, n in counts.items()) or "none"
    return (
        f"Python {machine_info.get('python_version', '?')}, "
        f"torch {machine_info.get('torch', '?')}, "
        f"CUDA {machine_info.get('torch_cuda') or 'none'}, "
        f"driver {machine_info.get('nvidia_driver') or 'n/a'}, GPU {gpus}"
    )


def commit_line(commit_info: dict[str, Any]) -> str:
    """The commit a run was recorded at, and whether its tree had uncommitted changes."""
    if not commit_info.get("id"):
        return "unknown"
    dirty = " (dirty: uncommitted changes)" if commit_info.get("dirty") else ""
    return f"{commit_info['id'][:7]}{dirty}"


def render_markdown(report: dict[str, Any]) -> str:
    entries = load_entries(report)
    machine_info = report.get("machine_info", {})
    forward = forward_by_key(entries)
    lines = [
        "# Benchmarks",
        "",
        f"- Stack: {stack_line(machine_info)}",
        f"- Date: {report.get('datetime', '?')}",
        f"- Commit: {commit_line(report.get('commit_info') or {})}",
        "- Medians. AR forward at the default (upstream) config in bf16, memory length 64, one "
        "call per round between device synchronizations; graph and compile times include "
        "input staging and the fp32 copy of the logits.",
        "",
        "## AR forward",
        "",
        "Upstream eager runs the fp32-weight decoder under bf16 autocast; every other variant "
        "runs bf16 weights. The exact graph replays the bf16-weight eager step, bit for bit "
        "equal to upstream eager; the lean graph is the graph of the lean step, within "
        f"{LEAN_TOLERANCE:g} of upstream's logits (largest difference over largest logit). "
        "compile (upstream step) compiles the step the exact graph replays; compile (lean step) "
        "the step the lean graph replays: the same weights, dtypes and work.",
        "",
        *_table(
            ["key", *(f"{name} ms" for name in FORWARD_VARIANTS.values()), "who wins"],
            _forward_rows(forward),
        ),
        "",
        *_who_wins_prose(forward),
        "",
        *_table(
            [
                "key",
                "exact graph / upstream eager",
                "exact graph / own eager (paired)",
                "exact graph / compile, upstream step (paired)",
                "lean graph / own eager (paired)",
                "lean graph / compile, lean step (paired)",
            ],
            _forward_ratio_rows(forward),
        ),
        "",
        *_table(
            [
                "key",
                "exact graph build s",
                "lean graph build s",
                "exact graph build in eager steps",
                "lean graph build in eager steps",
                "compile s, upstream step",
                "compile s, lean step",
                "lean graph max rel diff",
                "lean graph argmax agreement",
                "compile max rel diff, upstream step",
                "compile max rel diff, lean step",
            ],
            _forward_cost_rows(forward),
        ),
        "",
        "## Sampler, end to end",
        "",
        *_table(
            ["batch", "tokens", "graphs off tokens/s", "graphs on tokens/s", "speed-up"],
            _sampler_rows(entries),
        ),
        "",
        "## Incremental sampler (static KV cache)",
        "",
        "The same rigged decoder and lengths as the sampler above; the full-recompute sampler "
        "with graphs on is measured again beside it, in the same run.",
        "",
        *_table(
            [
                "batch",
                "tokens",
                "full-recompute graphed tokens/s",
                "incremental eager tokens/s",
                "incremental graphed tokens/s",
                "incremental graphed / full-recompute graphed",
                "incremental graphed / incremental eager",
                "incremental graphed, compiled blocks, tokens/s",
            ],
            _incremental_rows(entries),
        ),
        "",
        "## KV decoder step",
        "",
        "One step of the KV decoder (cache of 128 positions, memory 64) and the fp32 copy of "
        "its logits, as the sampler runs it: torch.compile of the step (mode default, "
        "fullgraph), the cache's graph of the step, and its graph of the compiled blocks "
        "(its ms from its pairs with compile); each graph against compile in interleaved "
        "pairs, and kernels and device ms per token from the profiler.",
        "",
        *_table(
            [
                "batch",
                "compile ms",
                "graph ms",
                "compiled-blocks graph ms",
                "graph / compile (paired)",
                "compiled-blocks graph / compile (paired)",
                "kernels per token: compile, graph, compiled-blocks graph",
                "device ms per token: compile, graph, compiled-blocks graph",
            ],
            _kv_step_rows(entries),
        ),
        "",
        "## Replay efficiency",
        "",
        "Device time of the kernels and copies of back-to-back graph-cache calls (profiler) "
        "over the wall time of the same calls, timed in separate, un-profiled rounds, for the "
        "exact step's graphs and the lean step's.",
        "",
        *_table(
            ["step", "key", "device ops per call", "device ms", "wall ms", "efficiency"],
            _efficiency_rows(entries),
        ),
        "",
        "## Plugin overhead",
        "",
        *_table(
            ["check", "device", "config", "step", "reading", "tracked objects", "median ms"],
            _overhead_rows(entries),
        ),
        "",
        "## Conformance suite",
        "",
        "One run of the whole suite per target; suite s is the duration pytest reports, wall s "
        "the benchmark's median (interpreter start and collection included).",
        "",
        *_table(
            ["target", "suite s", "wall s", "passed", "skipped", "failed"],
            _conformance_rows(entries),
        ),
        "",
        "## Against their own baselines",
        "",
        "Each figure is the seconds of one thing over its baseline's, both measured in the same "
        "run: the suite on a compiled example over the example's own compile and capture (each "
        "in a fresh process, each compiling from an empty cache), the suite on the CPU judging "
        "emulated graphs over its dry run (medians over interleaved rounds, each in a fresh "
        "process), a capture recorded over one unrecorded (medians over interleaved pairs). "
        "Suite seconds are as pytest reports them.",
        "",
        *_table(
            ["benchmark", "where", "figure", "ratio", "seconds", "baseline seconds", "rounds"],
            _baselined_rows(entries),
        ),
        "",
        "## Goals",
        "",
        *_table(
            ["goal", "threshold", "figure", "worst at", "not measured", "verdict"],
            _goal_rows(judge_goals(entries)),
        ),
        "",
        *(f"Not judged: {reason}." for reason in refusals(report)),
        "",
    ]
    return "\n".join(lines)


def forward_by_key(entries: list[dict[str, Any]]) -> dict[tuple[int, ...], dict[str, Any]]:
    """The AR forward entries by key (in order), then by variant."""
    by_key: dict[tuple[int, ...], dict[str, Any]] = {}
    for e in select(entries, bench="ar_forward"):
        by_key.setdefault(tuple(e.get("key", ())), {})[e.get("variant")] = e
    return dict(sorted(by_key.items()))


def forward_ms(by_variant: dict[str, Any]) -> dict[str, float]:
    """Each measured variant's median ms at one key, plus BEST_EAGER where an eager ran."""
    ms = {v: by_variant[v]["median_ms"] for v in FORWARD_VARIANTS if v in by_variant}
    eagers = [ms[v] for v in ("eager", "eager_bf16") if v in ms]
    if eagers:
        ms[BEST_EAGER] = min(eagers)
    return ms


def who_wins(by_variant: dict[str, Any]) -> str:
    """The fastest variant at one key, and its speed-up over the next fastest."""
    ranking = sorted(
        (ms, FORWARD_VARIANTS[v]) for v, ms in forward_ms(by_variant).items() if v != BEST_EAGER
    )
    if not ranking:
        return "-"
    (best_ms, best), *rest = ranking
    if not rest:
        return f"{best} (alone)"
    next_ms, runner_up = rest[0]
    return f"{best}, {_times(next_ms / best_ms)} over {runner_up}"


def _forward_rows(forward: dict[tuple[int, ...], dict[str, Any]]) -> list[list[str]]:
    return [
        [
            _key(key),
            *(_num(by_variant.get(v, {}).get("median_ms"), 3) for v in FORWARD_VARIANTS),
            who_wins(by_variant),
        ]
        for key, by_variant in forward.items()
    ]


def _verdict_line(title: str, cells: list[tuple[str, bool]]) -> list[str]:
    """``- title: as fast or faster at ...; slower at ....`` from (cell, first side wins)."""
    as_fast = [cell for cell, wins in cells if wins]
    slower = [cell for cell, wins in cells if not wins]
    verdicts = []
    if as_fast:
        verdicts.append(f"as fast or faster at {', '.join(as_fast)}")
    if slower:
        verdicts.append(f"slower at {', '.join(slower)}")
    return [f"- {title}: {'; '.join(verdicts)}."] if verdicts else []


def _who_wins_prose(forward: dict[tuple[int, ...], dict[str, Any]]) -> list[str]:
    """Who is fastest where, each head-to-head of COMPARISONS from the medians, key by key,
    and each of PAIRED_COMPARISONS from the interleaved pairs."""
    ms_by_key = {key: forward_ms(by_variant) for key, by_variant in forward.items()}
    fastest: dict[str, list[tuple[int, ...]]] = {}
    for key, ms in ms_by_key.items():
        timed = {v: t for v, t in ms.items() if v != BEST_EAGER}
        if timed:
            fastest.setdefault(FORWARD_VARIANTS[min(timed, key=timed.get)], []).append(key)
    lines = [f"- Fastest at {_keys(keys)}: {name}." for name, keys in fastest.items()]
    for a, b, title in COMPARISONS:
        cells = [
            (f"{_key(key)} {_times(ms[b] / ms[a])}", ms[a] <= ms[b])
            for key, ms in ms_by_key.items()
            if a in ms and b in ms
        ]
        lines += _verdict_line(title, cells)
    paired = []
    for variant, figure, title in PAIRED_COMPARISONS:
        cells = [
            (f"{_key(key)} {_times(entry[figure], 3)}", entry[figure] >= 1)
            for key, by_variant in forward.items()
            if figure in (entry := by_variant.get(variant, {}))
        ]
        paired += _verdict_line(title, cells)
    if not lines:
        return []
    return [
        "Who wins where, from the medians (each ratio is the other's median ms over the "
        "first's: above 1x the first is faster):",
        "",
        *lines,
        *(
            [
                "",
                "And from interleaved pairs of calls (the median of the per-pair ratios, so "
                "that both sides of each pair see the same clocks; three decimals, as these "
                "sit near 1 where the GPU is saturated):",
                "",
                *paired,
            ]
            if paired
            else []
        ),
    ]


def _forward_ratio_rows(forward: dict[tuple[int, ...], dict[str, Any]]) -> list[list[str]]:
    rows = []
    for key, by_variant in forward.items():
        graph, compiled, lean_graph, compiled_lean = (
            by_variant.get(v, {}) for v in ("graph", "compile", "lean_graph", "compile_lean")
        )
        rows.append(
            [
                _key(key),
                _times(graph.get("speedup_vs_eager")),
                *(
                    _times(entry.get(figure), 3)
                    for entry, figure in (
                        (graph, "speedup_vs_own_eager"),
                        (compiled, "graph_speedup_paired"),
                        (lean_graph, "speedup_vs_own_eager"),
                        (compiled_lean, "graph_speedup_paired"),
                    )
                ),
            ]
        )
    return rows


def _forward_cost_rows(forward: dict[tuple[int, ...], dict[str, Any]]) -> list[list[str]]:
    rows = []
    for key, by_variant in forward.items():
        graph, compiled, lean_eager, compiled_lean, lean_graph = (
            by_variant.get(v, {})
            for v in ("graph", "compile", "lean_eager", "compile_lean", "lean_graph")
        )
        rows.append(
            [
                _key(key),
                _num(graph.get("capture_s"), 3),
                _num(lean_graph.get("capture_s"), 3),
                _num(graph.get("build_in_eager_steps"), 1),
                _num(lean_graph.get("build_in_eager_steps"), 1),
                _num(compiled.get("compile_s"), 1),
                _num(compiled_lean.get("compile_s"), 1),
                _num(lean_eager.get("max_rel_diff"), 4),
                _num(lean_eager.get("argmax_agreement"), 3),
                _num(compiled.get("max_rel_diff"), 4),
                _num(compiled_lean.get("max_rel_diff"), 4),
            ]
        )
    return rows


def _sampler_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    sampler = select(entries, bench="sampler")
    rows = []
    for batch in sorted({e.get("batch", 0) for e in sampler}):
        by_variant = {e.get("variant"): e for e in select(sampler, batch=batch)}
        eager, graph = by_variant.get("eager", {}), by_variant.get("graph", {})
        tokens = eager.get("tokens", graph.get("tokens"))
        rows.append(
            [
                str(batch),
                str(tokens) if tokens is not None else "-",
                _num(eager.get("tokens_per_s"), 0),
                _num(graph.get("tokens_per_s"), 0),
                _times(graph.get("speedup_vs_eager")),
            ]
        )
    return rows


def _incremental_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    incremental = select(entries, bench="incremental")
    rows = []
    for batch in sorted({e.get("batch", 0) for e in incremental}):
        by_variant = {e.get("variant"): e for e in select(incremental, batch=batch)}
        full, eager, graph, compiled = (
            by_variant.get(v, {})
            for v in ("full_recompute_graph", "eager", "graph", "compiled_graph")
        )
        tokens = next((e["tokens"] for e in (full, eager, graph) if "tokens" in e), None)
        rows.append(
            [
                str(batch),
                str(tokens) if tokens is not None else "-",
                _num(full.get("tokens_per_s"), 0),
                _num(eager.get("tokens_per_s"), 0),
                _num(graph.get("tokens_per_s"), 0),
                _times(graph.get("speedup_vs_full_graph")),
                _times(graph.get("speedup_vs_eager")),
                _num(compiled.get("tokens_per_s"), 0),
            ]
        )
    return rows


def _kv_step_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    """Per batch: compile, the graph, and the graph of the compiled blocks (measured in the
    compile benchmark, against it)."""
    measured = select(entries, bench="kv_step")
    rows = []
    for batch in sorted({e.get("batch", 0) for e in measured}):
        by_variant = {e.get("variant"): e for e in select(measured, batch=batch)}
        compile_, graph = by_variant.get("compile", {}), by_variant.get("graph", {})
        rows.append(
            [
                str(batch),
                _num(compile_.get("median_ms"), 3),
                _num(graph.get("median_ms"), 3),
                _num(compile_.get("compiled_graph_ms"), 3),
                _times(compile_.get("graph_speedup_paired"), 3),
                _times(compile_.get("compiled_graph_speedup_paired"), 3),
                ", ".join(
                    str(entry.get(name, "-"))
                    for entry, name in (
                        (compile_, "kernels_per_token"),
                        (graph, "kernels_per_token"),
                        (compile_, "compiled_graph_kernels_per_token"),
                    )
                ),
                ", ".join(
                    _num(entry.get(name), 3)
                    for entry, name in (
                        (compile_, "device_ms_per_token"),
                        (graph, "device_ms_per_token"),
                        (compile_, "compiled_graph_device_ms_per_token"),
                    )
                ),
            ]
        )
    return rows


def _efficiency_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    measured = select(entries, bench="replay_efficiency")
    # The exact step first, then the lean one; keys in order within each.
    measured.sort(key=lambda e: (e.get("step") != "exact", e.get("step", ""), e.get("key", [])))
    return [
        [
            e.get("step", "-"),
            _key(e.get("key", [])),
            str(e.get("device_ops_per_call", "-")),
            _num(e.get("device_ms"), 3),
            _num(e.get("wall_ms"), 3),
            _num(e.get("efficiency"), 3),
        ]
        for e in measured
    ]


def _overhead_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            e.get("variant", "-"),
            e.get("device", "-"),
            e.get("config", "-"),
            e.get("step", "-"),
            e.get("reading", "-"),
            str(e.get("tracked_objects", "-")),
            _num(e["median_ms"], 3),
        ]
        for e in select(entries, bench="plugin_overhead")
    ]


def _conformance_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            e.get("target", "-"),
            _num(e.get("suite_s"), 2),
            _num(e["median_s"], 2),
            *(str(e.get(count, "-")) for count in ("passed", "skipped", "failed")),
        ]
        for e in sorted(
            select(entries, bench="conformance_suite"), key=lambda e: e.get("target", "")
        )
    ]


def _baselined_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for bench, (figure, seconds, baseline) in BASELINED.items():
        measured = select(entries, bench=bench)
        measured.sort(key=lambda e: (e.get("target", ""), e.get("key", [])))
        rows += [
            [
                bench,
                _entry_label(e) or "-",
                f"`{figure}`",
                _times(e.get(figure), 3),
                _num(e.get(seconds), 3),
                _num(e.get(baseline), 3),
                str(e.get("pairs", 1)),
            ]
            for e in measured
        ]
    return rows


def _goal_rows(results: dict[str, GoalResult]) -> list[list[str]]:
    rows = []
    for name, result in results.items():
        sign = ">=" if result.goal.at_least else "<="
        rows.append(
            [
                name,
                f"{sign} {result.goal.threshold:g}",
                _num(result.figure, 3),
                result.worst_at or "-",
                ", ".join(result.unmeasured) or "-",
                result.verdict,
            ]
        )
    return rows


def _entry_label(entry: dict[str, Any], *, variant: bool = False) -> str:
    """Where an entry was measured, in the words of its table: (with ``variant``, the AR
    forward variant's name,) step, target, key, batch."""
    parts = [FORWARD_VARIANTS.get(entry["variant"], entry["variant"])] if variant else []
    parts += [str(entry[f]) for f in ("step", "target") if f in entry]
    if "key" in entry:
        parts.append(_key(entry["key"]))
    if "batch" in entry:
        parts.append(f"batch {entry['batch']}")
    return " ".join(parts)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(not measured in this run)"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _key(key: Iterable[int]) -> str:
    return "(" + ", ".join(str(k) for k in key) + ")"


def _keys(keys: Iterable[Iterable[int]]) -> str:
    return ", ".join(_key(k) for k in keys)


def _num(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _times(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def write_plot(report: dict[str, Any], path: Path) -> bool:
    """Per key, the AR forward's ms of PLOT_BARS side by side on a log axis, each bar
    labelled. False (with a message on stderr) when matplotlib is missing: the plot is
    optional."""
    try:
        import matplotlib
    except ImportError:
        print(
            f"matplotlib is not installed: skipping the plot {path} (pip install matplotlib)",
            file=sys.stderr,
        )
        return False
    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    ms_by_key = {
        key: forward_ms(by_variant)
        for key, by_variant in forward_by_key(load_entries(report)).items()
    }
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / len(PLOT_BARS)
    drawn = []
    for i, (variant, label) in enumerate(PLOT_BARS):
        heights = [ms.get(variant, math.nan) for ms in ms_by_key.values()]
        drawn += [h for h in heights if not math.isnan(h)]
        offset = (i - (len(PLOT_BARS) - 1) / 2) * width
        bars = ax.bar([k + offset for k in range(len(heights))], heights, width, label=label)
        ax.bar_label(
            bars,
            labels=["" if math.isnan(h) else f"{h:.3g}" for h in heights],
            fontsize=7,
            rotation=90,
            padding=2,
        )
    ax.set_xticks(range(len(ms_by_key)), [_key(k) for k in ms_by_key])
    ax.set_xlabel("(batch, sequence) bucket")
    ax.set_ylabel("ms per AR step (median; lower is faster)")
    if drawn:
        ax.set_yscale("log")  # the keys span two orders of magnitude
        ax.set_ylim(min(drawn) / 2, max(drawn) * 4)  # room for the labels above the bars
    else:
        message = "AR forward not measured in this run"
        ax.text(0.5, 0.5, message, ha="center", transform=ax.transAxes)
    stack = stack_line(report.get("machine_info", {}))
    ax.set_title(f"AR forward, bf16: {stack}\n{report.get('datetime', '')}", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def check(report: dict[str, Any]) -> list[str]:
    """What ``--check`` fails on, one line each: why the run cannot be judged, then each goal
    not met (missed, incomplete or not measured). Empty when every goal is met."""
    problems = [f"refused: {reason}" for reason in refusals(report)]
    for name, result in judge_goals(load_entries(report)).items():
        if result.verdict == "missed":
            where = f" at {result.worst_at}" if result.worst_at else ""
            problems.append(f"goal missed: {name}: {result.figure:g}{where}")
        elif result.verdict == "incomplete":
            unmeasured = ", ".join(result.unmeasured)
            problems.append(f"goal incomplete: {name}: not measured at {unmeasured}")
        elif result.verdict == "not measured":
            problems.append(f"goal not measured: {name}")
    return problems


def merge_runs(runs: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """One run from the pytest-benchmark JSONs of one tree on one stack (the GPU recipe's
    benchmark steps, ``(path, report)`` each): their benchmarks together under the first's
    header. JSONs of different commits or stacks are not one run: ValueError naming them."""
    (first_path, first), *others = runs
    for path, report in others:
        for info, fields in (("commit_info", ("id", "dirty")), ("machine_info", STACK_FIELDS)):
            want = {name: (first.get(info) or {}).get(name) for name in fields}
            got = {name: (report.get(info) or {}).get(name) for name in fields}
            if got != want:
                raise ValueError(
                    f"{path} has {info} {got}, {first_path} has {want}: JSONs of different "
                    "commits or stacks are not one run; give the JSONs of one run only"
                )
    merged = dict(first)
    merged["benchmarks"] = [b for _, report in runs for b in report.get("benchmarks", [])]
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "bench_json",
        type=Path,
        nargs="+",
        help="pytest-benchmark JSON(s) of tests/bench: one run, or the parts of one run "
        "(same commit and stack) that the GPU recipe's benchmark steps write",
    )
    parser.add_argument("--out", type=Path, required=True, help="markdown report to write")
    parser.add_argument(
        "--merged",
        type=Path,
        help="also write the JSONs as one pytest-benchmark JSON (the baseline's form)",
    )
    parser.add_argument("--plot", type=Path, help="PNG plot to write (needs matplotlib)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless every goal is met: a goal missed, not measured or measured at "
        "only some of its keys, steps or targets fails, and so does a run without our "
        "benchmarks or recorded on a dirty tree",
    )
    args = parser.parse_args(argv)
    try:
        report = merge_runs([(path, json.loads(path.read_text())) for path in args.bench_json])
    except ValueError as error:
        parser.error(str(error))
    if args.merged is not None:
        args.merged.write_text(json.dumps(report, indent=4))
        print(f"wrote {args.merged}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_markdown(report))
    print(f"wrote {args.out}")
    if args.plot is not None and write_plot(report, args.plot):
        print(f"wrote {args.plot}")
    if args.check:
        problems = check(report)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
