"""scripts/order_independence.py compares the suite's verdicts alone and in full from the JSON
results alone: canned documents in the shape the plugin writes (results.results_document)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import script_module

from pytest_cudagraph.results import Section, results_document

MEMORY_FIGURE = (
    "40 shapes, capacity 3: peak +{peak} MiB of bound 900 MiB (largest graph 160 MiB); "
    "after reset {after:+d} MiB; first use +{first} MiB (warm-up, not judged)"
)


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    with script_module("order_independence") as module:
        yield module


def document(*rows: tuple[str, str, str]) -> dict[str, object]:
    """A results document with these (check, verdict, figure) conformance rows."""
    conformance = {
        "target": "reasyn",
        "rows": [
            {"check": check, "verdict": verdict, "seconds": 1.0, "figure": figure, "reason": ""}
            for check, verdict, figure in rows
        ],
    }
    section = Section("conformance", lambda records: conformance)
    return json.loads(json.dumps(results_document([section], [], None)))


def memory_row(peak: int, after: int, first: int, verdict: str = "passed") -> tuple[str, str, str]:
    return ("bounded memory", verdict, MEMORY_FIGURE.format(peak=peak, after=after, first=first))


def test_the_memory_figures_are_read_from_the_row(script: ModuleType) -> None:
    figure = MEMORY_FIGURE.format(peak=350, after=-4, first=12)
    assert script.memory_figures(figure) == {"peak": 350.0, "after reset": -4.0, "first use": 12.0}
    older = "40 shapes, capacity 3: peak +350 MiB of bound 900 MiB; after reset +0 MiB"
    assert script.memory_figures(older)["first use"] is None


def test_same_verdicts_and_close_figures_are_no_difference(script: ModuleType) -> None:
    full = document(("parity", "passed", "64 cases"), memory_row(350, 0, 12))
    alone = {
        "parity": document(("parity", "passed", "64 cases")),
        "bounded memory": document(memory_row(380, 20, 40)),  # each within 32 MiB
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
    full = document(("parity", "passed", ""), memory_row(260, 0, 12, "passed"))
    alone = {
        "parity": document(("parity", "FAILED", "")),
        "bounded memory": document(memory_row(486, 228, 12, "passed")),
    }
    parity, memory = script.compare(full, alone)
    assert parity.differences() == ["verdict FAILED alone, passed in the full suite"]
    assert memory.differences() == [
        "peak +486 MiB alone, +260 MiB in the full suite (more than 32 MiB apart)",
        "after reset +228 MiB alone, +0 MiB in the full suite (more than 32 MiB apart)",
    ]
    assert script.markdown("reasyn", [parity, memory]).endswith("2 of 2 checks differ.\n")


def test_first_use_apart_is_no_difference(script: ModuleType) -> None:
    """Run alone, a check's warm-up pays the process's first-use costs; in the full suite an
    earlier check has paid them. The judged figures must agree, first use may not."""
    full = document(memory_row(228, 0, 0, "passed"))
    alone = {"bounded memory": document(memory_row(230, 2, 136, "passed"))}
    (memory,) = script.compare(full, alone)
    assert memory.differences() == []


def test_a_check_missing_from_its_own_run_is_a_difference(script: ModuleType) -> None:
    full = document(("guards", "passed", ""))
    (guards,) = script.compare(full, {"guards": document()})
    assert guards.differences() == ["verdict not run alone, passed in the full suite"]


def test_a_document_of_another_format_is_refused(script: ModuleType) -> None:
    with pytest.raises(ValueError, match="format 1; expected 2"):
        script.conformance_rows({"format": 1})


def test_main_runs_the_full_suite_then_each_check_alone_and_exits_on_a_difference(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows_of_run = {  # -k expression -> the rows its run reports
        "not test_worker_processes": [("guards", "passed", ""), ("parity", "passed", "")],
        "test_guards": [("guards", "FAILED", "")],
        "test_parity": [("parity", "passed", "")],
    }
    runs = []

    def fake_run(target: str, json_path: Path, select: str | None, extra: list[str]) -> None:
        runs.append((target, json_path.name, select, list(extra)))
        json_path.write_text(json.dumps(document(*rows_of_run[select])))

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


def test_only_and_reuse_full_compare_a_subset_without_running_the_suite_again(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = document(("guards", "passed", ""), memory_row(350, 0, 12))
    (tmp_path / "full.json").write_text(json.dumps(full))
    runs = []

    def fake_run(target: str, json_path: Path, select: str | None, extra: list[str]) -> None:
        runs.append(select)
        json_path.write_text(json.dumps(document(memory_row(500, 0, 12))))

    monkeypatch.setattr(script, "run_suite", fake_run)
    report = tmp_path / "order.md"
    argv = ["reasyn", "--out", str(tmp_path), "--report", str(report), "--reuse-full"]
    assert script.main([*argv, "--only", "bounded_memory"]) == 1
    assert runs == ["test_bounded_memory"]
    text = report.read_text()
    assert "| guards |" not in text
    assert "peak +500 MiB alone, +350 MiB in the full suite" in text
