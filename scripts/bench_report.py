"""Turn a pytest-benchmark JSON written by tests/bench into a markdown report and a PNG plot.

    python scripts/bench_report.py BENCH.json --out reports/bench-h200.md --plot reports/bench-h200.png

The benchmarks describe themselves in ``extra_info`` (``bench``, ``variant``, ``key``, ...) and
store the ratios they computed within their run (``speedup_vs_eager``, ...); this script only
lays those figures out and judges them against ``GOALS``. Speed goals live here, never in unit
tests. The plot needs matplotlib, which is not a dependency of the package: without it the
markdown is still written and the plot is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Goal:
    """A threshold on one figure of the entries matching ``where``; when several entries
    match (e.g. every key), the worst of them counts."""

    threshold: float
    figure: str
    where: dict[str, Any] = field(default_factory=dict)
    at_least: bool = True

    def judge(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold


# The goals on the H200 (hand-written graph measured there: 5.4x at (1, 64), 4.2x at
# (8, 64); torch.compile reduce-overhead 0.98 ms at (8, 64) after 12 s of compiling).
GOALS: dict[str, Goal] = {
    "graph vs eager at (1, 64)": Goal(
        5.0, "speedup_vs_eager", {"bench": "ar_forward", "variant": "graph", "key": [1, 64]}
    ),
    "graph vs eager at (8, 64)": Goal(
        4.5, "speedup_vs_eager", {"bench": "ar_forward", "variant": "graph", "key": [8, 64]}
    ),
    "graph vs torch.compile at (8, 64)": Goal(
        1.0, "speedup_vs_compile", {"bench": "ar_forward", "variant": "graph", "key": [8, 64]}
    ),
    "compile s / capture s at (8, 64)": Goal(
        50.0, "compile_over_capture", {"bench": "ar_forward", "variant": "graph", "key": [8, 64]}
    ),
    "replay efficiency, every key": Goal(0.9, "efficiency", {"bench": "replay_efficiency"}),
    "sampler tokens/s, graphs on vs off at batch 8": Goal(
        3.0, "speedup_vs_eager", {"bench": "sampler", "variant": "graph", "batch": 8}
    ),
    "incremental graphed vs full-recompute graphed sampler at batch 64": Goal(
        4.0, "speedup_vs_full_graph", {"bench": "incremental", "variant": "graph", "batch": 64}
    ),
    "64-case parity check on the GPU, seconds": Goal(
        2.0,
        "median_s",
        {"bench": "plugin_overhead", "variant": "parity_check", "device": "cuda"},
        at_least=False,
    ),
}


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
    return [e for e in entries if all(e.get(k) == v for k, v in where.items())]


def goal_figures(entries: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each goal's figure: the worst over its matching entries, None when none measured it."""
    figures: dict[str, float | None] = {}
    for name, goal in GOALS.items():
        values = [e[goal.figure] for e in select(entries, **goal.where) if goal.figure in e]
        worst = min if goal.at_least else max
        figures[name] = worst(values) if values else None
    return figures


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


def render_markdown(report: dict[str, Any]) -> str:
    entries = load_entries(report)
    machine_info = report.get("machine_info", {})
    lines = [
        "# Benchmarks",
        "",
        f"- Stack: {stack_line(machine_info)}",
        f"- Date: {report.get('datetime', '?')}",
        "- Medians. AR forward at the default (upstream) config in bf16 autocast, memory "
        "length 64, one call per round between device synchronizations; graph and compile "
        "times include input staging and the fp32 copy of the logits.",
        "",
        "## AR forward",
        "",
        *_table(
            [
                "key",
                "eager ms",
                "graph ms",
                "compile ms",
                "graph/eager speed-up",
                "compile/eager speed-up",
                "capture s",
                "compile s",
            ],
            _forward_rows(entries),
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
            ],
            _incremental_rows(entries),
        ),
        "",
        "## Replay efficiency",
        "",
        "Device time of the kernels and copies of back-to-back graph-cache calls (profiler) "
        "over the wall time of the same calls, timed in separate, un-profiled rounds.",
        "",
        *_table(
            ["key", "device ops per call", "device ms", "wall ms", "efficiency"],
            _efficiency_rows(entries),
        ),
        "",
        "## Plugin overhead",
        "",
        *_table(["check", "device", "config", "median ms"], _overhead_rows(entries)),
        "",
        "## Goals",
        "",
        *_table(["goal", "threshold", "figure", "verdict"], _goal_rows(goal_figures(entries))),
        "",
    ]
    return "\n".join(lines)


def _forward_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    forward = select(entries, bench="ar_forward")
    rows = []
    for key in sorted({tuple(e.get("key", [])) for e in forward}):
        by_variant = {e.get("variant"): e for e in select(forward, key=list(key))}
        eager, graph, compiled = (by_variant.get(v, {}) for v in ("eager", "graph", "compile"))
        rows.append(
            [
                _key(key),
                _num(eager.get("median_ms"), 3),
                _num(graph.get("median_ms"), 3),
                _num(compiled.get("median_ms"), 3),
                _times(graph.get("speedup_vs_eager")),
                _times(compiled.get("speedup_vs_eager")),
                _num(graph.get("capture_s"), 3),
                _num(compiled.get("compile_s"), 1),
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
        full, eager, graph = (
            by_variant.get(v, {}) for v in ("full_recompute_graph", "eager", "graph")
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
            ]
        )
    return rows


def _efficiency_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for e in sorted(select(entries, bench="replay_efficiency"), key=lambda e: e.get("key", [])):
        rows.append(
            [
                _key(e.get("key", [])),
                str(e.get("device_ops_per_call", "-")),
                _num(e.get("device_ms"), 3),
                _num(e.get("wall_ms"), 3),
                _num(e.get("efficiency"), 3),
            ]
        )
    return rows


def _overhead_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [e.get("variant", "-"), e.get("device", "-"), e.get("config", "-"), _num(e["median_ms"], 3)]
        for e in select(entries, bench="plugin_overhead")
    ]


def _goal_rows(figures: dict[str, float | None]) -> list[list[str]]:
    rows = []
    for name, goal in GOALS.items():
        value = figures[name]
        if value is None:
            verdict = "not measured"
        else:
            verdict = "met" if goal.judge(value) else "missed"
        sign = ">=" if goal.at_least else "<="
        rows.append([name, f"{sign} {goal.threshold:g}", _num(value, 3), verdict])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(not measured in this run)"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _key(key: Iterable[int]) -> str:
    return "(" + ", ".join(str(k) for k in key) + ")"


def _num(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def write_plot(report: dict[str, Any], path: Path) -> bool:
    """Speed-up over eager by shape, for the graph cache and torch.compile. False (with a
    message on stderr) when matplotlib is missing: the plot is optional."""
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

    forward = select(load_entries(report), bench="ar_forward")
    keys = sorted({tuple(e.get("key", [])) for e in forward})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    tallest = 1.0
    for offset, variant in ((-width / 2, "graph"), (width / 2, "compile")):
        speedups = []
        for key in keys:
            found = select(forward, key=list(key), variant=variant)
            speedups.append(found[0].get("speedup_vs_eager", math.nan) if found else math.nan)
        label = "graph cache" if variant == "graph" else 'torch.compile "reduce-overhead"'
        bars = ax.bar([i + offset for i in range(len(keys))], speedups, width, label=label)
        ax.bar_label(bars, labels=["" if math.isnan(s) else f"{s:.2f}x" for s in speedups])
        tallest = max([tallest, *(s for s in speedups if not math.isnan(s))])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="eager")
    ax.set_xticks(range(len(keys)), [_key(k) for k in keys])
    ax.set_xlabel("(batch, sequence) bucket")
    ax.set_ylabel("speed-up over eager")
    ax.set_ylim(0, tallest * 1.3)  # room for the labels and the legend
    stack = stack_line(report.get("machine_info", {}))
    ax.set_title(f"AR forward, bf16: {stack}\n{report.get('datetime', '')}", fontsize=8)
    ax.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", type=Path, help="a pytest-benchmark JSON of tests/bench")
    parser.add_argument("--out", type=Path, required=True, help="markdown report to write")
    parser.add_argument("--plot", type=Path, help="PNG plot to write (needs matplotlib)")
    args = parser.parse_args(argv)
    report = json.loads(args.bench_json.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_markdown(report))
    print(f"wrote {args.out}")
    if args.plot is not None and write_plot(report, args.plot):
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
