"""scripts/order_independence.py compares the suite's verdicts alone and in full from the JSON
results alone: canned documents in the shape the plugin writes (results.results_document), the
bounded-memory check's figures read from the row's named values."""

from __future__ import annotations

import ast
import fnmatch
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import script_module

from pytest_cudagraph import results
from pytest_cudagraph.results import Section, results_document

CHECKS = Path(results.__file__).parent / "conformance" / "checks"
COMPLETE = results.session_end(pytest.ExitCode.OK, None)


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    with script_module("order_independence") as module:
        yield module


def document(
    *rows: tuple[str, str, dict[str, float]], session: results.SessionEnd | None = COMPLETE
) -> dict[str, object]:
    """A results document with these (check, verdict, values) conformance rows."""
    conformance = {
        "target": "reasyn",
        "rows": [
            {
                "check": check,
                "verdict": verdict,
                "seconds": 1.0,
                "figure": "",
                "reason": "",
                "values": values,
            }
            for check, verdict, values in rows
        ],
    }
    section = Section("conformance", lambda records: conformance)
    return json.loads(json.dumps(results_document([section], [], None, session=session)))


def memory_row(peak: float, after: float, first: float, verdict: str = "passed") -> tuple:
    values = {"peak_mib": peak, "after_reset_mib": after, "first_use_mib": first}
    return ("bounded memory", verdict, {**values, "bound_mib": 900.0})


def test_the_memory_values_are_read_from_the_row(script: ModuleType) -> None:
    row = document(memory_row(350, -4, 12))["conformance"]["rows"][0]
    assert script.memory_values(row) == {
        "peak_mib": 350.0,
        "after_reset_mib": -4.0,
        "first_use_mib": 12.0,
    }
    assert script.memory_values({"values": {"peak_mib": 1.0}})["first_use_mib"] is None


def test_the_values_read_are_those_the_check_records(script: ModuleType) -> None:
    """The names live in the values of the check's Judgement (the figure's named numbers);
    the script must read those."""
    tree = ast.parse((CHECKS / "test_09_bounded_memory.py").read_text())
    [check] = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "test_bounded_memory"
    ]
    [call] = [
        node
        for node in ast.walk(check)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Judgement"
    ]
    given = [keyword.value for keyword in call.keywords if keyword.arg == "values"]
    [values] = given or call.args[4:5]  # Judgement(problems, figure, judged, unit, values)
    if isinstance(values, ast.Name):  # a dict the check built first
        [values] = [
            node.value
            for node in ast.walk(check)
            if isinstance(node, ast.Assign)
            and any(getattr(name, "id", None) == values.id for name in node.targets)
        ]
    assert isinstance(values, ast.Dict)
    recorded = {key.value for key in values.keys if isinstance(key, ast.Constant)}
    assert set(script.SHOWN_VALUES) <= recorded


def test_same_verdicts_and_close_figures_are_no_difference(script: ModuleType) -> None:
    full = script.Run(document(("parity", "passed", {}), memory_row(350, 0, 12)))
    alone = {
        "parity": script.Run(document(("parity", "passed", {}))),
        "bounded memory": script.Run(document(memory_row(380, 20, 40))),  # each within 32 MiB
    }
    comparisons = script.compare(full, alone)
    assert [item.differences() for item in comparisons] == [[], []]
    report = script.markdown("reasyn", comparisons)
    assert (
        "| bounded memory | passed | passed | peak +380, after reset +20, first use +40 | "
        in report
    )
    assert report.endswith("0 of 2 checks differ.\n")


def test_a_changed_verdict_and_a_figure_apart_are_flagged(script: ModuleType) -> None:
    full = script.Run(document(("parity", "passed", {}), memory_row(260, 0, 12)))
    alone = {
        "parity": script.Run(document(("parity", "FAILED", {}))),
        "bounded memory": script.Run(document(memory_row(486, 228, 12))),
    }
    parity, memory = script.compare(full, alone)
    assert parity.differences() == ["verdict FAILED alone, passed in the full suite"]
    assert memory.differences() == [
        "peak +486 MiB alone, +260 MiB in the full suite (more than 32 MiB apart)",
        "after reset +228 MiB alone, +0 MiB in the full suite (more than 32 MiB apart)",
    ]
    assert script.markdown("reasyn", [parity, memory]).endswith("2 of 2 checks differ.\n")


@pytest.mark.parametrize(("alone", "full"), [(32.0, 0.0), (0.0, 32.0)])
def test_figures_exactly_the_tolerance_apart_are_no_difference(
    script: ModuleType, alone: float, full: float
) -> None:
    (memory,) = script.compare(
        script.Run(document(memory_row(100 + full, full, 0))),
        {"bounded memory": script.Run(document(memory_row(100 + alone, alone, 0)))},
    )
    assert memory.differences() == []


def test_first_use_apart_is_no_difference(script: ModuleType) -> None:
    """Run alone, a check's warm-up pays the process's first-use costs; in the full suite an
    earlier check has paid them. The judged figures must agree, first use may not."""
    full = script.Run(document(memory_row(228, 0, 0)))
    alone = {"bounded memory": script.Run(document(memory_row(230, 2, 136)))}
    (memory,) = script.compare(full, alone)
    assert memory.differences() == []


def test_a_check_missing_from_its_own_run_is_a_difference(script: ModuleType) -> None:
    full = script.Run(document(("guards", "passed", {})))
    (guards,) = script.compare(full, {"guards": script.Run(document())})
    assert guards.differences() == ["verdict not run alone, passed in the full suite"]


@pytest.mark.parametrize(
    ("name", "exit_code", "problem"),
    [
        ("gone.json", 137, "wrote no results to gone.json (pytest exited 137)"),
        ("old.json", None, "left results that cannot be read: *results of format 1*"),
        ("stopped.json", None, "is partial (KeyboardInterrupt)"),
        ("internal.json", None, "is partial (INTERNAL_ERROR)"),
    ],
    ids=["killed", "other format", "interrupted", "internal error"],
)
def test_a_run_that_proves_nothing_is_a_difference_even_with_the_same_verdict(
    script: ModuleType, tmp_path: Path, name: str, exit_code: int | None, problem: str
) -> None:
    """A target whose processes all died once passed here (exit 0)."""
    (tmp_path / "old.json").write_text('{"format": 1}')
    ended = {
        "stopped.json": results.session_end(pytest.ExitCode.INTERRUPTED, "KeyboardInterrupt"),
        "internal.json": results.session_end(pytest.ExitCode.INTERNAL_ERROR, None),
    }
    for file, session in ended.items():
        (tmp_path / file).write_text(
            json.dumps(document(("guards", "passed", {}), session=session))
        )
    broken = script.load_run(tmp_path / name, exit_code)
    sound = script.Run(document(("guards", "passed", {})))
    (guards,) = script.compare(sound, {"guards": broken})
    assert fnmatch.fnmatch(guards.differences()[0], f"the run alone {problem}")
    if broken.rows():  # a partial full run: each of its checks differs
        (guards,) = script.compare(broken, {"guards": sound})
        assert [fnmatch.fnmatch(d, f"the full run {problem}") for d in guards.differences()] == [
            True
        ]


def test_results_that_do_not_say_how_the_session_ended_prove_nothing(script: ModuleType) -> None:
    assert script.Run(document(("guards", "passed", {}), session=None)).problem() == (
        "left results that do not say how the session ended"
    )


def test_main_runs_the_full_suite_then_each_check_alone_and_exits_on_a_difference(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows_of_run = {  # -k expression -> the rows its run reports
        "not test_worker_processes": [("guards", "passed", {}), ("parity", "passed", {})],
        "test_guards": [("guards", "FAILED", {})],
        "test_parity": [("parity", "passed", {})],
    }
    runs = []

    def fake_run(target: str, json_path: Path, select: str | None, extra: list[str]) -> object:
        runs.append((target, json_path.name, select, list(extra)))
        json_path.write_text(json.dumps(document(*rows_of_run[select])))
        return script.load_run(json_path)

    monkeypatch.setattr(script, "run_suite", fake_run)
    report = tmp_path / "order.md"
    code = script.main(
        [
            "reasyn",
            "--out",
            str(tmp_path),
            "--report",
            str(report),
            "--skip",
            "worker_processes",
            "--",
            "-x",
        ]
    )
    assert code == 1
    assert runs == [
        ("reasyn", "full.json", "not test_worker_processes", ["-x"]),
        ("reasyn", "alone-test_guards.json", "test_guards", ["-x"]),
        ("reasyn", "alone-test_parity.json", "test_parity", ["-x"]),
    ]
    text = report.read_text()
    assert "| guards | FAILED | passed |" in text
    assert "1 of 2 checks differ." in text


def test_main_exits_non_zero_when_a_check_alone_dies(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_run(target: str, json_path: Path, select: str | None, extra: list[str]) -> object:
        if select is None:
            json_path.write_text(json.dumps(document(("guards", "passed", {}))))
        return script.load_run(json_path, None if select is None else -9)

    monkeypatch.setattr(script, "run_suite", fake_run)
    assert script.main(["reasyn", "--out", str(tmp_path)]) == 1


def test_main_exits_non_zero_when_the_full_run_leaves_nothing_to_compare(
    script: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(script, "run_suite", lambda *args: script.load_run(tmp_path / "x.json", 2))
    assert script.main(["reasyn", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().out == (
        "nothing to compare: the full run wrote no results to x.json (pytest exited 2)\n"
    )


def test_only_and_reuse_full_compare_a_subset_without_running_the_suite_again(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = document(("guards", "passed", {}), memory_row(350, 0, 12))
    (tmp_path / "full.json").write_text(json.dumps(full))
    runs = []

    def fake_run(target: str, json_path: Path, select: str | None, extra: list[str]) -> object:
        runs.append(select)
        json_path.write_text(json.dumps(document(memory_row(500, 0, 12))))
        return script.load_run(json_path)

    monkeypatch.setattr(script, "run_suite", fake_run)
    report = tmp_path / "order.md"
    argv = ["reasyn", "--out", str(tmp_path), "--report", str(report), "--reuse-full"]
    assert script.main([*argv, "--only", "bounded_memory"]) == 1
    assert runs == ["test_bounded_memory"]
    text = report.read_text()
    assert "| guards |" not in text
    assert "peak +500 MiB alone, +350 MiB in the full suite" in text


def test_jobs_run_the_checks_alone_side_by_side_and_compare_the_same(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = ("guards", "parity", "captures")
    both_started = threading.Barrier(len(checks), timeout=10)  # all alone runs at once

    def fake_run(target: str, json_path: Path, select: str | None, extra: list[str]) -> object:
        if select is None:
            rows = [(check, "passed", {}) for check in checks]
        else:
            both_started.wait()
            rows = [(select.removeprefix("test_"), "passed", {})]
        json_path.write_text(json.dumps(document(*rows)))
        return script.load_run(json_path)

    monkeypatch.setattr(script, "run_suite", fake_run)
    report = tmp_path / "order.md"
    assert (
        script.main(["reasyn", "--out", str(tmp_path), "--jobs", "3", "--report", str(report)]) == 0
    )
    assert "0 of 3 checks differ." in report.read_text()
    monkeypatch.setattr(script, "run_suite", None)  # refused before any run
    with pytest.raises(SystemExit):
        script.main(["reasyn", "--out", str(tmp_path), "--jobs", "0"])


def test_an_interrupted_run_keeps_the_checks_that_ran_alone_and_reports_the_rest(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT (the GPU recipe cutting the step) while the second check runs alone, one at a
    time: the first two are kept, the third is never started and reads "not run"."""
    full = script.Run(document(*((check, "passed", {}) for check in ("a", "b", "c"))))
    second_started = threading.Event()

    def run_alone(check: str) -> object:
        if check == "b":
            second_started.set()
            time.sleep(1)  # still running when the main thread is interrupted
        return script.Run(document((check, "passed", {})))

    def interrupted(futures: object) -> None:
        second_started.wait(timeout=10)
        raise KeyboardInterrupt  # where SIGINT reaches the main thread

    monkeypatch.setattr(script, "wait", interrupted)
    alone = script.run_each(["a", "b", "c"], run_alone, jobs=1)
    assert list(alone) == ["a", "b"]
    comparisons = {item.check: item for item in script.compare(full, alone)}
    assert comparisons["c"].alone == "not run"
    assert comparisons["c"].differences() == [
        "the run alone was not run",
        "verdict not run alone, passed in the full suite",
    ]
