"""Build the GPU run's markdown report from what scripts/gpu_suite.sh left in OUTDIR.

Reads each step's plugin results (``--cudagraph-json``: stack facts, parity and memory records,
the conformance table, skips by reason), its JUnit XML (outcomes, failure messages and the
figures tests recorded with ``record_property``), and bench.md when the benchmarks ran.
"""

from __future__ import annotations

import argparse
import json
import os
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

STEPS = (
    "tests",
    "conformance",
    "conformance-kv",
    "conformance-lean",
    "conformance-compiled",
    "conformance-graphed",
    "conformance-runner",
    "conformance-foreign",
    "conformance-xdist",
    "bench",
)
SUITE_KNOBS = ("TEST_ARGS", "SKIP_BENCH", "BENCH_ARGS")


def junit_outcomes(path: Path) -> dict:
    """Counts, failures and recorded properties of one JUnit XML file."""
    counts: Counter[str] = Counter()
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
        elif failed is not None:
            counts["failed"] += 1
            failures.append((name, _one_line(failed.get("message", ""))))
        else:
            counts["passed"] += 1
        for prop in case.iter("property"):
            figures.append((name, prop.get("name", ""), prop.get("value", "")))
    return {"counts": counts, "failures": failures, "figures": figures}


def suite_command(label: str) -> str:
    """The gpu_suite.sh command line, with the knobs (environment) that changed what ran."""
    knobs = [f"{name}='{os.environ[name]}' " for name in SUITE_KNOBS if os.environ.get(name)]
    return "".join(knobs) + f"bash scripts/gpu_suite.sh $OUT {label}"


def stack_lines(stack: dict) -> list[str]:
    gpus = ", ".join(
        f"{gpu['name']} ({gpu['total_bytes'] / 2**30:.0f} GiB)" for gpu in stack["gpus"]
    )
    return [
        f"- GPUs: {gpus or 'none'}; driver {stack['driver'] or 'none'}",
        f"- python {stack['python']}, torch {stack['torch']}, torch CUDA {stack['torch_cuda']}",
    ]


def plugin_lines(results: dict) -> list[str]:
    """The plugin's records of one step: parity, memory, conformance table, skips."""
    out = []
    pinned = results["pinned_stack"]
    verdict = "matches" if pinned["running_matches"] else "; ".join(pinned["mismatches"])
    out += [f"Pinned stack {pinned['pinned']}: {verdict}", ""]
    parity = results["parity"]
    if parity:
        checked = sum(entry["checked"] for entry in parity)
        passed = sum(entry["passed"] for entry in parity)
        out += [f"Parity: {passed} of {checked} checked cases match", ""]
    if results["memory"]:
        out += ["| test | growth MiB | bound MiB | peak MiB | outside torch MiB |"]
        out += ["| --- | --- | --- | --- | --- |"]
        for v in results["memory"]:
            out.append(
                f"| `{v['nodeid']}` | {v['growth_mib']:+.1f} | {v['bound_mib']:g} | "
                f"{v['peak_growth_mib']:+.1f} | {v['outside_torch_growth_mib']:+.1f} |"
            )
        out.append("")
    table = results["conformance"]
    if table:
        out += [f"Conformance of `{table['target']}`:", ""]
        out += ["| check | verdict | seconds | figure |", "| --- | --- | --- | --- |"]
        for row in table["rows"]:
            seconds = f"{row['seconds']:.1f}" if row["seconds"] is not None else "-"
            detail = "; ".join(text for text in (row["figure"], row["reason"]) if text)
            out.append(f"| {row['check']} | {row['verdict']} | {seconds} | {detail} |")
        out.append("")
    skips = results["skips"]["by_reason"]
    if skips:
        out += ["Skips by reason:", ""]
        out += [f"- {entry['count']} x {entry['reason']}" for entry in skips]
        out.append("")
    return out


def render(outdir: Path, label: str, commit: str, command: str | None = None) -> str:
    results = {
        step: json.loads((outdir / f"{step}.json").read_text())
        for step in STEPS
        if (outdir / f"{step}.json").exists()
    }
    out = [f"# GPU run: {label}", ""]
    if results:
        first = next(iter(results.values()))
        out += [f"- date: {first['date']}", *stack_lines(first["stack"])]
    out += [f"- tree: commit {commit}", f"- command: `{command or suite_command(label)}`", ""]
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
        if result["figures"]:
            out += ["| test | figure | value |", "| --- | --- | --- |"]
            out += [f"| `{n}` | {k} | {v} |" for n, k, v in result["figures"]]
            out.append("")
        if step in results:
            out += plugin_lines(results[step])
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
    parser.add_argument(
        "--command", help="what ran, where it was not gpu_suite.sh (default: its command line)"
    )
    args = parser.parse_args()
    args.out.write_text(render(args.outdir, args.label, args.commit, args.command))


if __name__ == "__main__":
    main()
