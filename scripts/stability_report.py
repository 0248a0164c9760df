"""Show that the conformance verdicts on a GPU do not depend on the load: run the suite on each
target several times side by side (``--jobs`` processes at once, each target's runs together),
then read each run's ``--cudagraph-json`` results and say, per target and per check, whether
every run gave the same verdict, and per run whether its exit status is the one its verdicts
give (0 when every check passed or skipped, 1 when one failed). Exit 1 when a verdict differs,
an exit status does not match, or a run proves nothing (no results, or partial ones).

    python scripts/stability_report.py --runs 5 --jobs 16 --out runs/ reasyn reasyn-kv
    python scripts/stability_report.py --reuse --runs 5 --out runs/ reasyn   (report again)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from suite_runs import Outcome, SuiteRun, cell, outcome, published, run_all, slug


def runs_of(targets: Sequence[str], runs: int, args: Sequence[str]) -> list[SuiteRun]:
    """Each target's runs one after another, so that they start side by side."""
    return [
        SuiteRun(f"{slug(target)}-{index}", target, tuple(args))
        for target in targets
        for index in range(1, runs + 1)
    ]


def target_lines(target: str, outcomes: Sequence[Outcome]) -> tuple[list[str], int]:
    """The target's section, and how many problems it shows: rows that differ among the runs
    that left complete results ("-": none), runs whose exit status does not match or that
    prove nothing."""
    verdicts = [run.verdicts() for run in outcomes]
    whole = [found for found, run in zip(verdicts, outcomes, strict=True) if not run.missing()]
    checks = list(dict.fromkeys(check for run in verdicts for check in run))
    numbers = " | ".join(f"run {index}" for index in range(1, len(outcomes) + 1))
    lines = [
        f"### {target}",
        "",
        f"| check | {numbers} | identical |",
        "| --- | " + "--- | " * len(outcomes) + "--- |",
    ]
    problems = 0
    for check in checks:
        seen = [run.get(check, "no row") if run else "-" for run in verdicts]
        same = len({run.get(check, "no row") for run in whole}) <= 1
        problems += not same
        lines.append(f"| {check} | {' | '.join(seen)} | {'yes' if same else 'NO'} |")
    lines.append("")
    for index, run in enumerate(outcomes, 1):
        problem = run.problem()
        problems += problem is not None
        said = f"exit {run.exit}, as its verdicts give" if problem is None else problem
        lines.append(f"- run {index}: {cell(said)}")
    return [*lines, ""], problems


def markdown(targets: Sequence[str], runs: int, folder: Path) -> tuple[str, int]:
    """The report over every target's runs in ``folder``, and its problems."""
    lines = [
        f"## Stability: {runs} runs of each target side by side",
        "",
        "Each check's verdict in every run, and each run's exit status against its verdicts.",
        "",
    ]
    sections, summary, problems = [], [], 0
    for target in targets:
        outcomes = [outcome(folder, f"{slug(target)}-{index}") for index in range(1, runs + 1)]
        section, found = target_lines(target, outcomes)
        sections += section
        problems += found
        summary.append(f"- {target}: {f'{found} problem(s)' if found else 'stable'}")
    return "\n".join([*lines, *summary, "", *sections]), problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", help="conformance targets (names or module:factory)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each target (default 5)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--out", type=Path, required=True, help="the runs' folder")
    parser.add_argument("--report", type=Path, help="write the Markdown report here too")
    parser.add_argument("--reuse", action="store_true", help="report on the runs in --out")
    parser.epilog = "Arguments after -- go to every pytest run."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if args.runs < 2 or args.jobs < 1:
        parser.error("--runs must be at least 2 and --jobs at least 1")
    if not args.reuse:
        run_all(runs_of(args.targets, args.runs, argv[split + 1 :]), args.out, args.jobs)
    return published(*markdown(args.targets, args.runs, args.out), args.report)


if __name__ == "__main__":
    sys.exit(main())
