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


def bench_json(benchmarks: list[dict]) -> dict:
    return {
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
# Compile wins at (64, 128); upstream eager beats the bf16-weight eager at (256, 512), where
# the exact graph is slower than both.
FORWARD_MS = {
    (1, 64): {"eager": 7.7, "eager_bf16": 6.3, "compile": 0.93, "graph": 0.96,
              "lean_eager": 3.1, "lean_graph": 0.62},
    (8, 64): {"eager": 9.1, "eager_bf16": 7.2, "compile": 1.18, "graph": 1.32,
              "lean_eager": 3.4, "lean_graph": 0.85},
    (16, 128): {"eager": 10.9, "eager_bf16": 6.6, "compile": 1.77, "graph": 2.48,
                "lean_eager": 3.5, "lean_graph": 1.4},
    (64, 128): {"eager": 8.5, "eager_bf16": 8.9, "compile": 4.5, "graph": 7.33,
                "lean_eager": 5.6, "lean_graph": 4.6},
    (256, 512): {"eager": 112.4, "eager_bf16": 114.4, "compile": 83.4, "graph": 115.1,
                 "lean_eager": 80.0, "lean_graph": 78.0},
}  # fmt: skip
# Made-up build costs (s) and distances from upstream per key.
FORWARD_COSTS = {
    (1, 64): {"capture_s": 0.03, "build_s": 0.02, "compile_s": 9.5, "max_rel_diff": 0.006,
              "argmax_agreement": 1.0, "compile_max_rel_diff": 1e-3},
    (8, 64): {"capture_s": 0.05, "build_s": 0.04, "compile_s": 12.0, "max_rel_diff": 0.008,
              "argmax_agreement": 1.0, "compile_max_rel_diff": 1.5e-3},
    (16, 128): {"capture_s": 0.06, "build_s": 0.05, "compile_s": 13.0, "max_rel_diff": 0.009,
                "argmax_agreement": 0.9375, "compile_max_rel_diff": 2e-3},
    (64, 128): {"capture_s": 0.07, "build_s": 0.06, "compile_s": 14.0, "max_rel_diff": 0.01,
                "argmax_agreement": 0.984, "compile_max_rel_diff": 2e-3},
    (256, 512): {"capture_s": 0.55, "build_s": 0.4, "compile_s": 17.0, "max_rel_diff": 0.012,
                 "argmax_agreement": 0.996, "compile_max_rel_diff": 1e-3},
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
    its partners ran at that key, the ratios it computes against them."""
    benchmarks = []
    for key, medians in ms.items():
        cost = costs[key]
        over = functools.partial(ratio, medians)
        info: dict[str, dict] = {
            "eager": {},
            "eager_bf16": {},
            "compile": {"compile_s": cost["compile_s"],
                        "max_rel_diff": cost["compile_max_rel_diff"],
                        **over("eager", "compile", "speedup_vs_eager")},
            "graph": {"capture_s": cost["capture_s"],
                      **over("eager", "graph", "speedup_vs_eager"),
                      **over("eager_bf16", "graph", "speedup_vs_own_eager"),
                      **over("compile", "graph", "speedup_vs_compile")},
            "lean_eager": {"max_rel_diff": cost["max_rel_diff"],
                           "argmax_agreement": cost["argmax_agreement"],
                           **over("eager", "lean_eager", "speedup_vs_eager")},
            "lean_graph": {"capture_s": cost["build_s"],
                           **over("eager", "lean_graph", "speedup_vs_eager"),
                           **over("lean_eager", "lean_graph", "speedup_vs_own_eager"),
                           **over("compile", "lean_graph", "speedup_vs_compile")},
        }  # fmt: skip
        if "compile" in medians:
            info["graph"]["compile_over_capture"] = cost["compile_s"] / cost["capture_s"]
            info["lean_graph"].update(
                build_over_compile=cost["build_s"] / cost["compile_s"],
                compile_over_capture=cost["compile_s"] / cost["build_s"],
            )
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


VARIANTS = ("eager", "eager_bf16", "compile", "graph", "lean_eager", "lean_graph")


def test_forward_table_gives_every_variant_per_key_and_who_wins(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    rows = {row[0]: row for row in tables(markdown, "AR forward")[0]}
    assert list(rows) == [key_cell(k) for k in FORWARD_MS]
    for key, medians in FORWARD_MS.items():
        cells = rows[key_cell(key)][1:7]
        assert [number(c) for c in cells] == pytest.approx([medians[v] for v in VARIANTS])
    who = {key: row[7] for key, row in rows.items()}
    assert who["(1, 64)"] == "fast path, 1.50x over compile"  # 0.93 / 0.62
    assert who["(64, 128)"] == "compile, 1.02x over fast path"  # 4.6 / 4.5
    assert who["(256, 512)"] == "fast path, 1.03x over lean eager"  # 80.0 / 78.0


def test_who_wins_with_one_variant_or_none_measured(report_module):
    ms = {(1, 64): {"graph": 0.96}, (8, 64): {"eager": 9.1, "graph": 1.32}}
    markdown = report_module.render_markdown(bench_json(forward_benchmarks(ms)))
    rows = {row[0]: row for row in tables(markdown, "AR forward")[0]}
    assert rows["(1, 64)"][7] == "exact graph (alone)"
    assert rows["(1, 64)"][1:7] == ["-", "-", "-", "0.960", "-", "-"]
    assert rows["(8, 64)"][7] == "exact graph, 6.89x over upstream eager"
    assert report_module.who_wins({}) == "-"


def test_prose_says_who_wins_where_from_the_figures(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    section = markdown.split("## AR forward\n", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in section.splitlines() if line.startswith("- ")]
    assert bullets[:2] == [
        "- Fastest at (1, 64), (8, 64), (16, 128), (256, 512): fast path.",
        "- Fastest at (64, 128): compile.",
    ]
    by_title = {line.split(":", 1)[0][2:]: line.split(":", 1)[1] for line in bullets[2:]}
    assert by_title["The fast path against compile (same weights)"] == (
        " as fast or faster at (1, 64) 1.50x, (8, 64) 1.39x, (16, 128) 1.26x, "
        "(256, 512) 1.07x; slower at (64, 128) 0.98x."
    )
    # The best eager is the faster of the two: upstream's 112.4 ms at (256, 512).
    assert by_title["The exact graph against the best eager"].endswith(
        "slower at (256, 512) 0.98x."
    )
    assert by_title["The exact graph against its own eager step"].endswith(
        "slower at (256, 512) 0.99x."
    )


def test_best_eager_is_the_faster_eager_step(report_module):
    entries = report_module.load_entries(bench_json(forward_benchmarks()))
    forward = report_module.forward_by_key(entries)
    best = report_module.BEST_EAGER
    assert report_module.forward_ms(forward[(1, 64)])[best] == pytest.approx(6.3)
    assert report_module.forward_ms(forward[(256, 512)])[best] == pytest.approx(112.4)
    assert best not in report_module.forward_ms({"graph": forward[(1, 64)]["graph"]})


def test_forward_ratio_table_lays_out_the_recorded_figures(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    rows = {row[0]: row for row in tables(markdown, "AR forward")[1]}
    for key, ms in FORWARD_MS.items():
        cost, row = FORWARD_COSTS[key], rows[key_cell(key)]
        expected = [
            ms["eager"] / ms["graph"],
            ms["eager_bf16"] / ms["graph"],
            ms["lean_eager"] / ms["lean_graph"],
            ms["compile"] / ms["lean_graph"],
            cost["capture_s"],
            cost["build_s"],
            cost["compile_s"],
            cost["compile_s"] / cost["capture_s"],
            cost["build_s"] / cost["compile_s"],
            cost["max_rel_diff"],
            cost["argmax_agreement"],
            cost["compile_max_rel_diff"],
        ]
        assert [number(c) for c in row[1:]] == pytest.approx(expected, abs=0.5e-2, rel=5e-3)


def test_header_names_the_stack_and_date(report_module):
    report = bench_json([])
    markdown = report_module.render_markdown(report)
    header = markdown.split("\n## ", 1)[0]
    machine_info = report["machine_info"]
    for value in (*machine_info["gpus"], *(v for v in machine_info.values() if isinstance(v, str))):
        assert value in header
    assert report["datetime"] in header


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


def efficiency_entry(step: str, key: list[int], efficiency: float) -> dict:
    wall_ms = 1.0
    return entry(wall_ms / 1e3, bench="replay_efficiency", step=step, key=key, replays=10,
                 device_ms=efficiency * wall_ms, wall_ms=wall_ms, efficiency=efficiency,
                 device_ops_per_call=200)  # fmt: skip


@pytest.mark.parametrize(
    ("lean_8x64", "verdict"), [(0.93, "met"), (0.88, "missed")], ids=["met", "missed"]
)
def test_replay_efficiency_judges_keys_from_8x64_up(report_module, lean_8x64, verdict):
    """(1, 64) is shown, marked not judged, and does not decide the goal however low."""
    benchmarks = [
        efficiency_entry("lean", [8, 64], lean_8x64),
        efficiency_entry("exact", [256, 512], 1.01),
        efficiency_entry("lean", [1, 64], 0.5),
        efficiency_entry("exact", [1, 64], 0.6),
        efficiency_entry("exact", [8, 64], 0.95),
    ]
    markdown = report_module.render_markdown(bench_json(benchmarks))
    rows = table_rows(markdown, "Replay efficiency")
    assert [(r[0], r[1], r[6]) for r in rows] == [
        ("exact", "(1, 64)", "no"),
        ("exact", "(8, 64)", "yes"),
        ("exact", "(256, 512)", "yes"),
        ("lean", "(1, 64)", "no"),
        ("lean", "(8, 64)", "yes"),
    ]
    assert [number(r[5]) for r in rows] == pytest.approx([0.6, 0.95, 1.01, 0.5, lean_8x64])
    goal = goal_rows(markdown)[report_module.REPLAY_EFFICIENCY_GOAL]
    assert number(goal[2]) == pytest.approx(lean_8x64)
    assert goal[3:] == ["lean (8, 64)", verdict]


def test_key_filter_admits_keys_at_or_past_its_key(report_module):
    goal = report_module.Goal(0.9, "efficiency", {"bench": "replay_efficiency"}, from_key=(8, 64))
    admitted = {
        tuple(key): goal.admits({"bench": "replay_efficiency", "key": key})
        for key in ([1, 64], [1, 512], [8, 64], [16, 128], [256, 512])
    }
    assert admitted == {
        (1, 64): False,
        (1, 512): False,
        (8, 64): True,
        (16, 128): True,
        (256, 512): True,
    }
    assert not goal.admits({"bench": "sampler", "key": [8, 64]})


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
    assert goal[3:] == ["batch 64", verdict]


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
    assert goal_rows(markdown)[INCREMENTAL_GOAL][2:] == ["-", "-", "not measured"]


def goal_figure(goal, met: bool) -> float:
    """A figure 10% inside the goal's threshold when ``met``, 10% outside it when not (one
    whole unit for a threshold of 0, a count); never below 0, as no figure is."""
    margin = abs(goal.threshold) * 0.1 or 1.0
    inside = margin if met else -margin
    return max(goal.threshold + (inside if goal.at_least else -inside), 0.0)


def goal_benchmark(goal, value: float) -> dict:
    """A benchmark that the goal reads, with ``value`` as its figure."""
    where = dict(goal.where)
    if goal.from_key is not None:
        where.setdefault("key", list(goal.from_key))
    if goal.figure == "median_s":
        return entry(value, **where)
    return entry(1.0, **where, **{goal.figure: value})


@pytest.mark.parametrize("met", [True, False], ids=["met", "missed"])
def test_goal_verdicts_follow_the_thresholds(report_module, met):
    goals = report_module.GOALS
    assert len(goals) >= 10
    figures = {name: goal_figure(goal, met) for name, goal in goals.items()}
    benchmarks = [goal_benchmark(goals[name], value) for name, value in figures.items()]
    rows = goal_rows(report_module.render_markdown(bench_json(benchmarks)))
    assert set(rows) == set(goals)
    for name, value in figures.items():
        assert number(rows[name][2]) == pytest.approx(value, abs=5e-4)
        assert rows[name][4] == ("met" if met else "missed"), name


def test_a_figure_on_the_threshold_meets_it(report_module):
    for goal in report_module.GOALS.values():
        assert goal.judge(goal.threshold)


def test_the_realistic_run_meets_and_misses_forward_goals_at_their_worst_key(report_module):
    """Through the AR forward figures above: compile wins at (64, 128); the exact graph loses
    to its own eager at (256, 512) by less than 2%, which the saturated key's goal allows and
    the goal of the keys below it does not see; the rest are met."""
    rows = goal_rows(report_module.render_markdown(bench_json(forward_benchmarks())))
    assert rows["fast path vs torch.compile, every key"][2:] == ["0.978", "(64, 128)", "missed"]
    assert rows["exact graph vs its own eager at (256, 512), within 2%"][2:] == [
        "0.994",
        "(256, 512)",
        "met",
    ]
    below = rows["exact graph vs its own eager, every key below (256, 512)"]
    assert below[3] != "(256, 512)" and below[4] == "met"
    assert rows["fast path graph vs its own eager, every key below (256, 512)"][4] == "met"
    assert rows["fast path logits vs upstream, max relative difference"][2:] == [
        "0.012",
        "(256, 512)",
        "met",
    ]
    assert rows["fast path build s, every key"][2:] == ["0.400", "(256, 512)", "met"]
    assert rows["exact graph: compile s / capture s at (8, 64)"][2:] == [
        "240.000",
        "(8, 64)",
        "met",
    ]
    assert rows["exact graph vs upstream eager at (1, 64)"][4] == "met"
    assert rows["conformance suite failures, every target"][2:] == ["-", "-", "not measured"]


def test_the_worst_entry_decides_and_is_named(report_module):
    fast, slow = ("reasyn", 12.0), ("reasyn-lean", 23.5)
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


def test_parity_goals_take_the_fast_paths_check_and_the_worst_checker_share(report_module):
    benchmarks = [
        entry(0.7, bench="plugin_overhead", variant="parity_check", device="cuda",
              config="default", step="exact", checker_s=0.12),
        entry(0.42, bench="plugin_overhead", variant="parity_check", device="cuda",
              config="default", step="lean", checker_s=0.05),
        entry(0.9, bench="plugin_overhead", variant="parity_check", device="cpu", config="tiny"),
    ]  # fmt: skip
    rows = goal_rows(report_module.render_markdown(bench_json(benchmarks)))
    assert rows["64-case parity check of the fast path on the GPU, seconds"][2:] == [
        "0.420",
        "lean",
        "met",
    ]
    share = rows["parity checker's own share of a 64-case GPU check, seconds, every step"]
    assert share[2:] == ["0.120", "exact", "missed"]


def test_nvml_goal_reads_the_in_block_reading_only(report_module):
    benchmarks = [
        entry(0.31, bench="plugin_overhead", variant="nvml_reading", device="cuda",
              reading="baseline", tracked_objects=3),
        entry(0.004, bench="plugin_overhead", variant="nvml_reading", device="cuda",
              reading="in_block", tracked_objects=3),
    ]  # fmt: skip
    row = goal_rows(report_module.render_markdown(bench_json(benchmarks)))[
        "NVML reading at a measured block's end, seconds"
    ]
    assert row[2:] == ["0.004", "-", "met"]


def test_nothing_measured_says_so(report_module):
    markdown = report_module.render_markdown(bench_json([entry(1.0, unrelated=True)]))
    assert {row[4] for row in table_rows(markdown, "Goals")} == {"not measured"}
    # Two AR forward tables, sampler, incremental, efficiency, overhead, conformance.
    assert markdown.count("(not measured in this run)") == 7
    assert "Fastest at" not in markdown


def test_lean_tolerance_is_the_lean_steps_own(report_module):
    from reasyn_ref.lean import LEAN_TOLERANCE

    assert report_module.LEAN_TOLERANCE == LEAN_TOLERANCE
    goal = report_module.GOALS["fast path logits vs upstream, max relative difference"]
    assert goal.threshold == LEAN_TOLERANCE


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def test_check_exits_1_on_a_missed_goal_and_names_it(report_module, tmp_path):
    source, out = tmp_path / "bench.json", tmp_path / "bench.md"
    source.write_text(json.dumps(bench_json(forward_benchmarks())))  # one goal missed
    checked = run_script(str(source), "--out", str(out), "--check")
    assert checked.returncode == 1
    missed = [line for line in checked.stderr.splitlines() if line.startswith("goal missed")]
    assert missed == ["goal missed: fast path vs torch.compile, every key: 0.978261 at (64, 128)"]
    assert out.read_text().startswith("# Benchmarks")
    unchecked = run_script(str(source), "--out", str(out))
    assert unchecked.returncode == 0 and "goal missed" not in unchecked.stderr


def test_check_exits_0_when_every_measured_goal_is_met(report_module, tmp_path):
    """Goals not measured (here all but the forward ones) do not fail the check."""
    ms = {key: dict(medians) for key, medians in FORWARD_MS.items()}
    ms[(64, 128)]["lean_graph"] = 4.4
    ms[(256, 512)]["graph"] = 110.0
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(bench_json(forward_benchmarks(ms))))
    checked = run_script(str(source), "--out", str(tmp_path / "bench.md"), "--check")
    assert checked.returncode == 0, checked.stderr
    verdicts = {row[4] for row in goal_rows((tmp_path / "bench.md").read_text()).values()}
    assert verdicts == {"met", "not measured"}


def test_plot_is_skipped_with_a_message_without_matplotlib(
    report_module, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot = tmp_path / "bench.png"
    assert report_module.write_plot(bench_json(forward_benchmarks()), plot) is False
    assert not plot.exists()
    assert "matplotlib is not installed" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (optional)")
def test_plot_draws_five_labelled_bars_per_key_on_a_log_axis(report_module, tmp_path, monkeypatch):
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
        for value in (ms["eager"], best_eager, ms["compile"], ms["graph"], ms["lean_graph"]):
            assert f"{value:.3g}" in labels, (key, value)
    heights = sorted(bar.get_height() for bar in ax.patches)
    assert len(heights) == 5 * len(FORWARD_MS)
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
