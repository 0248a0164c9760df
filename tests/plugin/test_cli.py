"""The ``pytest-cudagraph`` command installed with the plugin: ``report``, ``targets`` and
``checks``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_cudagraph import cli, report_markdown, results
from pytest_cudagraph.conformance import loading
from pytest_cudagraph.conformance.catalog import check_needs, needs_table


def test_the_command_is_installed_with_the_package() -> None:
    [script] = [
        entry
        for entry in importlib.metadata.distribution("pytest-cudagraph").entry_points
        if entry.group == "console_scripts"
    ]
    assert (script.name, script.value) == ("pytest-cudagraph", "pytest_cudagraph.cli:main")


@pytest.fixture
def results_file(cpu_pytester: pytest.Pytester) -> Path:
    cpu_pytester.makepyfile(
        "import torch\n\ndef test_parity(graph_parity):\n"
        "    graph_parity.check(torch.sin, torch.sin, lambda g, c: torch.randn(2), cases=2)\n"
    )
    cpu_pytester.runpytest_inprocess("--cudagraph-json=results.json").assert_outcomes(passed=1)
    return cpu_pytester.path / "results.json"


def test_report_writes_the_markdown_of_a_results_file(results_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "deep" / "report.md"
    assert cli.main(["report", str(results_file), "--out", str(out)]) == 0
    document = json.loads(results_file.read_text())
    assert out.read_text() == report_markdown.render(document)
    assert "2 of 2 checked cases match." in out.read_text()


def test_report_prints_to_stdout_without_importing_torch(results_file: Path) -> None:
    code = (
        "import sys\n"
        "from pytest_cudagraph import cli\n"
        "status = cli.main(['report', sys.argv[1]])\n"
        "assert 'torch' not in sys.modules, 'reading a results file imported torch'\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(results_file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == report_markdown.render(json.loads(results_file.read_text()))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "No such file or directory"),
        ("not json", "not JSON"),
        ('{"format": 1}', "results of format 1; this plugin reads format 2"),
    ],
)
def test_report_refuses_what_is_not_a_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, message: str
) -> None:
    path = tmp_path / "results.json"
    if text is not None:
        path.write_text(text)
    assert cli.main(["report", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("pytest-cudagraph report: ")
    assert message in captured.err


def a_document() -> dict[str, Any]:
    """A valid results document, as JSON gives it back."""
    data: dict[str, object] = {
        "tests": [],
        "parity": [],
        "memory": [],
        "skips": {"total": 0, "by_reason": []},
        "stray_contexts": [],
    }
    sections = [results.Section(name, lambda records, d=d: d) for name, d in data.items()]
    end = results.session_end(pytest.ExitCode.OK, None)
    return json.loads(json.dumps(results.results_document(sections, [], None, session=end)))


def without(name: str) -> Callable[[dict[str, Any]], object]:
    return lambda document: document.pop(name)


def with_value(name: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda document: document.update({name: value})


@pytest.mark.parametrize(
    ("breaking", "message"),
    [
        (without("tests"), "document: 'tests' is missing"),
        (without("date"), "document: 'date' is missing"),
        (with_value("tests", {}), "document['tests']: must be array, got object"),
        (with_value("session", "done"), "document['session']: must be object, got string"),
        (
            with_value("conformance", {"target": "t", "rows": [{"check": "guards"}]}),
            "document['conformance']['rows'][0]: 'verdict' is missing",
        ),
        (
            with_value("skips", {"total": "3", "by_reason": []}),
            "document['skips']['total']: must be integer, got string",
        ),
    ],
    ids=["no tests", "no date", "tests mistyped", "session mistyped", "a row cut", "a count"],
)
def test_report_names_what_is_missing_or_mistyped_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    breaking: Callable[[dict[str, Any]], object],
    message: str,
) -> None:
    """It used to end in a raw KeyError or TypeError traceback from the rendering."""
    document = a_document()
    breaking(document)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    assert cli.main(["report", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"pytest-cudagraph report: {path}: not results as results.schema.json describes them: "
        f"{message}\n"
    )


def test_report_refuses_a_file_nested_past_what_json_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    path.write_text('{"format": 2, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert cli.main(["report", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"pytest-cudagraph report: {path}: nested deeper than a JSON reader goes\n"
    )


def test_a_report_that_cannot_be_written_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(a_document()))
    folder = tmp_path / "out"
    folder.mkdir()
    assert cli.main(["report", str(path), "--out", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"pytest-cudagraph report: --out {folder}: cannot write the report there: Is a "
        "directory; give a file path\n"
    )
    assert cli.main(["report", str(path), "--out", str(folder / "report.md")]) == 0


def test_targets_lists_the_installed_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["targets"]) == 0
    installed = loading.installed_targets()
    expected = "".join(f"{name}  {value}\n" for name, value in installed.items())
    assert capsys.readouterr().out == (
        expected
        or f"no conformance targets installed (entry-point group {loading.ENTRY_POINT_GROUP})\n"
    )


def test_checks_lists_what_each_check_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["checks"]) == 0
    out = capsys.readouterr().out
    assert out == "\n".join(needs_table(check_needs())) + "\n"
    assert "| bounded memory | yes | `cache.reset`, `cache.capacity`, `cache.largest_key` |" in out


@pytest.mark.parametrize("argv", [[], ["report"], ["nothing"]])
def test_a_bad_command_line_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("usage: pytest-cudagraph")


def test_report_refuses_a_special_file_without_reading_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)  # reading it would wait for a writer for ever
    assert cli.main(["report", str(fifo)]) == 2
    assert capsys.readouterr().err == f"pytest-cudagraph report: {fifo}: not a regular file\n"
