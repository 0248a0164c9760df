"""scripts/bench_report.py on synthetic pytest-benchmark JSON built here (CPU, runs in CI)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from script_modules import SCRIPTS, script_module

SCRIPT = SCRIPTS / "bench_report.py"


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


def forward_figures() -> dict[tuple[int, int], dict[str, float]]:
    """Made-up medians and first-call seconds per key; compiled only at (8, 64)."""
    return {
        (1, 64): {"eager": 4.3e-3, "graph": 0.81e-3, "capture_s": 0.21},
        (8, 64): {
            "eager": 4.9e-3,
            "graph": 1.1e-3,
            "compile": 0.97e-3,
            "capture_s": 0.25,
            "compile_s": 14.5,
        },
    }


def forward_benchmarks() -> list[dict]:
    benchmarks = []
    for key, fig in forward_figures().items():
        common = {"bench": "ar_forward", "key": list(key), "memory_len": 64}
        benchmarks.append(entry(fig["eager"], variant="eager", **common))
        graph_info = {
            "speedup_vs_eager": fig["eager"] / fig["graph"],
            "capture_s": fig["capture_s"],
        }
        if "compile" in fig:
            benchmarks.append(
                entry(
                    fig["compile"],
                    variant="compile",
                    compile_s=fig["compile_s"],
                    speedup_vs_eager=fig["eager"] / fig["compile"],
                    **common,
                )
            )
            graph_info.update(
                speedup_vs_compile=fig["compile"] / fig["graph"],
                compile_over_capture=fig["compile_s"] / fig["capture_s"],
            )
        benchmarks.append(entry(fig["graph"], variant="graph", **common, **graph_info))
    return benchmarks


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under ``## heading``, as lists of cells."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def number(cell: str) -> float:
    return float(cell.rstrip("x").replace(",", ""))


def test_forward_table_shows_each_key_and_its_ratios(report_module):
    markdown = report_module.render_markdown(bench_json(forward_benchmarks()))
    rows = {row[0]: row for row in table_rows(markdown, "AR forward")}
    assert list(rows) == ["(1, 64)", "(8, 64)"]
    for key, fig in forward_figures().items():
        row = rows[f"({key[0]}, {key[1]})"]
        assert number(row[1]) == pytest.approx(fig["eager"] * 1e3, abs=5e-4)
        assert number(row[2]) == pytest.approx(fig["graph"] * 1e3, abs=5e-4)
        assert number(row[4]) == pytest.approx(fig["eager"] / fig["graph"], abs=5e-3)
        assert number(row[6]) == pytest.approx(fig["capture_s"], abs=5e-4)
        if "compile" in fig:
            assert number(row[3]) == pytest.approx(fig["compile"] * 1e3, abs=5e-4)
            assert number(row[5]) == pytest.approx(fig["eager"] / fig["compile"], abs=5e-3)
            assert number(row[7]) == pytest.approx(fig["compile_s"], abs=0.05)
        else:
            assert row[3] == row[5] == row[7] == "-"


def test_header_names_the_stack_and_date(report_module):
    report = bench_json([])
    markdown = report_module.render_markdown(report)
    header = markdown.split("\n## ", 1)[0]
    machine_info = report["machine_info"]
    for value in (*machine_info["gpus"], *(v for v in machine_info.values() if isinstance(v, str))):
        assert value in header
    assert report["datetime"] in header


def test_sampler_efficiency_and_overhead_tables(report_module):
    tokens, eager_s, graph_s = 8 * 127, 0.6, 0.18
    benchmarks = [
        entry(eager_s, bench="sampler", variant="eager", batch=8, tokens=tokens,
              tokens_per_s=tokens / eager_s),
        entry(graph_s, bench="sampler", variant="graph", batch=8, tokens=tokens,
              tokens_per_s=tokens / graph_s, speedup_vs_eager=eager_s / graph_s),
        entry(0.02, bench="replay_efficiency", key=[8, 64], device_ms=0.95, wall_ms=1.0,
              efficiency=0.95, device_ops_per_call=213),
        entry(0.4, bench="plugin_overhead", variant="parity_check", device="cuda",
              config="default"),
    ]  # fmt: skip
    markdown = report_module.render_markdown(bench_json(benchmarks))
    [sampler] = table_rows(markdown, "Sampler, end to end")
    assert sampler[:2] == ["8", str(tokens)]
    assert number(sampler[2]) == pytest.approx(tokens / eager_s, abs=0.5)
    assert number(sampler[3]) == pytest.approx(tokens / graph_s, abs=0.5)
    assert number(sampler[4]) == pytest.approx(eager_s / graph_s, abs=5e-3)
    [efficiency] = table_rows(markdown, "Replay efficiency")
    assert efficiency[0] == "(8, 64)" and number(efficiency[4]) == pytest.approx(0.95)
    [overhead] = table_rows(markdown, "Plugin overhead")
    assert overhead[:3] == ["parity_check", "cuda", "default"]
    assert number(overhead[3]) == pytest.approx(400.0)


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
    goal = {row[0]: row for row in table_rows(markdown, "Goals")}[INCREMENTAL_GOAL]
    assert number(goal[2]) == pytest.approx(0.8 / graph_s, abs=5e-4)
    assert goal[3] == verdict


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
    goal = {row[0]: row for row in table_rows(markdown, "Goals")}[INCREMENTAL_GOAL]
    assert goal[2:] == ["-", "not measured"]


def goal_benchmark(goal, value: float) -> dict:
    """A benchmark that the goal reads, with ``value`` as its figure."""
    if goal.figure == "median_s":
        return entry(value, **goal.where)
    return entry(1.0, **goal.where, **{goal.figure: value})


@pytest.mark.parametrize("met", [True, False], ids=["met", "missed"])
def test_goal_verdicts_follow_the_thresholds(report_module, met):
    goals = report_module.GOALS
    above = 1.1 if met else 0.9
    figures = {
        name: goal.threshold * (above if goal.at_least else 1 / above)
        for name, goal in goals.items()
    }
    benchmarks = [goal_benchmark(goals[name], value) for name, value in figures.items()]
    markdown = report_module.render_markdown(bench_json(benchmarks))
    rows = {row[0]: row for row in table_rows(markdown, "Goals")}
    assert set(rows) == set(goals)
    for name, value in figures.items():
        assert number(rows[name][2]) == pytest.approx(value, abs=5e-4)
        assert rows[name][3] == ("met" if met else "missed")


def test_the_worst_matching_entry_decides_a_goal(report_module):
    name, goal = "replay efficiency, every key", report_module.GOALS["replay efficiency, every key"]
    good, bad = goal.threshold + 0.05, goal.threshold - 0.05
    benchmarks = [
        entry(1.0, **goal.where, key=[1, 64], efficiency=good),
        entry(1.0, **goal.where, key=[8, 64], efficiency=bad),
    ]
    entries = report_module.load_entries(bench_json(benchmarks))
    assert report_module.goal_figures(entries)[name] == pytest.approx(bad)


def test_nothing_measured_says_so(report_module):
    markdown = report_module.render_markdown(bench_json([entry(1.0, unrelated=True)]))
    goal_rows = table_rows(markdown, "Goals")
    assert {row[3] for row in goal_rows} == {"not measured"}
    assert markdown.count("(not measured in this run)") == 5


def test_plot_is_skipped_with_a_message_without_matplotlib(
    report_module, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot = tmp_path / "bench.png"
    assert report_module.write_plot(bench_json(forward_benchmarks()), plot) is False
    assert not plot.exists()
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_cli_writes_the_report_and_the_plot_when_it_can(tmp_path):
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(bench_json(forward_benchmarks())))
    out, plot = tmp_path / "reports" / "bench.md", tmp_path / "reports" / "bench.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(source), "--out", str(out), "--plot", str(plot)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.read_text().startswith("# Benchmarks")
    if importlib.util.find_spec("matplotlib") is None:
        assert not plot.exists() and "matplotlib is not installed" in done.stderr
    else:
        assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
