"""Build the GPU run's Markdown report from what scripts/gpu_suite.sh left in one OUTDIR or more
(one per device call, when the recipe ran in parts with STEPS).

Each step's results file (``STEP.json``, the plugin's ``--cudagraph-json``) is rendered by the
plugin's own Markdown report (pytest_cudagraph.report_markdown): outcomes and failure reasons,
the figures tests recorded with ``record_property``, parity, memory, the conformance table,
skips; a step that writes Markdown instead (order independence) is included as it is. This
script adds what the results cannot know: the commands that ran, which steps ran, were cut off
at their limit or did not run (``steps.jsonl``, ``recipe.json``), and the benchmark report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_recipe import STEP_NAMES

from pytest_cudagraph import report_markdown, results


def read_runs(outdirs: Sequence[Path]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each OUTDIR's recipe.json (what ran) and step -> the record of its last run
    (steps.jsonl, one JSON object a line)."""
    recipes, records = [], {}
    for outdir in outdirs:
        recipe = outdir / "recipe.json"
        if recipe.exists():
            recipes.append(json.loads(recipe.read_text()))
        steps = outdir / "steps.jsonl"
        if steps.exists():
            for line in steps.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    records[record["step"]] = record
    return recipes, records


def outcome(step: str, record: dict[str, Any] | None, recipes: Sequence[dict[str, Any]]) -> str:
    if record is None:
        if any(step in recipe["steps"] for recipe in recipes):
            return "did not run: the run's budget (BUDGET_S) ran out or the run was stopped"
        return "not run (not in STEPS)"
    if record["cut"]:
        stopped = {"limit": f"its limit ({record['limit_s']} s)", "budget": "the run's BUDGET_S"}
        by = stopped.get(record["cut"], "an interrupt")
        return f"cut off by {by} after {record['seconds']:.0f} s: the results it had"
    return "passed" if record["exit"] == 0 else f"failed (exit {record['exit']})"


def steps_table(recipes: Sequence[dict[str, Any]], records: dict[str, dict[str, Any]]) -> list[str]:
    """One row per step the runs planned: its outcome, its seconds against the plan."""
    planned = {name for recipe in recipes for name in recipe["planned"]} | set(records)
    lines = ["| step | outcome | seconds | planned s |", "| --- | --- | --- | --- |"]
    for step in STEP_NAMES:
        if step in planned:
            record = records.get(step)
            seconds = f"{record['seconds']:.0f}" if record else "-"
            plan = recipes[0]["planned"].get(step, "-") if recipes else "-"
            lines.append(f"| {step} | {outcome(step, record, recipes)} | {seconds} | {plan} |")
    return lines


def step_body(outdirs: Sequence[Path], step: str, record: dict[str, Any] | None) -> list[str]:
    """A step's section: its results rendered, its own Markdown, or why there is neither."""
    for outdir in reversed(outdirs):  # a later call's run of a step is the one reported
        path = outdir / f"{step}.json"
        if path.exists():
            try:
                return report_markdown.body_lines(results.read_document(path), level=3)
            except ValueError as error:
                return [f"Results unreadable: {error}", ""]
        markdown = outdir / f"{step}.md"
        if markdown.exists():
            return [markdown.read_text(), ""]
    if record is None:
        return []
    return [f"No results: the step exited {record['exit']} without writing {step}.json.", ""]


def first_results(outdirs: Sequence[Path]) -> dict[str, object] | None:
    """The first readable results of any step: where the header's stack comes from."""
    for outdir in outdirs:
        for step in STEP_NAMES:
            with contextlib.suppress(OSError, ValueError):
                return results.read_document(outdir / f"{step}.json")
    return None


def render(outdirs: Sequence[Path], label: str, commit: str | None = None) -> str:
    recipes, records = read_runs(outdirs)
    document = first_results(outdirs)
    commit = commit or next((recipe["commit"] for recipe in recipes), None)
    out = [f"# GPU run: {label}", ""]
    if document is not None:
        out += report_markdown.header_lines(document, commit)
    elif commit:
        out.append(f"- commit: {commit}")
    out += [f"- command: `{recipe['command']}`" for recipe in recipes]
    out += ["", "## Steps", "", *steps_table(recipes, records), ""]
    for step in STEP_NAMES:
        body = step_body(outdirs, step, records.get(step))
        if body:
            out += [f"## {step}", "", *body]
    for outdir in outdirs:
        bench = outdir / f"bench-{label}.md"
        if bench.exists():
            out += ["## Benchmarks", "", bench.read_text()]
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdirs", type=Path, nargs="+", help="the recipe's OUTDIR(s), in order")
    parser.add_argument("--label", default="gpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--commit",
        help="the commit of the tree that ran (default: what the recipe recorded)",
    )
    args = parser.parse_args()
    args.out.write_text(render(args.outdirs, args.label, args.commit))


if __name__ == "__main__":
    main()
