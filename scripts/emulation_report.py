"""Compare the conformance verdicts on emulated CUDA graphs with those on real ones: run the suite
on each target twice, once on the GPU and once on the CPU with emulated graphs (EMULATE_OPTION,
no GPU visible), then compare the verdicts check by check. A correct target must not fail a
check under emulation that it passes on the GPU; for each broken twin the report says whether
emulation caught it (failed the checks the GPU run failed). Exit 1 when a correct target fails
so, or a run proves nothing (no results, or partial ones).

    python scripts/emulation_report.py --jobs 8 --out runs/ --twins tests/conformance \
        pytest_cudagraph.examples.bucket_runner_target:make_target -- -k "not worker_processes"

The twins of ``--twins FOLDER`` are the factories of its broken_*targets.py (scripts/twins.py;
the folder must be importable, as for the suite's own runs on them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from suite_runs import FAILING, Outcome, SuiteRun, cell, outcome, published, run_all, slug
from twins import twins

# The suite's switch to emulated graphs. The CPU half hides every GPU from torch, and keeps
# each run to one thread: the recipe plans a core a run.
EMULATE_OPTION = "--cudagraph-emulate=on"
EMULATED_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
HALVES = ("gpu", "emulated")


def runs_of(
    targets: Sequence[str], args: Sequence[str], halves: Sequence[str] = HALVES
) -> list[SuiteRun]:
    """Each target on the GPU and emulated (of ``halves``), one after the other."""
    made = {
        "gpu": lambda target: SuiteRun(f"{slug(target)}-gpu", target, tuple(args)),
        "emulated": lambda target: SuiteRun(
            f"{slug(target)}-emulated", target, (*args, EMULATE_OPTION), EMULATED_ENV
        ),
    }
    return [made[half](target) for target in targets for half in halves]


def failed(run: Outcome) -> set[str]:
    return {check for check, verdict in run.verdicts().items() if verdict in FAILING}


def differing_rows(gpu: Outcome, emulated: Outcome) -> list[tuple[str, str, str]]:
    """(check, GPU verdict, emulated verdict) of every check whose verdicts differ."""
    on_gpu, under_emulation = gpu.verdicts(), emulated.verdicts()
    checks = dict.fromkeys([*on_gpu, *under_emulation])
    return [
        (check, on_gpu.get(check, "no row"), under_emulation.get(check, "no row"))
        for check in checks
        if on_gpu.get(check) != under_emulation.get(check)
    ]


def false_failures(gpu: Outcome, emulated: Outcome) -> list[str]:
    """The checks a target fails under emulation and passes on the GPU."""
    return [
        check
        for check, on_gpu, under_emulation in differing_rows(gpu, emulated)
        if on_gpu == "passed" and under_emulation in FAILING
    ]


def caught(gpu: Outcome, emulated: Outcome) -> str:
    """Whether emulation caught a twin: failed every check its GPU run failed."""
    on_gpu, under_emulation = failed(gpu), failed(emulated)
    if not on_gpu:
        return "nothing to catch: the GPU run failed no check"
    missed = sorted(on_gpu - under_emulation)
    if not missed:
        return "yes"
    if len(missed) < len(on_gpu):
        return f"partly, missed {', '.join(missed)}"
    return "no"


def markdown(correct: Sequence[str], twin_specs: Sequence[str], folder: Path) -> tuple[str, int]:
    """The report over the runs in ``folder``, and its problems (a correct target failing a
    check under emulation that it passes on the GPU; a run that proves nothing)."""
    problems, failing, missing = 0, [], []
    rows = ["| target | kind | checks that differ (GPU -> emulated) |", "| --- | --- | --- |"]
    twin_rows = [
        "| twin | failed on the GPU | failed emulated | caught |",
        "| --- | --- | --- | --- |",
    ]
    for target in [*correct, *twin_specs]:
        gpu, emulated = (outcome(folder, f"{slug(target)}-{half}") for half in HALVES)
        kind = "correct" if target in correct else "twin"
        unproven = [
            f"{half}: {why}"
            for half, run in zip(HALVES, (gpu, emulated), strict=True)
            if (why := run.missing()) is not None
        ]
        if unproven:
            problems += len(unproven)
            missing += [f"- {target}, {text}" for text in unproven]
            continue
        differing = differing_rows(gpu, emulated)
        shown = "; ".join(f"{check} {a} -> {b}" for check, a, b in differing) or "none"
        rows.append(f"| {target} | {kind} | {cell(shown)} |")
        if kind == "correct":
            wrong = false_failures(gpu, emulated)
            problems += len(wrong)
            failing += [f"- {target}: {check}" for check in wrong]
        else:
            twin_rows.append(
                f"| {target} | {', '.join(sorted(failed(gpu))) or '-'} | "
                f"{', '.join(sorted(failed(emulated))) or '-'} | {cell(caught(gpu, emulated))} |"
            )
    lines = [
        "## Emulation: verdicts on emulated graphs (CPU) against real ones (GPU)",
        "",
        f"The suite on {len(correct)} correct target(s) and {len(twin_specs)} broken twin(s), "
        f"once on the GPU and once with `{EMULATE_OPTION}` and no visible GPU.",
        "",
        "Correct targets failing a check under emulation that they pass on the GPU: "
        + (str(len(failing)) if failing else "none"),
        *failing,
        "",
        "Runs that prove nothing: " + (str(len(missing)) if missing else "none"),
        *missing,
        "",
        *rows,
        "",
        "### Twins",
        "",
        *twin_rows,
    ]
    return "\n".join([*lines, ""]), problems


def cpu_markdown(
    correct: Sequence[str], twin_specs: Sequence[str], folder: Path
) -> tuple[str, int]:
    """The emulated half alone (``--cpu-only``, no GPU needed): the checks each target failed
    on emulated graphs; its problems: a correct target failing one, a run that proves nothing."""
    problems, lines = 0, ["| target | kind | failed emulated |", "| --- | --- | --- |"]
    for target in [*correct, *twin_specs]:
        emulated = outcome(folder, f"{slug(target)}-emulated")
        kind = "correct" if target in correct else "twin"
        why = emulated.missing()
        shown = why if why is not None else ", ".join(sorted(failed(emulated))) or "-"
        problems += why is not None or (kind == "correct" and bool(failed(emulated)))
        lines.append(f"| {target} | {kind} | {cell(shown)} |")
    head = [
        "## Emulation on the CPU: the checks each target fails on emulated graphs",
        "",
        f"The suite on {len(correct)} correct target(s) and {len(twin_specs)} broken twin(s) "
        f"with `{EMULATE_OPTION}` and no visible GPU.",
        "",
    ]
    return "\n".join([*head, *lines, ""]), problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("correct", nargs="*", help="correct targets (names or module:factory)")
    parser.add_argument("--twins", type=Path, help="a folder of broken_*targets.py modules")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--out", type=Path, required=True, help="the runs' folder")
    parser.add_argument("--report", type=Path, help="write the Markdown report here too")
    parser.add_argument("--reuse", action="store_true", help="report on the runs in --out")
    parser.add_argument(
        "--cpu-only", action="store_true", help="the emulated half alone (no GPU needed)"
    )
    parser.epilog = "Arguments after -- go to every pytest run."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    twin_specs = twins(args.twins) if args.twins else []
    if args.jobs < 1 or not (args.correct or twin_specs):
        parser.error("give targets or a --twins folder holding some, and --jobs of at least 1")
    halves = ("emulated",) if args.cpu_only else HALVES
    if not args.reuse:
        targets = [*args.correct, *twin_specs]
        run_all(runs_of(targets, argv[split + 1 :], halves), args.out, args.jobs)
    report_of = cpu_markdown if args.cpu_only else markdown
    return published(*report_of(args.correct, twin_specs, args.out), args.report)


if __name__ == "__main__":
    sys.exit(main())
