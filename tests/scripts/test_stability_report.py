"""scripts/stability_report.py: per target and per check, whether every run gave the same verdict,
and per run whether its exit status is the one its verdicts give, read from the runs' files
alone (tests/scripts/run_folders.py writes them as scripts/suite_runs.py leaves them); and
once, end to end, the suite run several times side by side on the README's quick start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import stability_report
from run_folders import INTERRUPTED, write_run

ROOT = Path(__file__).resolve().parents[2]
STEADY = {"target contract": "passed", "parity": "passed", "guards": "skipped"}


def report(folder: Path, *targets: str, runs: int = 3) -> tuple[str, int]:
    return stability_report.markdown(targets, runs, folder)


def test_runs_that_agree_and_exit_as_their_verdicts_say_are_stable(tmp_path: Path) -> None:
    for index in (1, 2, 3):
        write_run(tmp_path, f"reasyn-{index}", STEADY)
        write_run(tmp_path, f"mod-make_target-{index}", {"parity": "FAILED"})
    shown, problems = report(tmp_path, "reasyn", "mod:make_target")
    assert problems == 0
    assert "- reasyn: stable" in shown and "- mod:make_target: stable" in shown
    assert "| parity | passed | passed | passed | yes |" in shown
    # A check failing in every run is stable: the conformance steps judge it, not this one.
    assert "| parity | FAILED | FAILED | FAILED | yes |" in shown
    assert shown.count("as its verdicts give") == 6


def test_a_verdict_that_changes_from_run_to_run_is_a_problem(tmp_path: Path) -> None:
    write_run(tmp_path, "reasyn-1", STEADY)
    write_run(tmp_path, "reasyn-2", {**STEADY, "parity": "FAILED"})
    write_run(tmp_path, "reasyn-3", {"target contract": "passed", "parity": "passed"})
    shown, problems = report(tmp_path, "reasyn")
    assert problems == 2
    assert "| parity | passed | FAILED | passed | NO |" in shown
    assert "| guards | skipped | skipped | no row | NO |" in shown
    assert "- reasyn: 2 problem(s)" in shown


@pytest.mark.parametrize(
    ("exit_code", "verdicts", "said"),
    [
        (1, STEADY, "exited 1, its verdicts give 0"),
        (0, {**STEADY, "parity": "ERROR"}, "exited 0, its verdicts give 1"),
        (-11, STEADY, "exited -11, its verdicts give 0"),  # a crash at exit after the table
    ],
)
def test_an_exit_status_other_than_the_verdicts_give_is_a_problem(
    tmp_path: Path, exit_code: int, verdicts: dict[str, str], said: str
) -> None:
    write_run(tmp_path, "reasyn-1", verdicts)
    write_run(tmp_path, "reasyn-2", verdicts, exit_code=exit_code)
    shown, problems = report(tmp_path, "reasyn", runs=2)
    assert problems == 1
    assert f"- run 2: {said}" in shown


def test_a_run_that_proves_nothing_is_a_problem(tmp_path: Path) -> None:
    write_run(tmp_path, "reasyn-1", STEADY)
    write_run(tmp_path, "reasyn-2", STEADY, exit_code=2, session=INTERRUPTED)
    shown, problems = report(tmp_path, "reasyn")  # run 3 never ended
    assert problems == 2  # the rows are compared among the runs that are whole: run 1
    assert "- run 2: exited 2 and is partial (KeyboardInterrupt) (its log: reasyn-2.log)" in shown
    assert "- run 3: did not end (not run, or cut before it could)" in shown
    assert "| parity | passed | passed | - | yes |" in shown


def test_the_exit_status_is_the_reports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for index in (1, 2):
        write_run(tmp_path, f"reasyn-{index}", STEADY)
    out = tmp_path / "stability.md"
    argv = ["--reuse", "--runs", "2", "--out", str(tmp_path), "--report", str(out), "reasyn"]
    assert stability_report.main(argv) == 0
    assert out.read_text() in capsys.readouterr().out
    write_run(tmp_path, "reasyn-2", STEADY, exit_code=1)
    assert stability_report.main(argv) == 1


def test_each_targets_runs_are_asked_for_together() -> None:
    runs = stability_report.runs_of(["reasyn", "pkg.mod:make_target"], 2, ["-x"])
    assert [(run.name, run.target, run.args) for run in runs] == [
        ("reasyn-1", "reasyn", ("-x",)),
        ("reasyn-2", "reasyn", ("-x",)),
        ("pkg.mod-make_target-1", "pkg.mod:make_target", ("-x",)),
        ("pkg.mod-make_target-2", "pkg.mod:make_target", ("-x",)),
    ]
    command = runs[0].command(Path("out"))
    assert command[1:5] == ["-m", "pytest", "--pyargs", "pytest_cudagraph.conformance"]
    assert "--cudagraph-json=out/reasyn-1.json" in command and command[-1] == "-x"


@pytest.mark.slow
@pytest.mark.usefixtures("outside_xdist")
def test_the_suite_run_side_by_side_on_the_quick_start_is_stable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    paths = [str(ROOT / "tests" / "project" / "quickstart"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in paths if path))
    argv = ["--runs", "2", "--jobs", "2", "--out", str(tmp_path), "my_graphs:make_target"]
    assert stability_report.main(argv) == 0, capsys.readouterr().out
    shown = capsys.readouterr().out
    assert "- my_graphs:make_target: stable" in shown
    assert "| target contract | passed | passed | yes |" in shown
    assert (tmp_path / "my_graphs-make_target-2.exit").read_text() == "0\n"
