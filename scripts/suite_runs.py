"""Runs of the conformance suite side by side, for the GPU recipe's stability and emulation
steps: each run its own pytest process writing its ``--cudagraph-json`` results, its output and
its exit status into one folder, and what the reports read back from there: each row's verdict
and whether the exit status is the one the verdicts give. Reading needs only the folder, so a
report can be made again from a run's files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from order_independence import Run, load_run

FAILING = ("FAILED", "ERROR")


@dataclass(frozen=True)
class SuiteRun:
    """One run: the suite on ``target``, with ``args`` and ``env`` added; its files in the run
    folder are NAME.json (results), NAME.log (output) and NAME.exit (exit status)."""

    name: str
    target: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def command(self, folder: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "pytest_cudagraph.conformance",
            *("-p", "no:cacheprovider", "-p", "no:randomly"),
            "--cudagraph-target",
            self.target,
            f"--cudagraph-json={folder / self.name}.json",
            *self.args,
        ]

    def run(self, folder: Path) -> int:
        """The run, to its end; its exit status, also written to NAME.exit."""
        with (folder / f"{self.name}.log").open("wb") as log:
            finished = subprocess.run(
                self.command(folder),
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        (folder / f"{self.name}.exit").write_text(f"{finished.returncode}\n")
        return finished.returncode


def slug(target: str) -> str:
    """A file name for a target spec: ``pkg.mod:make_target`` -> ``pkg.mod-make_target``."""
    return re.sub(r"[^\w.]+", "-", target).strip("-")


def run_all(runs: Sequence[SuiteRun], folder: Path, jobs: int) -> None:
    """Every run, ``jobs`` at a time in the order given. Interrupted (the recipe stops a step
    with SIGINT to its process group: the runs in flight get it too and write partial
    results), the runs that ended are kept and the rest are not started."""
    folder.mkdir(parents=True, exist_ok=True)
    for run in runs:
        print("$", " ".join(run.command(folder)), flush=True)
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(run.run, folder) for run in runs]
    try:
        wait(futures)
    except KeyboardInterrupt:
        print("interrupted: the runs not yet started are left out", flush=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Outcome:
    """What one run left: its exit status (None: it did not end) and its results."""

    name: str
    exit: int | None
    results: Run

    def verdicts(self) -> dict[str, str]:
        """check -> verdict, in the table's order."""
        return {check: str(row["verdict"]) for check, row in self.results.rows().items()}

    def failed(self) -> bool:
        return any(verdict in FAILING for verdict in self.verdicts().values())

    def missing(self) -> str | None:
        """Why this run proves nothing: it did not end, or left no complete results."""
        if self.exit is None:
            return "did not end (not run, or cut before it could)"
        missing = self.results.problem()
        if missing is not None:
            return f"exited {self.exit} and {missing} (its log: {self.name}.log)"
        if not self.verdicts():
            return f"exited {self.exit} with no conformance table (its log: {self.name}.log)"
        return None

    def problem(self) -> str | None:
        """``missing``, or an exit status other than its verdicts give (0 when none failed, 1
        when one did)."""
        missing = self.missing()
        if missing is not None:
            return missing
        expected = int(self.failed())
        if self.exit != expected:
            return f"exited {self.exit}, its verdicts give {expected}"
        return None


def outcome(folder: Path, name: str) -> Outcome:
    exit_file = folder / f"{name}.exit"
    code = int(exit_file.read_text()) if exit_file.is_file() else None
    return Outcome(name, code, load_run(folder / f"{name}.json"))


def cell(text: str) -> str:
    """``text`` inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def published(report: str, problems: int, path: Path | None) -> int:
    """``report`` printed, and written to ``path`` where given; the exit status: 1 when it
    shows a problem."""
    print(report)
    if path is not None:
        path.write_text(report)
    return int(problems > 0)
