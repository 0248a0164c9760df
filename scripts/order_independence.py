"""Show that conformance verdicts do not depend on what ran before: run the suite once in full
and then each check alone, every run in its own pytest process with ``--cudagraph-json``, and
compare. A verdict that changes, or a judged bounded-memory figure (peak, after reset) that
moves by more than 32 MiB, is a difference: the table flags it and the exit code is 1. So is
a run that proves nothing: one that wrote no results (it died), or whose results say it is
partial (interrupted, stopped early). First use is shown, not compared: it is what the check's
warm-up absorbs, so it depends on what ran before by design.

    python scripts/order_independence.py reasyn --out runs/reasyn --report order.md
    PYTHONPATH=tests/conformance python scripts/order_independence.py foreign:make_target \
        --skip worker_processes --skip device_binding

The JSON results are the contract (docs/plugin.md, "JSON results"): the verdicts and the
bounded-memory check's named values are read from them, nothing from the terminal output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_cudagraph import results

MEMORY_CHECK = "bounded memory"
MEMORY_TOLERANCE_MIB = 32.0
# The bounded-memory check's values (its Judgement's, in checks/test_09_bounded_memory.py) the
# check judges, by their names in the row's ``values``, and how the report names them.
JUDGED_VALUES = {"peak_mib": "peak", "after_reset_mib": "after reset"}
# Shown too: first use is the warm-up's, order-dependent by design.
SHOWN_VALUES = {**JUDGED_VALUES, "first_use_mib": "first use"}


@dataclass(frozen=True)
class Run:
    """One pytest run of the suite, as its results file tells it (``document`` is None where
    it left none; ``missing`` says why)."""

    document: Mapping[str, Any] | None
    missing: str = "wrote no results"

    def problem(self) -> str | None:
        """Why this run proves nothing (no results, or partial ones), or None."""
        if self.document is None:
            return self.missing
        session = self.document.get("session")
        if not session:
            return "left results that do not say how the session ended"
        if not session["complete"]:
            return f"is partial ({session['stopped'] or session['exit']})"
        return None

    def rows(self) -> dict[str, Mapping[str, Any]]:
        """check name -> its row of the conformance table."""
        table = self.document.get("conformance") if self.document is not None else None
        return {row["check"]: row for row in table["rows"]} if table else {}


def load_run(path: Path, exit_code: int | None = None) -> Run:
    """The run whose results are ``path`` (``exit_code``: its pytest process's, if known)."""
    if not path.is_file():
        code = "" if exit_code is None else f" (pytest exited {exit_code})"
        return Run(None, f"wrote no results to {path.name}{code}")
    try:
        return Run(results.read_document(path))
    except (OSError, ValueError) as error:
        return Run(None, f"left results that cannot be read: {error}")


@dataclass(frozen=True)
class Comparison:
    """One check, alone and in the full suite; a run that proves nothing is a difference."""

    check: str
    alone: str
    full: str
    alone_memory: Mapping[str, float | None] | None = None
    full_memory: Mapping[str, float | None] | None = None
    alone_problem: str | None = None
    full_problem: str | None = None

    def differences(self) -> list[str]:
        found = []
        if self.alone_problem is not None:
            found.append(f"the run alone {self.alone_problem}")
        if self.full_problem is not None:
            found.append(f"the full run {self.full_problem}")
        if self.alone != self.full:
            found.append(f"verdict {self.alone} alone, {self.full} in the full suite")
        if self.alone_memory is not None and self.full_memory is not None:
            for name, shown in JUDGED_VALUES.items():
                alone, full = self.alone_memory.get(name), self.full_memory.get(name)
                if alone is None or full is None:
                    continue
                if abs(alone - full) > MEMORY_TOLERANCE_MIB:
                    found.append(
                        f"{shown} {alone:+.0f} MiB alone, {full:+.0f} MiB in the full suite "
                        f"(more than {MEMORY_TOLERANCE_MIB:g} MiB apart)"
                    )
        return found


def memory_values(row: Mapping[str, Any]) -> dict[str, float | None]:
    """The bounded-memory row's values in MiB (None where the row does not give one)."""
    values = row.get("values") or {}
    return {name: values.get(name) for name in SHOWN_VALUES}


def compare(
    full: Run, alone: Mapping[str, Run], checks: Collection[str] | None = None
) -> list[Comparison]:
    """Each check of the full run (or those of ``checks``) against its run alone (``alone``:
    check -> run)."""
    comparisons = []
    for check, full_row in full.rows().items():
        if checks is not None and check not in checks:
            continue
        run = alone.get(check, Run(None, "was not run"))
        alone_row = run.rows().get(check)
        alone_verdict = str(alone_row["verdict"]) if alone_row else "not run"
        memory = {}
        if check == MEMORY_CHECK and alone_row is not None:
            memory = {
                "alone_memory": memory_values(alone_row),
                "full_memory": memory_values(full_row),
            }
        comparisons.append(
            Comparison(
                check,
                alone_verdict,
                str(full_row["verdict"]),
                alone_problem=run.problem(),
                full_problem=full.problem(),
                **memory,
            )
        )
    return comparisons


def markdown(target: str, comparisons: Sequence[Comparison]) -> str:
    """The report: one row per check, differences flagged."""

    def mib(values: Mapping[str, float | None] | None) -> str:
        if values is None:
            return ""
        return ", ".join(
            f"{SHOWN_VALUES[name]} {value:+.0f}"
            for name, value in values.items()
            if value is not None
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


def run_suite(target: str, json_path: Path, select: str | None, extra: Sequence[str]) -> Run:
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
    finished = subprocess.run(command, check=False)  # failing checks are what is compared
    return load_run(json_path, finished.returncode)


def run_each(checks: Sequence[str], run_alone: Callable[[str], Run], jobs: int) -> dict[str, Run]:
    """check -> its run alone, ``jobs`` at a time. Interrupted (SIGINT, as the GPU recipe stops
    a step at its limit: the runs in flight are interrupted too and leave partial results), the
    runs that ended are kept and the rest left out, so the report says which were not run."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {check: pool.submit(run_alone, check) for check in checks}
    try:
        wait(futures.values())
    except KeyboardInterrupt:
        print("interrupted: the checks not yet run alone are left out")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return {check: run.result() for check, run in futures.items() if not run.cancelled()}


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
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="run up to N checks alone at once (each in its own process; default 1)",
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
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    args.out.mkdir(parents=True, exist_ok=True)
    left_out = " and ".join(f"not test_{name}" for name in args.skip) or None
    full_path = args.out / "full.json"
    if args.reuse_full and full_path.is_file():
        full = load_run(full_path)
    else:
        full = run_suite(args.target, full_path, left_out, pytest_args)
    if not full.rows():
        print(f"nothing to compare: the full run {full.problem() or 'ran no check'}")
        return 1
    only = {f"test_{name}" for name in args.only}
    checks = [c for c in full.rows() if not only or function_name(c) in only]

    def run_alone(check: str) -> Run:
        path = args.out / f"alone-{function_name(check)}.json"
        return run_suite(args.target, path, function_name(check), pytest_args)

    alone = run_each(checks, run_alone, args.jobs)
    comparisons = compare(full, alone, checks)
    report = markdown(args.target, comparisons)
    print(report)
    if args.report is not None:
        args.report.write_text(report)
    return 1 if any(item.differences() for item in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
