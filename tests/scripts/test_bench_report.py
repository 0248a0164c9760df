"""scripts/bench_report.py on synthetic pytest-benchmark JSON built here (CPU, runs in CI)."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys

import pytest
from script_modules import SCRIPTS, script_module

SCRIPT = SCRIPTS / "bench_report.py"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def report_module():
    with script_module("bench_report") as module:
        yield module


def entry(median_s: float, **extra_info) -> dict:
    """One benchmark as pytest-benchmark writes it (the fields the report reads)."""
    return {"extra_info": extra_info, "stats": {"median": median_s}}


CLEAN_COMMIT = {"id": "0123456789abcdef0123456789abcdef01234567", "dirty": False}


def bench_json(benchmarks: list[dict], commit_info: dict | None = None) -> dict:
    return {
        "commit_info": CLEAN_COMMIT if commit_info is None else commit_info,
        "machine_info": {
            "python_version": "3.12.1",
            "torch": "2.11.0+cu130",
            "torch_cuda": "13.0",
            "nvidia_driver": "580.1",
            "gpus": ["NVIDIA H200 (143771 MiB)"],
        },
        "datetime": "2030-01-02T03:04:05.000000+00:00",
        "benchmarks": benchmarks,
    }


# Made-up medians (ms) of the AR forward variants per key, in the ranges the H200 gives.
# Compile of the lean step wins at (64, 128); upstream eager beats the bf16-weight eager at
# (256, 512), where the exact graph is slower than both.
FORWARD_MS = {
    (1, 64): {"eager": 7.7, "eager_bf16": 6.3, "compile": 0.93, "graph": 0.96,
              "lean_eager": 3.1, "compile_lean": 0.70, "lean_graph": 0.62},
    (8, 64): {"eager": 9.1, "eager_bf16": 7.2, "compile": 1.18, "graph": 1.32,
              "lean_eager": 3.4, "compile_lean": 0.90, "lean_graph": 0.85},
    (16, 128): {"eager": 10.9, "eager_bf16": 6.6, "compile": 1.77, "graph": 2.48,
                "lean_eager": 3.5, "compile_lean": 1.5, "lean_graph": 1.4},
    (64, 128): {"eager": 8.5, "eager_bf16": 8.9, "compile": 4.5, "graph": 7.33,
                "lean_eager": 5.6, "compile_lean": 4.3, "lean_graph": 4.6},
    (256, 512): {"eager": 112.4, "eager_bf16": 114.4, "compile": 83.4, "graph": 115.1,
                 "lean_eager": 80.0, "compile_lean": 79.0, "lean_graph": 78.0},
}  # fmt: skip
# Made-up build costs (s) and distances from upstream per key.
FORWARD_COSTS = {
    (1, 64): {"capture_s": 0.03, "build_s": 0.016, "compile_s": 9.5, "compile_lean_s": 7.5,
              "max_rel_diff": 0.006, "argmax_agreement": 1.0, "compile_max_rel_diff": 1e-3,
              "compile_lean_max_rel_diff": 0.007},
    (8, 64): {"capture_s": 0.036, "build_s": 0.018, "compile_s": 12.0, "compile_lean_s": 8.0,
              "max_rel_diff": 0.008, "argmax_agreement": 1.0, "compile_max_rel_diff": 1.5e-3,
              "compile_lean_max_rel_diff": 0.009},
    (16, 128): {"capture_s": 0.033, "build_s": 0.019, "compile_s": 13.0, "compile_lean_s": 8.5,
                "max_rel_diff": 0.009, "argmax_agreement": 0.9375, "compile_max_rel_diff": 2e-3,
                "compile_lean_max_rel_diff": 0.01},
    (64, 128): {"capture_s": 0.045, "build_s": 0.03, "compile_s": 14.0, "compile_lean_s": 9.0,
                "max_rel_diff": 0.01, "argmax_agreement": 0.984, "compile_max_rel_diff": 2e-3,
                "compile_lean_max_rel_diff": 0.011},
    (256, 512): {"capture_s": 0.55, "build_s": 0.4, "compile_s": 17.0, "compile_lean_s": 10.0,
                 "max_rel_diff": 0.012, "argmax_agreement": 0.996, "compile_max_rel_diff": 1e-3,
                 "compile_lean_max_rel_diff": 0.012},
}  # fmt: skip


def ratio(medians: dict[str, float], partner: str, variant: str, name: str) -> dict[str, float]:
    """``{name: partner's median / variant's}`` where both ran, else nothing."""
    if partner not in medians or variant not in medians:
        return {}
    return {name: medians[partner] / medians[variant]}


def forward_benchmarks(
    ms: dict[tuple[int, int], dict[str, float]] = FORWARD_MS,
    costs: dict[tuple[int, int], dict[str, float]] = FORWARD_COSTS,
) -> list[dict]:
    """The AR forward benchmarks as tests/bench records them: each variant's median and, where
    its partners ran at that key, the ratios it computes against them (the paired ones are made
    up here as the ratio of the medians)."""
    benchmarks = []
    for key, medians in ms.items():
        cost = costs[key]
        over = functools.partial(ratio, medians)
        info: dict[str, dict] = {
            "eager": {},
            "eager_bf16": {},
            "compile": {"compile_s": cost["compile_s"],
                        "max_rel_diff": cost["compile_max_rel_diff"],
                        **over("compile", "graph", "graph_speedup_paired"),
                        **over("eager", "compile", "speedup_vs_eager")},
            "compile_lean": {"compile_s": cost["compile_lean_s"],
                             "max_rel_diff": cost["compile_lean_max_rel_diff"],
                             **over("compile_lean", "lean_graph", "graph_speedup_paired"),
                             **over("eager", "compile_lean", "speedup_vs_eager")},
            "graph": {"capture_s": cost["capture_s"],
                      **over("eager", "graph", "speedup_vs_eager"),
                      **over("eager_bf16", "graph", "speedup_vs_own_eager")},
            "lean_eager": {"max_rel_diff": cost["max_rel_diff"],
                           "argmax_agreement": cost["argmax_agreement"],
                           **over("eager", "lean_eager", "speedup_vs_eager")},
            "lean_graph": {"capture_s": cost["build_s"],
                           **over("eager", "lean_graph", "speedup_vs_eager"),
                           **over("lean_eager", "lean_graph", "speedup_vs_own_eager")},
        }  # fmt: skip
        for graph, own, build in (
            ("graph", "eager_bf16", "capture_s"),
            ("lean_graph", "lean_eager", "build_s"),
        ):
            if own in medians and graph in medians:
                info[graph]["build_in_eager_steps"] = cost[build] * 1e3 / medians[own]
        for variant, median_ms in medians.items():
            benchmarks.append(
                entry(median_ms / 1e3, bench="ar_forward", variant=variant, key=list(key),
                      memory_len=64, **info[variant])
            )  # fmt: skip
    return benchmarks


def tables(markdown: str, heading: str) -> list[list[list[str]]]:
    """The tables under ``## heading``, each as its body rows of cells."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found, lines = [], []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            found.append([[c.strip() for c in row.strip("|").split("|")] for row in lines[2:]])
            lines = []
    return found


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under ``## heading``."""
    return tables(markdown, heading)[0]


def goal_rows(markdown: str) -> dict[str, list[str]]:
    return {row[0]: row for row in table_rows(markdown, "Goals")}


def number(cell: str) -> float:
    return float(cell.rstrip("x").replace(",", ""))


def key_cell(key: tuple[int, int]) -> str:
    return f"({key[0]}, {key[1]})"


VARIANTS = ("eager", "eager_bf16", "compile", "graph", "lean_eager", "compile_lean", "lean_graph")


def test_forward_table_gives_every_variant_per_key_and_who_wins(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    rows = {row[0]: row for row in tables(markdown, "AR forward")[0]}
    assert list(rows) == [key_cell(k) for k in FORWARD_MS]
    for key, medians in FORWARD_MS.items():
        cells = rows[key_cell(key)][1:8]
        assert [number(c) for c in cells] == pytest.approx([medians[v] for v in VARIANTS])
    who = {key: row[8] for key, row in rows.items()}
    assert who["(1, 64)"] == "lean graph, 1.13x over compile (lean step)"  # 0.70 / 0.62
    assert who["(64, 128)"] == "compile (lean step), 1.05x over compile (upstream step)"
    assert who["(256, 512)"] == "lean graph, 1.01x over compile (lean step)"  # 79.0 / 78.0


def test_who_wins_with_one_variant_or_none_measured(report_module):
    ms = {(1, 64): {"graph": 0.96}, (8, 64): {"eager": 9.1, "graph": 1.32}}
    markdown = report_module.render_markdown(bench_json(forward_benchmarks(ms)))
    rows = {row[0]: row for row in tables(markdown, "AR forward")[0]}
    assert rows["(1, 64)"][8] == "exact graph (alone)"
    assert rows["(1, 64)"][1:8] == ["-", "-", "-", "0.960", "-", "-", "-"]
    assert rows["(8, 64)"][8] == "exact graph, 6.89x over upstream eager"
    assert report_module.who_wins({}) == "-"


def bullets_by_title(markdown: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The AR forward prose: its "Fastest at" bullets, and the medians' and the pairs'
    head-to-heads by title."""
    section = markdown.split("## AR forward\n", 1)[1].split("\n## ", 1)[0]
    medians, paired = section.split("And from interleaved pairs", 1)
    fastest = [line for line in medians.splitlines() if line.startswith("- Fastest at")]

    def by_title(text: str) -> dict[str, str]:
        return {
            line.split(":", 1)[0][2:]: line.split(":", 1)[1]
            for line in text.splitlines()
            if line.startswith("- ") and not line.startswith("- Fastest at")
        }

    return fastest, by_title(medians), by_title(paired)


def test_prose_says_who_wins_where_from_the_medians_and_the_pairs(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    fastest, medians, paired = bullets_by_title(markdown)
    assert fastest == [
        "- Fastest at (1, 64), (8, 64), (16, 128), (256, 512): lean graph.",
        "- Fastest at (64, 128): compile (lean step).",
    ]
    lean_vs_compile = (
        " as fast or faster at (1, 64) 1.13x, (8, 64) 1.06x, (16, 128) 1.07x, "
        "(256, 512) 1.01x; slower at (64, 128) 0.93x."
    )
    assert medians["The lean graph against compile of the lean step"] == lean_vs_compile
    assert paired["The lean graph against compile of the lean step"] == (
        " as fast or faster at (1, 64) 1.129x, (8, 64) 1.059x, (16, 128) 1.071x, "
        "(256, 512) 1.013x; slower at (64, 128) 0.935x."
    )
    # The best eager is the faster of the two: upstream's 112.4 ms at (256, 512).
    assert medians["The exact graph against the best eager"].endswith("slower at (256, 512) 0.98x.")
    assert paired["The exact graph against its own eager step"].endswith(
        "slower at (256, 512) 0.994x."
    )
    assert set(paired) == {title for _, _, title in report_module.PAIRED_COMPARISONS}


def test_best_eager_is_the_faster_eager_step(report_module):
    entries = report_module.load_entries(bench_json(forward_benchmarks()))
    forward = report_module.forward_by_key(entries)
    best = report_module.BEST_EAGER
    assert report_module.forward_ms(forward[(1, 64)])[best] == pytest.approx(6.3)
    assert report_module.forward_ms(forward[(256, 512)])[best] == pytest.approx(112.4)
    assert best not in report_module.forward_ms({"graph": forward[(1, 64)]["graph"]})


def test_forward_ratio_and_cost_tables_lay_out_the_recorded_figures(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    _, ratios, costs = tables(markdown, "AR forward")
    ratio_rows = {row[0]: row for row in ratios}
    cost_rows = {row[0]: row for row in costs}
    for key, ms in FORWARD_MS.items():
        cost = FORWARD_COSTS[key]
        assert [number(c) for c in ratio_rows[key_cell(key)][1:]] == pytest.approx(
            [
                ms["eager"] / ms["graph"],
                ms["eager_bf16"] / ms["graph"],
                ms["compile"] / ms["graph"],
                ms["lean_eager"] / ms["lean_graph"],
                ms["compile_lean"] / ms["lean_graph"],
            ],
            abs=0.5e-2,
        )
        expected = [
            cost["capture_s"],
            cost["build_s"],
            cost["capture_s"] * 1e3 / ms["eager_bf16"],
            cost["build_s"] * 1e3 / ms["lean_eager"],
            cost["compile_s"],
            cost["compile_lean_s"],
            cost["max_rel_diff"],
            cost["argmax_agreement"],
            cost["compile_max_rel_diff"],
            cost["compile_lean_max_rel_diff"],
        ]
        assert [number(c) for c in cost_rows[key_cell(key)][1:]] == pytest.approx(
            expected, abs=0.05, rel=5e-3
        )


def test_header_names_the_stack_date_and_commit(report_module):
    report = bench_json([])
    markdown = report_module.render_markdown(report)
    header = markdown.split("\n## ", 1)[0]
    machine_info = report["machine_info"]
    for value in (*machine_info["gpus"], *(v for v in machine_info.values() if isinstance(v, str))):
        assert value in header
    assert report["datetime"] in header
    assert "- Commit: 0123456\n" in header
    dirty = report_module.render_markdown(bench_json([], {**CLEAN_COMMIT, "dirty": True}))
    assert "- Commit: 0123456 (dirty: uncommitted changes)\n" in dirty
    assert "- Commit: unknown\n" in report_module.render_markdown(bench_json([], {}))


def test_sampler_overhead_and_conformance_tables(report_module):
    tokens, eager_s, graph_s = 8 * 127, 0.6, 0.18
    benchmarks = [
        entry(eager_s, bench="sampler", variant="eager", batch=8, tokens=tokens,
              tokens_per_s=tokens / eager_s),
        entry(graph_s, bench="sampler", variant="graph", batch=8, tokens=tokens,
              tokens_per_s=tokens / graph_s, speedup_vs_eager=eager_s / graph_s),
        entry(0.4, bench="plugin_overhead", variant="parity_check", device="cuda",
              config="default", step="lean"),
        entry(0.012, bench="plugin_overhead", variant="nvml_reading", device="cuda",
              reading="in_block", tracked_objects=3),
        entry(21.5, bench="conformance_suite", target="reasyn-lean", suite_s=17.25, passed=80,
              skipped=4, failed=0),
        entry(20.0, bench="conformance_suite", target="reasyn", suite_s=16.5, passed=81,
              skipped=3, failed=1),
    ]  # fmt: skip
    markdown = report_module.render_markdown(bench_json(benchmarks))
    [sampler] = table_rows(markdown, "Sampler, end to end")
    assert sampler[:2] == ["8", str(tokens)]
    assert number(sampler[2]) == pytest.approx(tokens / eager_s, abs=0.5)
    assert number(sampler[3]) == pytest.approx(tokens / graph_s, abs=0.5)
    assert number(sampler[4]) == pytest.approx(eager_s / graph_s, abs=5e-3)
    parity, nvml = table_rows(markdown, "Plugin overhead")
    assert parity[:6] == ["parity_check", "cuda", "default", "lean", "-", "-"]
    assert number(parity[6]) == pytest.approx(400.0)
    assert nvml[:6] == ["nvml_reading", "cuda", "-", "-", "in_block", "3"]
    assert number(nvml[6]) == pytest.approx(12.0)
    assert table_rows(markdown, "Conformance suite") == [
        ["reasyn", "16.50", "20.00", "81", "3", "1"],
        ["reasyn-lean", "17.25", "21.50", "80", "4", "0"],
    ]


def efficiency_entry(step: str, key: list[int] | tuple[int, int], efficiency: float) -> dict:
    wall_ms = 1.0
    return entry(wall_ms / 1e3, bench="replay_efficiency", step=step, key=list(key), replays=50,
                 device_ms=efficiency * wall_ms, wall_ms=wall_ms, efficiency=efficiency,
                 device_ops_per_call=200)  # fmt: skip


EFFICIENCY_GOAL = "replay efficiency, every key, both steps"


def efficiency_run(low: float) -> list[dict]:
    """Both steps at every key at 0.95, but the lean step at (1, 64) at ``low``."""
    return [
        efficiency_entry(step, key, low if (step, key) == ("lean", (1, 64)) else 0.95)
        for step in ("exact", "lean")
        for key in FORWARD_MS
    ]


@pytest.mark.parametrize(
    ("low", "verdict"), [(0.91, "met"), (0.89, "missed")], ids=["met", "missed"]
)
def test_replay_efficiency_is_judged_at_every_key_of_both_steps(report_module, low, verdict):
    """(1, 64) counts like every other key: its figure alone decides here."""
    markdown = report_module.render_markdown(bench_json(efficiency_run(low)))
    rows = table_rows(markdown, "Replay efficiency")
    assert [(r[0], r[1]) for r in rows] == [
        (step, key_cell(key)) for step in ("exact", "lean") for key in FORWARD_MS
    ]
    assert number(rows[5][5]) == pytest.approx(low)
    goal = goal_rows(markdown)[EFFICIENCY_GOAL]
    assert number(goal[2]) == pytest.approx(low)
    assert goal[3:] == ["lean (1, 64)", "-", verdict]


def test_a_key_or_step_never_measured_leaves_an_every_goal_incomplete(report_module):
    run = [e for e in efficiency_run(0.95) if e["extra_info"]["key"] != [16, 128]]
    run = [e for e in run if e["extra_info"]["step"] != "lean" or e["extra_info"]["key"] != [1, 64]]
    result = report_module.judge_goals(report_module.load_entries(bench_json(run)))[EFFICIENCY_GOAL]
    assert result.unmeasured == ("lean (1, 64)", "exact (16, 128)", "lean (16, 128)")
    assert (result.figure, result.verdict) == (0.95, "incomplete")
    row = goal_rows(report_module.render_markdown(bench_json(run)))[EFFICIENCY_GOAL]
    assert row[4:] == ["lean (1, 64), exact (16, 128), lean (16, 128)", "incomplete"]


def test_compile_of_the_lean_step_missing_at_one_key_fails_the_lean_graphs_goal(report_module):
    """The audit's case: drop one compile entry and "every key" must not read as met."""
    run = [
        b
        for b in forward_benchmarks()
        if (b["extra_info"]["variant"], b["extra_info"]["key"]) != ("compile_lean", [1, 64])
    ]
    results = report_module.judge_goals(report_module.load_entries(bench_json(run)))
    fast = results["lean graph vs torch.compile of the lean step, every key (paired)"]
    assert (fast.verdict, fast.unmeasured) == ("missed", ("(1, 64)",))
    faster = {key: dict(ms, lean_graph=min(ms["lean_graph"], 0.9 * ms["compile_lean"]))
              for key, ms in FORWARD_MS.items()}  # fmt: skip
    run = [b for b in forward_benchmarks(faster) if b["extra_info"]["variant"] != "compile_lean"
           or b["extra_info"]["key"] != [1, 64]]  # fmt: skip
    results = report_module.judge_goals(report_module.load_entries(bench_json(run)))
    fast = results["lean graph vs torch.compile of the lean step, every key (paired)"]
    assert (fast.verdict, fast.unmeasured) == ("incomplete", ("(1, 64)",))
    assert "goal incomplete: lean graph vs torch.compile of the lean step, every key (paired): " \
        "not measured at (1, 64)" in report_module.check(bench_json(run))  # fmt: skip


def test_goals_admit_only_their_benchmarks_and_the_planned_values(report_module):
    goal = report_module.Goal(
        0.9, "efficiency", {"bench": "replay_efficiency"}, every={"key": ((1, 64), (8, 64))}
    )
    admitted = {
        tuple(key): goal.admits({"bench": "replay_efficiency", "key": key})
        for key in ([1, 64], [8, 64], [2, 64])
    }
    assert admitted == {(1, 64): True, (8, 64): True, (2, 64): False}
    assert not goal.admits({"bench": "sampler", "key": [8, 64]})
    assert goal.required() == [{"key": (1, 64)}, {"key": (8, 64)}]
    at = report_module.Goal(1.0, "x", {"bench": "ar_forward", "key": (8, 64)})
    assert at.admits({"bench": "ar_forward", "key": [8, 64]})
    assert not at.admits({"bench": "ar_forward", "key": [1, 64]})
    assert at.required() == [{}]


def test_every_goal_names_what_the_plan_runs(report_module):
    """Every field an "every" goal covers is one the plan fixes, so that a goal names the keys,
    steps and targets tests/bench runs (which imports the plan from the report)."""
    plan = {
        "key": report_module.FORWARD_KEYS,
        "step": report_module.STEP_KINDS,
        "target": report_module.SUITE_TARGETS,
        "batch": report_module.KV_BATCHES,
    }
    for name, goal in report_module.GOALS.items():
        for field, values in goal.every.items():
            assert field == "variant" or values == plan[field], name
        if "every" in name:
            assert goal.every, f"{name!r} says every but names nothing to cover"


INCREMENTAL_GOAL = "incremental graphed vs full-recompute graphed sampler at batch 64"


def incremental_benchmarks(seconds: dict[int, dict[str, float]]) -> list[dict]:
    """The incremental benchmarks as test_bench_incremental.py records them: ``seconds`` holds
    each batch's medians by variant; ratios only where the partner is there."""
    benchmarks = []
    for batch, medians in seconds.items():
        tokens = batch * 127
        full = medians.get("full_recompute_graph")
        for variant, median in medians.items():
            info = {"tokens_per_s": tokens / median}
            if full is not None:
                info["speedup_vs_full_graph"] = full / median
            if variant == "graph" and "eager" in medians:
                info["speedup_vs_eager"] = medians["eager"] / median
            benchmarks.append(
                entry(median, bench="incremental", variant=variant, batch=batch, tokens=tokens,
                      **info)
            )  # fmt: skip
    return benchmarks


@pytest.mark.parametrize(
    ("graph_s", "verdict"), [(0.16, "met"), (0.21, "missed")], ids=["met", "missed"]
)
def test_incremental_table_and_goal(report_module, graph_s, verdict):
    seconds = {
        8: {"full_recompute_graph": 0.2, "eager": 0.6, "graph": 0.12},
        64: {"full_recompute_graph": 0.8, "eager": 0.55, "graph": graph_s},
    }
    markdown = report_module.render_markdown(bench_json(incremental_benchmarks(seconds)))
    rows = table_rows(markdown, "Incremental sampler (static KV cache)")
    assert [row[:2] for row in rows] == [["8", str(8 * 127)], ["64", str(64 * 127)]]
    for row, (batch, medians) in zip(rows, seconds.items(), strict=True):
        full, eager, graph = (medians[v] for v in ("full_recompute_graph", "eager", "graph"))
        tokens = batch * 127
        assert number(row[2]) == pytest.approx(tokens / full, abs=0.5)
        assert number(row[3]) == pytest.approx(tokens / eager, abs=0.5)
        assert number(row[4]) == pytest.approx(tokens / graph, abs=0.5)
        assert number(row[5]) == pytest.approx(full / graph, abs=5e-3)
        assert number(row[6]) == pytest.approx(eager / graph, abs=5e-3)
    goal = goal_rows(markdown)[INCREMENTAL_GOAL]
    assert number(goal[2]) == pytest.approx(0.8 / graph_s, abs=5e-4)
    assert goal[3:] == ["batch 64", "-", verdict]


@pytest.mark.parametrize(
    ("seconds", "ratio_cell"),
    [
        ({8: {"full_recompute_graph": 0.2, "eager": 0.6, "graph": 0.05}}, "4.00x"),
        ({64: {"eager": 0.55, "graph": 0.1}}, "-"),
    ],
    ids=["batch-64-not-run", "no-full-recompute-partner"],
)
def test_incremental_goal_not_measured(report_module, seconds, ratio_cell):
    """A fast graph at another batch, or one without its partner, does not meet the goal."""
    markdown = report_module.render_markdown(bench_json(incremental_benchmarks(seconds)))
    [row] = table_rows(markdown, "Incremental sampler (static KV cache)")
    assert row[5] == ratio_cell
    assert goal_rows(markdown)[INCREMENTAL_GOAL][2:] == ["-", "-", "-", "not measured"]


def goal_figure(goal, met: bool) -> float:
    """A figure 10% inside the goal's threshold when ``met``, 10% outside it when not (one
    whole unit for a threshold of 0, a count); never below 0, as no figure is."""
    margin = abs(goal.threshold) * 0.1 or 1.0
    inside = margin if met else -margin
    return max(goal.threshold + (inside if goal.at_least else -inside), 0.0)


def every_goal_at(report_module, met: bool) -> list[dict]:
    """One benchmark per entry the goals need, each goal's figure 10% inside (``met``) or
    outside its threshold; goals that read the same benchmarks (a check's seconds and its
    checker's share, say) share its entry."""
    by_entry: dict[tuple, dict] = {}
    for goal in report_module.GOALS.values():
        value = goal_figure(goal, met)
        for needed in goal.required():
            where = {k: list(v) if isinstance(v, tuple) else v
                     for k, v in {**goal.where, **needed}.items()}  # fmt: skip
            benchmark = by_entry.setdefault(repr(sorted(where.items())), entry(1.0, **where))
            if goal.figure == "median_s":
                benchmark["stats"]["median"] = value
            else:
                benchmark["extra_info"][goal.figure] = value
    return list(by_entry.values())


@pytest.mark.parametrize("met", [True, False], ids=["met", "missed"])
def test_goal_verdicts_follow_the_thresholds(report_module, met):
    goals = report_module.GOALS
    assert len(goals) >= 10
    rows = goal_rows(report_module.render_markdown(bench_json(every_goal_at(report_module, met))))
    assert set(rows) == set(goals)
    for name, goal in goals.items():
        assert number(rows[name][2]) == pytest.approx(goal_figure(goal, met), abs=5e-4)
        assert rows[name][4:] == ["-", "met" if met else "missed"], name


def test_a_figure_on_the_threshold_meets_it(report_module):
    for goal in report_module.GOALS.values():
        assert goal.judge(goal.threshold)
        assert not goal.judge(goal.threshold + (-1e-9 if goal.at_least else 1e-9))


def test_the_realistic_run_meets_and_misses_forward_goals_at_their_worst_key(report_module):
    """Through the AR forward figures above: compile of the lean step wins at (64, 128), and
    compile of the upstream step beats the exact graph at (8, 64); the exact graph loses to
    its own eager at (256, 512) by less than 1%, which "every key" counts; the rest are met."""
    rows = goal_rows(report_module.render_markdown(bench_json(forward_benchmarks())))
    fast = rows["lean graph vs torch.compile of the lean step, every key (paired)"]
    assert fast[2:] == ["0.935", "(64, 128)", "-", "missed"]
    exact = rows["exact graph vs torch.compile of the upstream step at (8, 64) (paired)"]
    assert exact[2:] == ["0.894", "(8, 64)", "-", "missed"]
    own = rows["exact graph vs its own eager, every key (paired)"]
    assert own[2:] == ["0.994", "(256, 512)", "-", "missed"]
    assert rows["lean graph graph vs its own eager, every key (paired)"][5] == "met"
    assert rows["lean graph logits vs upstream, max relative difference, every key"][2:] == [
        "0.012",
        "(256, 512)",
        "-",
        "met",
    ]
    assert rows["lean graph build s, every key"][2:] == ["0.400", "(256, 512)", "-", "met"]
    steps = rows["graph build in its own eager steps, every key, both steps"]
    assert steps[2:] == ["5.429", "lean graph (16, 128)", "-", "met"]  # 19 ms / 3.5 ms
    assert rows["exact graph vs upstream eager at (1, 64)"][5] == "met"
    assert rows["conformance suite failures, every target"][2:] == [
        "-",
        "-",
        "reasyn, reasyn-lean",
        "not measured",
    ]


def test_the_worst_entry_decides_and_is_named(report_module):
    fast, slow = ("reasyn", 8.5), ("reasyn-lean", 23.5)
    benchmarks = [
        entry(s + 3, bench="conformance_suite", target=t, suite_s=s, passed=80, skipped=0,
              failed=0)
        for t, s in (fast, slow)
    ]  # fmt: skip
    results = report_module.judge_goals(report_module.load_entries(bench_json(benchmarks)))
    suite = results["conformance suite, seconds as pytest counts them, every target"]
    assert (suite.figure, suite.worst_at, suite.verdict) == (23.5, "reasyn-lean", "missed")
    failures = results["conformance suite failures, every target"]
    assert (failures.figure, failures.verdict) == (0, "met")


@pytest.mark.parametrize(("reasyn_s", "verdict"), [(10.0, "met"), (10.5, "missed")])
def test_the_suite_is_held_to_ten_seconds_at_every_target(report_module, reasyn_s, verdict):
    benchmarks = [
        entry(s + 3, bench="conformance_suite", target=t, suite_s=s, passed=14, skipped=4,
              failed=0)
        for t, s in (("reasyn", reasyn_s), ("reasyn-lean", 9.0))
    ]  # fmt: skip
    rows = goal_rows(report_module.render_markdown(bench_json(benchmarks)))
    row = rows["conformance suite, seconds as pytest counts them, every target"]
    assert row[1:] == ["<= 10", f"{reasyn_s:.3f}", "reasyn", "-", verdict]


COMPILED_GOAL = (
    "conformance suite on the compiled decode-token example vs its own compile and capture"
)
EMULATION_GOAL = (
    "conformance suite on the graphed-layer example, emulated vs its CPU dry run (paired)"
)
RECORDING_GOAL = "capture recorded vs unrecorded, exact graph, every key (paired)"
DECODE_TOKEN = "pytest_cudagraph.examples.decode_token_target:make_target"
GRAPHED_LAYER = "pytest_cudagraph.examples.graphed_layer_target:make_target"


def baselined_benchmarks(suite_s: float, emulated_s: float, recorded: dict) -> list[dict]:
    """The three benchmarks as tests/bench records them: the compiled example's suite against a
    compile and capture of 20 s, the emulated suite against a dry run of 2 s (3 rounds), and
    a recorded capture at each key of ``recorded`` (its seconds) against 10 ms unrecorded."""
    benchmarks = [
        entry(suite_s + 4, bench="compiled_example", target=DECODE_TOKEN, suite_s=suite_s,
              compile_and_capture_s=20.0, vs_compile_and_capture=suite_s / 20.0, own_calls=3,
              passed=20, skipped=3, failed=0),
        entry(emulated_s + 3, bench="emulation", target=GRAPHED_LAYER, vs_dry_run=emulated_s / 2.0,
              suite_s=emulated_s, dry_run_s=2.0, dry_run_wall_s=5.0, pairs=3, passed=14,
              skipped=15, dry_run_passed=2),
    ]  # fmt: skip
    benchmarks += [
        entry(seconds + 0.03, bench="recording", key=list(key), recording_overhead=seconds / 0.01,
              recorded_capture_s=seconds, unrecorded_capture_s=0.01, recorded_ops=900,
              recorded_reads=180, pairs=10)
        for key, seconds in recorded.items()
    ]  # fmt: skip
    return benchmarks


def test_the_baselined_table_gives_each_figure_and_its_two_sides(report_module):
    recorded = {(8, 64): 0.012, (1, 64): 0.013}
    markdown = report_module.render_markdown(bench_json(baselined_benchmarks(30.0, 5.0, recorded)))
    assert table_rows(markdown, "Against their own baselines") == [
        ["compiled_example", DECODE_TOKEN, "`vs_compile_and_capture`", "1.500x", "30.000",
         "20.000", "1"],
        ["emulation", GRAPHED_LAYER, "`vs_dry_run`", "2.500x", "5.000", "2.000", "3"],
        ["recording", "(1, 64)", "`recording_overhead`", "1.300x", "0.013", "0.010", "10"],
        ["recording", "(8, 64)", "`recording_overhead`", "1.200x", "0.012", "0.010", "10"],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("suite_s", "emulated_s", "recorded_s", "verdicts"),
    [
        (40.0, 6.0, 0.015, ("met", "met", "met")),
        (40.5, 6.2, 0.0151, ("missed", "missed", "missed")),
    ],
    ids=["on-the-thresholds", "past-them"],
)
def test_the_baselined_goals(report_module, suite_s, emulated_s, recorded_s, verdicts):
    """2x the example's own compile and capture, 3x the dry run, 1.5x an unrecorded capture at
    every key; the worst key decides."""
    recorded = {key: 0.011 for key in report_module.FORWARD_KEYS}
    recorded[(64, 128)] = recorded_s
    run = baselined_benchmarks(suite_s, emulated_s, recorded)
    rows = goal_rows(report_module.render_markdown(bench_json(run)))
    for name, verdict in zip(
        (COMPILED_GOAL, EMULATION_GOAL, RECORDING_GOAL), verdicts, strict=True
    ):
        assert rows[name][5] == verdict, name
    assert rows[RECORDING_GOAL][3] == "(64, 128)"
    assert rows[EMULATION_GOAL][2:4] == [f"{emulated_s / 2.0:.3f}", GRAPHED_LAYER]


def test_recording_at_some_keys_leaves_its_goal_incomplete(report_module):
    run = baselined_benchmarks(30.0, 5.0, {(1, 64): 0.011, (8, 64): 0.011})
    results = report_module.judge_goals(report_module.load_entries(bench_json(run)))
    recording = results[RECORDING_GOAL]
    assert recording.verdict == "incomplete"
    assert recording.unmeasured == ("(16, 128)", "(64, 128)", "(256, 512)")


DOCS = SCRIPTS.parent / "docs" / "benchmarks.md"


def test_the_docs_goals_table_is_the_scripts_goals(report_module):
    """docs/benchmarks.md's table of goals names every goal of GOALS, each with its threshold:
    a goal changed in one and not the other fails here."""
    [table, *_] = tables(DOCS.read_text(), "Goals")
    documented = {goal: (figure, threshold) for goal, figure, threshold in table}
    assert list(documented) == list(report_module.GOALS)
    for name, goal in report_module.GOALS.items():
        figure, threshold = documented[name]
        sign = ">=" if goal.at_least else "<="
        assert threshold.split(" ")[:2] == [sign, f"{goal.threshold:g}"], name
        # A median is the benchmark's own; every other figure is named as extra_info has it.
        assert goal.figure == "median_s" or f"`{goal.figure}`" in figure, name


def test_parity_goals_take_every_steps_check_and_its_worst(report_module):
    benchmarks = [
        entry(0.7, bench="plugin_overhead", variant="parity_check", device="cuda",
              config="default", step="exact", checker_s=0.04),
        entry(0.42, bench="plugin_overhead", variant="parity_check", device="cuda",
              config="default", step="lean", checker_s=0.12),
        entry(0.9, bench="plugin_overhead", variant="parity_check", device="cpu", config="tiny"),
    ]  # fmt: skip
    rows = goal_rows(report_module.render_markdown(bench_json(benchmarks)))
    assert rows["64-case parity check on the GPU, seconds, every step"][2:] == [
        "0.700",
        "exact",
        "-",
        "missed",
    ]
    share = rows["parity checker's own share of a 64-case GPU check, seconds, every step"]
    assert share[2:] == ["0.120", "lean", "-", "missed"]
    lean_only = goal_rows(report_module.render_markdown(bench_json(benchmarks[1:])))
    assert lean_only["64-case parity check on the GPU, seconds, every step"][2:] == [
        "0.420",
        "lean",
        "exact",
        "incomplete",
    ]


def test_nvml_goal_reads_the_full_reading_only(report_module):
    benchmarks = [
        entry(0.031, bench="plugin_overhead", variant="nvml_reading", device="cuda",
              reading="baseline", tracked_objects=3),
        entry(0.4, bench="plugin_overhead", variant="nvml_reading", device="cuda",
              reading="in_block", tracked_objects=3),
    ]  # fmt: skip
    row = goal_rows(report_module.render_markdown(bench_json(benchmarks)))[
        "NVML reading with a full collection (a baseline's), seconds"
    ]
    assert row[2:] == ["0.031", "-", "-", "met"]


def test_nothing_measured_says_so(report_module):
    markdown = report_module.render_markdown(bench_json([entry(1.0, unrelated=True)]))
    assert {row[5] for row in table_rows(markdown, "Goals")} == {"not measured"}
    # Three AR forward tables, sampler, incremental, KV step, efficiency, overhead,
    # conformance, against their own baselines.
    assert markdown.count("(not measured in this run)") == 10
    assert "Fastest at" not in markdown
    assert "Not judged: no benchmarks of tests/bench in this run." in markdown


def test_lean_tolerance_is_the_lean_steps_own(report_module):
    from reasyn_ref.lean import LEAN_TOLERANCE

    assert report_module.LEAN_TOLERANCE == LEAN_TOLERANCE
    goal = report_module.GOALS["lean graph logits vs upstream, max relative difference, every key"]
    assert goal.threshold == LEAN_TOLERANCE


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def checked(tmp_path, report: dict) -> subprocess.CompletedProcess:
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(report))
    return run_script(str(source), "--out", str(tmp_path / "bench.md"), "--check")


def test_check_exits_0_only_when_every_goal_is_met_on_a_clean_tree(report_module, tmp_path):
    done = checked(tmp_path, bench_json(every_goal_at(report_module, met=True)))
    assert (done.returncode, done.stderr) == (0, "")
    verdicts = {row[5] for row in goal_rows((tmp_path / "bench.md").read_text()).values()}
    assert verdicts == {"met"}
    unchecked = run_script(str(tmp_path / "bench.json"), "--out", str(tmp_path / "again.md"))
    assert unchecked.returncode == 0


def test_check_exits_1_on_a_missed_goal_and_names_it(report_module, tmp_path):
    run = every_goal_at(report_module, met=True)
    [slow] = [b for b in run if b["extra_info"].get("variant") == "compile_lean"
              and b["extra_info"]["key"] == [64, 128]]  # fmt: skip
    slow["extra_info"]["graph_speedup_paired"] = 0.5
    done = checked(tmp_path, bench_json(run))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "goal missed: lean graph vs torch.compile of the lean step, every key (paired): 0.5 at "
        "(64, 128)"
    ]
    assert (tmp_path / "bench.md").read_text().startswith("# Benchmarks")


@pytest.mark.parametrize("what", ["a key", "a goal"])
def test_check_exits_1_on_a_partial_run(report_module, tmp_path, what):
    run = every_goal_at(report_module, met=True)
    if what == "a key":  # the lean step's replay efficiency at (256, 512)
        drop = {"bench": "replay_efficiency", "step": "lean", "key": [256, 512]}
        expected = "goal incomplete: replay efficiency, every key, both steps: not measured at " \
            "lean (256, 512)"  # fmt: skip
    else:  # the sampler not run at all
        drop = {"bench": "sampler"}
        expected = "goal not measured: sampler tokens/s, graphs on vs off at batch 8"
    run = [b for b in run if any(b["extra_info"].get(k) != v for k, v in drop.items())]
    done = checked(tmp_path, bench_json(run))
    assert (done.returncode, done.stderr.splitlines()) == (1, [expected])


def test_check_exits_1_on_an_empty_run(report_module, tmp_path):
    done = checked(tmp_path, bench_json([]))
    assert done.returncode == 1
    refusal, *goals = done.stderr.splitlines()
    assert refusal == "refused: no benchmarks of tests/bench in this run"
    assert goals == [f"goal not measured: {name}" for name in report_module.GOALS]


@pytest.mark.parametrize(
    ("commit_info", "refusal"),
    [
        ({**CLEAN_COMMIT, "dirty": True}, "refused: the run was recorded on a dirty tree (commit "
         "0123456 with uncommitted changes): its figures belong to no commit"),
        ({}, "refused: the run names no commit (commit_info has no id)"),
    ],
    ids=["dirty", "no-commit"],
)  # fmt: skip
def test_check_refuses_a_run_from_a_dirty_or_unknown_tree(
    report_module, tmp_path, commit_info, refusal
):
    done = checked(tmp_path, bench_json(every_goal_at(report_module, met=True), commit_info))
    assert (done.returncode, done.stderr.splitlines()) == (1, [refusal])


def test_plot_is_skipped_with_a_message_without_matplotlib(
    report_module, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot = tmp_path / "bench.png"
    assert report_module.write_plot(bench_json(forward_benchmarks()), plot) is False
    assert not plot.exists()
    assert "matplotlib is not installed" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (optional)")
def test_plot_draws_six_labelled_bars_per_key_on_a_log_axis(report_module, tmp_path, monkeypatch):
    from matplotlib import pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figure to look at it
    plot = tmp_path / "bench.png"
    assert report_module.write_plot(bench_json(forward_benchmarks()), plot) is True
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    [ax] = drawn[0].axes
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [key_cell(k) for k in FORWARD_MS]
    labels = {t.get_text() for t in ax.texts}
    for key, ms in FORWARD_MS.items():
        best_eager = min(ms["eager"], ms["eager_bf16"])
        bars = ("eager", "compile", "graph", "compile_lean", "lean_graph")
        for value in (best_eager, *(ms[v] for v in bars)):
            assert f"{value:.3g}" in labels, (key, value)
    heights = sorted(bar.get_height() for bar in ax.patches)
    assert len(heights) == 6 * len(FORWARD_MS)
    assert heights[0] == pytest.approx(0.62) and heights[-1] == pytest.approx(115.1)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (optional)")
def test_plot_without_forward_figures_says_so(report_module, tmp_path, monkeypatch):
    from matplotlib import pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)
    plot = tmp_path / "bench.png"
    assert report_module.write_plot(bench_json([]), plot) is True
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    [ax] = drawn[0].axes
    assert [t.get_text() for t in ax.texts] == ["AR forward not measured in this run"]
    assert not ax.patches


def test_cli_writes_the_report_and_the_plot_when_it_can(tmp_path):
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(bench_json(forward_benchmarks())))
    out, plot = tmp_path / "reports" / "bench.md", tmp_path / "reports" / "bench.png"
    done = run_script(str(source), "--out", str(out), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# Benchmarks")
    if HAS_MATPLOTLIB:
        assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    else:
        assert not plot.exists() and "matplotlib is not installed" in done.stderr


def test_the_parts_of_one_run_are_judged_as_one_and_can_be_merged(report_module, tmp_path):
    """The GPU recipe's two benchmark steps write a JSON each: compile apart, the rest."""
    run = every_goal_at(report_module, met=True)
    compiled = [b for b in run if "compile" in str(b["extra_info"].get("variant"))]
    parts = [tmp_path / "benchmarks.json", tmp_path / "benchmarks-compile.json"]
    parts[0].write_text(json.dumps(bench_json([b for b in run if b not in compiled])))
    parts[1].write_text(json.dumps(bench_json(compiled)))
    merged = tmp_path / "merged.json"
    done = run_script(*map(str, parts), "--out", str(tmp_path / "bench.md"), "--check",
                      "--merged", str(merged))  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    benchmarks = [b for path in parts for b in json.loads(path.read_text())["benchmarks"]]
    assert json.loads(merged.read_text()) == bench_json(benchmarks)
    alone = run_script(str(parts[0]), "--out", str(tmp_path / "part.md"), "--check")
    assert "goal not measured: lean graph vs torch.compile of the lean step" in alone.stderr


@pytest.mark.parametrize(
    ("info", "changed"),
    [("commit_info", {"id": "f" * 40}), ("machine_info", {"torch": "2.13.0+cu130"})],
)
def test_jsons_of_different_commits_or_stacks_are_refused_together(tmp_path, info, changed):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(bench_json([])))
    other = bench_json([])
    other[info] = {**other[info], **changed}
    second.write_text(json.dumps(other))
    done = run_script(str(first), str(second), "--out", str(tmp_path / "bench.md"))
    assert done.returncode == 2
    assert f"{second} has {info} " in done.stderr
    assert "JSONs of different commits or stacks are not one run" in done.stderr
    assert not (tmp_path / "bench.md").exists()


KV_STEP_GOAL = "KV step graph vs torch.compile of the same step, every batch (paired)"


def kv_step_benchmarks(batches, graph_speedup: float) -> list[dict]:
    """The KV step benchmarks as test_bench_kv_step.py records them, at ``batches``."""
    benchmarks = []
    for batch in batches:
        benchmarks += [
            entry(0.0016, bench="kv_step", variant="compile", batch=batch, cache_len=128,
                  graph_speedup_paired=graph_speedup, compiled_graph_speedup_paired=2.5,
                  kernels_per_token=198, device_ms_per_token=0.605, compiled_graph_ms=0.7,
                  compiled_graph_kernels_per_token=187,
                  compiled_graph_device_ms_per_token=0.598),
            entry(0.0009, bench="kv_step", variant="graph", batch=batch, cache_len=128,
                  kernels_per_token=216, device_ms_per_token=0.754),
        ]  # fmt: skip
    return benchmarks


@pytest.mark.parametrize(
    ("batches", "graph_speedup", "verdict"),
    [((1, 8, 64), 1.8, "met"), ((1, 8, 64), 0.97, "missed"), ((1, 8), 1.8, "incomplete")],
    ids=["met", "missed", "batch-64-not-run"],
)
def test_kv_step_table_and_goal(report_module, batches, graph_speedup, verdict):
    markdown = report_module.render_markdown(bench_json(kv_step_benchmarks(batches, graph_speedup)))
    rows = table_rows(markdown, "KV decoder step")
    assert [row[0] for row in rows] == [str(batch) for batch in batches]
    assert rows[0][1:] == [
        "1.600",
        "0.900",
        "0.700",
        f"{graph_speedup:.3f}x",
        "2.500x",
        "198, 216, 187",
        "0.605, 0.754, 0.598",
    ]
    goal = goal_rows(markdown)[KV_STEP_GOAL]
    assert number(goal[2]) == pytest.approx(graph_speedup, abs=5e-4)
    assert goal[5] == verdict
    if verdict == "incomplete":
        assert goal[4] == "batch 64"


def test_the_batch_1_sampler_goal_reads_the_plain_graphed_sampler(report_module):
    """The compiled-blocks sampler is shown beside it; the goal judges the sampler as built by
    default."""
    seconds = {1: {"eager": 0.8, "graph": 0.1, "compiled_graph": 0.05}}
    markdown = report_module.render_markdown(bench_json(incremental_benchmarks(seconds)))
    [row] = table_rows(markdown, "Incremental sampler (static KV cache)")
    assert number(row[7]) == pytest.approx(127 / 0.05, abs=0.5)
    goal = goal_rows(markdown)["incremental graphed sampler tokens/s at batch 1"]
    assert number(goal[2]) == pytest.approx(127 / 0.1, abs=0.5)
    assert goal[5] == "missed"
