"""Show that conformance verdicts do not depend on what ran before: run the suite once in full
and then each check alone, every run in its own pytest process with ``--cudagraph-json``, and
compare. A verdict that changes, or a judged bounded-memory figure (peak, after reset) that
moves by more than 32 MiB, is a difference: the table flags it and the exit code is 1. First
use is shown, not compared: it is what the check's warm-up absorbs, so it depends on what ran
before by design.

    python scripts/order_independence.py reasyn --out runs/reasyn --report order.md
    PYTHONPATH=tests/conformance python scripts/order_independence.py foreign:make_target \
        --skip worker_processes --skip device_binding

The JSON results are the contract (docs/plugin.md, "JSON results"): nothing is read from the
terminal output.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MEMORY_CHECK = "bounded memory"
MEMORY_TOLERANCE_MIB = 32.0
# The figures of the bounded-memory row, e.g. "peak +350 MiB", "after reset +0 MiB",
# "first use +12 MiB".
MEMORY_FIGURES = {
    name: re.compile(rf"{name} ([+-]?\d+(?:\.\d+)?) MiB")
    for name in ("peak", "after reset", "first use")
}
# The figures the check judges; first use is the warm-up's, order-dependent by design.
JUDGED_FIGURES = ("peak", "after reset")


@dataclass(frozen=True)
class Comparison:
    """One check, alone and in the full suite."""

    check: str
    alone: str
    full: str
    alone_memory: Mapping[str, float | None] | None = None
    full_memory: Mapping[str, float | None] | None = None

    def differences(self) -> list[str]:
        found = []
        if self.alone != self.full:
            found.append(f"verdict {self.alone} alone, {self.full} in the full suite")
        if self.alone_memory is not None and self.full_memory is not None:
            for name in JUDGED_FIGURES:
                alone, full = self.alone_memory.get(name), self.full_memory.get(name)
                if alone is None or full is None:
                    continue
                if abs(alone - full) > MEMORY_TOLERANCE_MIB:
                    found.append(
                        f"{name} {alone:+.0f} MiB alone, {full:+.0f} MiB in the full suite "
                        f"(more than {MEMORY_TOLERANCE_MIB:g} MiB apart)"
                    )
        return found


def conformance_rows(document: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    """check name -> its row, from one ``--cudagraph-json`` document."""
    if document.get("format") != 2:
        raise ValueError(f"results document of format {document.get('format')!r}; expected 2")
    conformance = document.get("conformance")
    if not conformance:
        return {}
    return {row["check"]: row for row in conformance["rows"]}


def memory_figures(figure: str) -> dict[str, float | None]:
    """The bounded-memory row's figures in MiB (None where the figure does not give one)."""
    found = {}
    for name, pattern in MEMORY_FIGURES.items():
        match = pattern.search(figure)
        found[name] = float(match.group(1)) if match else None
    return found


def compare(
    full: Mapping[str, object],
    alone: Mapping[str, Mapping[str, object]],
    checks: Collection[str] | None = None,
) -> list[Comparison]:
    """Each check of the full run (or those of ``checks``) against its run alone (``alone``:
    check -> document)."""
    full_rows = conformance_rows(full)
    comparisons = []
    for check, full_row in full_rows.items():
        if checks is not None and check not in checks:
            continue
        alone_row = conformance_rows(alone[check]).get(check) if check in alone else None
        alone_verdict = str(alone_row["verdict"]) if alone_row else "not run"
        memory = {}
        if check == MEMORY_CHECK and alone_row is not None:
            memory = {
                "alone_memory": memory_figures(str(alone_row["figure"])),
                "full_memory": memory_figures(str(full_row["figure"])),
            }
        comparisons.append(Comparison(check, alone_verdict, str(full_row["verdict"]), **memory))
    return comparisons


def markdown(target: str, comparisons: Sequence[Comparison]) -> str:
    """The report: one row per check, differences flagged."""

    def mib(figures: Mapping[str, float | None] | None) -> str:
        if figures is None:
            return ""
        return ", ".join(
            f"{name} {value:+.0f}" for name, value in figures.items() if value is not None
        )

    lines = [
        f"## Order independence: {target}",
        "",
        "Each check alone (its own pytest process) and in the full suite; bounded-memory "
        f"figures in MiB, a difference over {MEMORY_TOLERANCE_MIB:g} MiB in peak or after reset "
        "flagged (first use is the warm-up's, not judged).",
        "",
        "| check | alone | full suite | memory alone | memory full suite | difference |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for item in comparisons:
        found = "; ".join(item.differences()) or "none"
        lines.append(
            f"| {item.check} | {item.alone} | {item.full} | {mib(item.alone_memory)} | "
            f"{mib(item.full_memory)} | {found} |"
        )
    differing = sum(bool(item.differences()) for item in comparisons)
    lines += ["", f"{differing} of {len(comparisons)} checks differ."]
    return "\n".join(lines) + "\n"


def run_suite(target: str, json_path: Path, select: str | None, extra: Sequence[str]) -> None:
    """One run of the suite in a fresh process; its verdicts are in ``json_path``."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "pytest_cudagraph.conformance",
        "-p",
        "no:cacheprovider",
        "--cudagraph-target",
        target,
        "--cudagraph-json",
        str(json_path),
        *(["-k", select] if select else []),
        *extra,
    ]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=False)  # failing checks are what is compared
    if not json_path.is_file():
        raise RuntimeError(f"the run wrote no results to {json_path}: {' '.join(command)}")


def function_name(check: str) -> str:
    """The check's test function: "bounded memory" -> "test_bounded_memory"."""
    return "test_" + check.replace(" ", "_")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="conformance target: an installed name or module:factory")
    parser.add_argument("--out", type=Path, default=Path("order-independence"), help="run folder")
    parser.add_argument("--report", type=Path, help="write the markdown table here too")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="leave a check out of every run (its function name without test_, e.g. "
        "worker_processes); may be repeated",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="CHECK",
        help="run only this check alone and compare it (function name without test_); may be "
        "repeated. With --reuse-full, a long suite can be compared in several calls",
    )
    parser.add_argument(
        "--reuse-full",
        action="store_true",
        help="take the full run from OUT/full.json when it is there instead of running it again",
    )
    parser.epilog = "Arguments after -- go to every pytest run."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    pytest_args = argv[split + 1 :]
    args.out.mkdir(parents=True, exist_ok=True)
    left_out = " and ".join(f"not test_{name}" for name in args.skip) or None
    full_path = args.out / "full.json"
    if not (args.reuse_full and full_path.is_file()):
        run_suite(args.target, full_path, left_out, pytest_args)
    full = json.loads(full_path.read_text())
    only = {f"test_{name}" for name in args.only}
    checks = [c for c in conformance_rows(full) if not only or function_name(c) in only]
    alone = {}
    for check in checks:
        path = args.out / f"alone-{function_name(check)}.json"
        run_suite(args.target, path, function_name(check), pytest_args)
        alone[check] = json.loads(path.read_text())
    comparisons = compare(full, alone, checks)
    report = markdown(args.target, comparisons)
    print(report)
    if args.report is not None:
        args.report.write_text(report)
    return 1 if any(item.differences() for item in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
