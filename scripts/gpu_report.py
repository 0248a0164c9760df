"""Build the GPU run's Markdown report from what scripts/gpu_suite.sh left in OUTDIR.

Each step's results file (``STEP.json``, the plugin's ``--cudagraph-json``) is rendered by the
plugin's own Markdown report (pytest_cudagraph.report_markdown): outcomes and failure reasons,
the figures tests recorded with ``record_property``, parity, memory, the conformance table,
skips. This script adds only what the results cannot know: the steps' exit codes (a step that
died wrote no results), the command that ran, and the benchmarks' bench.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pytest_cudagraph import report_markdown, results

STEPS = (
    "tests",
    "tests-reasyn-ref",
    "tests-conformance",
    "conformance",
    "conformance-kv",
    "conformance-lean",
    "conformance-decode-step",
    "conformance-decode-token",
    "conformance-graphed-layer",
    "conformance-bucket-runner",
    "conformance-piecewise-runner",
    "conformance-hf-static-cache",
    "conformance-foreign",
    "conformance-quickstart",
    "conformance-xdist",
    "bench",
)
SUITE_KNOBS = ("TEST_ARGS", "SKIP_BENCH", "BENCH_COMPARE", "BENCH_ARGS", "GPUS", "STEPS", "JOBS")


def suite_command(label: str) -> str:
    """The gpu_suite.sh command line, with the knobs (environment) that changed what ran."""
    knobs = [f"{name}='{os.environ[name]}' " for name in SUITE_KNOBS if os.environ.get(name)]
    return "".join(knobs) + f"bash scripts/gpu_suite.sh $OUT {label}"


def step_exits(outdir: Path) -> dict[str, str]:
    """Step -> its exit code, from gpu_suite.sh's exits.txt (lines "STEP exit CODE")."""
    path = outdir / "exits.txt"
    if not path.exists():
        return {}
    exits = {}
    for line in path.read_text().splitlines():
        step, _, code = line.partition(" exit ")
        if code:
            exits[step.strip()] = code.strip()
    return exits


def render(outdir: Path, label: str, commit: str | None = None, command: str | None = None) -> str:
    exits = step_exits(outdir)
    documents: dict[str, dict[str, object]] = {}
    problems: dict[str, str] = {}
    for step in STEPS:
        path = outdir / f"{step}.json"
        if path.exists():
            try:
                documents[step] = results.read_document(path)
            except ValueError as error:
                problems[step] = f"Results unreadable: {error}"
        elif step in exits:
            problems[step] = (
                f"No results: the step exited {exits[step]} without writing {path.name}."
            )
    out = [f"# GPU run: {label}", ""]
    if documents:
        out += report_markdown.header_lines(next(iter(documents.values())), commit)
    elif commit:
        out.append(f"- commit: {commit}")
    out += [f"- command: `{command or suite_command(label)}`", ""]
    if exits:
        out += ["Step exit codes: " + "; ".join(f"{s} {c}" for s, c in exits.items()), ""]
    for step in STEPS:
        if step in documents:
            out += [f"## {step}", "", *report_markdown.body_lines(documents[step], level=3)]
        elif step in problems:
            out += [f"## {step}", "", problems[step], ""]
    bench = outdir / "bench.md"
    if bench.exists():
        out += ["## Benchmarks", "", bench.read_text()]
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--label", default="gpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--commit",
        help="the commit of the tree that ran (default: what the results say, from git)",
    )
    parser.add_argument(
        "--command", help="what ran, where it was not gpu_suite.sh (default: its command line)"
    )
    args = parser.parse_args()
    args.out.write_text(render(args.outdir, args.label, args.commit, args.command))


if __name__ == "__main__":
    main()
