"""Build the GPU run's markdown report from what scripts/gpu_suite.sh left in OUTDIR.

Reads stack.json, each step's JUnit XML (outcomes, skip reasons, failure messages and the
figures tests recorded with ``record_property``), the plugin's "cudagraph" terminal summary
section from each step's log, and bench.md when the benchmarks ran.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

STEPS = ("tests", "conformance", "conformance-kv", "conformance-xdist", "bench")
SUITE_KNOBS = ("TEST_ARGS", "SKIP_BENCH", "BENCH_ARGS")


def junit_outcomes(path: Path) -> dict:
    """Counts, skip reasons, failures and recorded properties of one JUnit XML file."""
    counts: Counter[str] = Counter()
    skips: Counter[str] = Counter()
    failures: list[tuple[str, str]] = []
    figures: list[tuple[str, str, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        skipped = case.find("skipped")
        failed = case.find("failure")
        if failed is None:
            failed = case.find("error")
        if skipped is not None:
            counts["skipped"] += 1
            skips[_one_line(skipped.get("message", ""))] += 1
        elif failed is not None:
            counts["failed"] += 1
            failures.append((name, _one_line(failed.get("message", ""))))
        else:
            counts["passed"] += 1
        for prop in case.iter("property"):
            figures.append((name, prop.get("name", ""), prop.get("value", "")))
    return {"counts": counts, "skips": skips, "failures": failures, "figures": figures}


def summary_section(log: Path) -> list[str]:
    """The lines of the plugin's "cudagraph" terminal summary section in a pytest log."""
    lines = log.read_text(errors="replace").splitlines()
    section: list[str] = []
    inside = False
    for line in lines:
        if re.match(r"^=+ .* =+$", line):
            inside = "cudagraph" in line
            continue
        if inside:
            section.append(line)
    return section


def suite_command(label: str) -> str:
    """The gpu_suite.sh command line, with the knobs (environment) that changed what ran."""
    knobs = [f"{name}='{os.environ[name]}' " for name in SUITE_KNOBS if os.environ.get(name)]
    return "".join(knobs) + f"bash scripts/gpu_suite.sh $OUT {label}"


def render(outdir: Path, label: str, commit: str) -> str:
    stack = json.loads((outdir / "stack.json").read_text())
    out = [
        f"# GPU run: {label}",
        "",
        f"- date: {stack['date']}",
        f"- GPUs: {', '.join(stack['gpus']) or 'none'}; driver {stack['driver']}",
        f"- python {stack['python']}, torch {stack['torch']}, torch CUDA {stack['torch_cuda']}",
        f"- tree: commit {commit}",
        f"- command: `{suite_command(label)}`",
        "",
    ]
    exits = outdir / "exits.txt"
    if exits.exists():
        out += ["Step exit codes: " + "; ".join(exits.read_text().split("\n")).strip("; "), ""]
    for step in STEPS:
        xml = outdir / f"{step}.xml"
        if not xml.exists():
            continue
        result = junit_outcomes(xml)
        counts = result["counts"]
        out += [
            f"## {step}",
            "",
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped",
            "",
        ]
        if result["failures"]:
            out += ["Failures:", ""]
            out += [f"- `{name}`: {message}" for name, message in result["failures"]]
            out.append("")
        if result["skips"]:
            out += ["Skips by reason:", ""]
            out += [f"- {n} x {reason}" for reason, n in result["skips"].most_common()]
            out.append("")
        if result["figures"]:
            out += ["| test | figure | value |", "| --- | --- | --- |"]
            out += [f"| `{n}` | {k} | {v} |" for n, k, v in result["figures"]]
            out.append("")
        log = outdir / f"{step}.log"
        section = summary_section(log) if log.exists() else []
        if section:
            out += ["Plugin summary:", "", "```", *section, "```", ""]
    bench = outdir / "bench.md"
    if bench.exists():
        out += ["## Benchmarks", "", bench.read_text()]
    return "\n".join(out) + "\n"


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--label", default="gpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="unknown", help="the commit of the tree that ran")
    args = parser.parse_args()
    args.out.write_text(render(args.outdir, args.label, args.commit))


if __name__ == "__main__":
    main()
