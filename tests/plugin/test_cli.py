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

import pytest_cudagraph
from pytest_cudagraph import cli, report_markdown, results
from pytest_cudagraph.conformance import _loading
from pytest_cudagraph.conformance._catalog import declared_checks, needs_table


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
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(a_document()))
    under_a_file = path / "report.md"
    assert cli.main(["report", str(path), "--out", str(under_a_file)]) == 2
    assert capsys.readouterr().err == (
        f"pytest-cudagraph report: --out {under_a_file}: is under {path}, a file, not a folder: "
        "give a file path\n"
    )

    def full_disk(source: object, destination: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    out = tmp_path / "deep" / "report.md"
    assert cli.main(["report", str(path), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"pytest-cudagraph report: --out {out}: cannot write the report there: No space left "
        "on device; give a file path\n"
    )
    assert list(out.parent.iterdir()) == []  # no half-written report, no temporary file
    monkeypatch.undo()
    assert cli.main(["report", str(path), "--out", str(out)]) == 0


def same_path(results: Path) -> Path:
    return results


def same_path_spelt_otherwise(results: Path) -> Path:
    return results.parent / "." / results.name


def link_to_results(results: Path) -> Path:
    link = results.with_name("link.json")
    link.symlink_to(results)
    return link


def hard_link_to_results(results: Path) -> Path:
    link = results.with_name("other-name.json")
    link.hardlink_to(results)
    return link


def in_a_linked_folder(results: Path) -> Path:
    folder = results.parent / "linked"
    folder.symlink_to(results.parent)
    return folder / results.name


@pytest.mark.parametrize(
    "out_of",
    [
        same_path,
        same_path_spelt_otherwise,
        link_to_results,
        hard_link_to_results,
        in_a_linked_folder,
    ],
    ids=["same path", "spelt otherwise", "symlink", "hard link", "linked folder"],
)
def test_the_report_never_replaces_the_results_it_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out_of: Callable[[Path], Path]
) -> None:
    """``report results.json --out results.json`` replaced the only record of a GPU run with
    its Markdown, and exited 0."""
    path = tmp_path / "results.json"
    text = json.dumps(a_document())
    path.write_text(text)
    out = out_of(path)
    assert cli.main(["report", str(path), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"pytest-cudagraph report: --out {out}: is the results file it renders ({path}), and "
        "the report never replaces its results: give another path, such as report.md\n"
    )
    assert path.read_text() == text


NOT_OURS = "holds a file that is not a report of pytest-cudagraph"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("# my notes\n", NOT_OURS),
        ("", NOT_OURS),
        (report_markdown.MARK, NOT_OURS),  # the mark, but not as a line of its own
        (report_markdown.MARK + " and more\n", NOT_OURS),
        (f"\n{report_markdown.MARK}\n", NOT_OURS),  # the mark, but not first
        (None, "is not a regular file: give the path of a new file"),
        ("folder", "is a folder: give a file path, such as"),
    ],
    ids=["notes", "empty", "mark alone", "mark and more", "mark second", "fifo", "folder"],
)
def test_the_report_replaces_nothing_but_an_earlier_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, problem: str
) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(a_document()))
    out = tmp_path / "report.md"
    if content is None:
        os.mkfifo(out)  # reading it would wait for a writer for ever
    elif content == "folder":
        out.mkdir()
    else:
        out.write_text(content)
    assert cli.main(["report", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pytest-cudagraph report: --out {out}: {problem}")
    assert err.count("\n") == 1
    if content not in (None, "folder"):
        assert out.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.json"]


def test_an_earlier_report_is_replaced_through_a_link(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    document = a_document()
    path.write_text(json.dumps(document))
    earlier = tmp_path / "earlier.md"
    earlier.write_text(report_markdown.render(document | {"date": "then"}))
    link = tmp_path / "report.md"
    link.symlink_to(earlier)
    assert cli.main(["report", str(path), "--out", str(link)]) == 0
    assert link.is_symlink()
    assert earlier.read_text() == report_markdown.render(document)
    assert earlier.read_text().startswith(report_markdown.MARK + "\n# cudagraph results\n")


def test_the_docs_quote_the_first_line_of_a_report() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "plugin.md"
    assert f"\n    {report_markdown.MARK}\n" in docs.read_text()


def test_version_names_the_plugin_and_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"pytest-cudagraph {pytest_cudagraph.__version__}\n"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_cudagraph.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (
        0,
        f"pytest-cudagraph {pytest_cudagraph.__version__}\n",
    )


def test_targets_lists_the_installed_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["targets"]) == 0
    installed = _loading.installed_targets()
    expected = "".join(f"{name}  {value}\n" for name, value in installed.items())
    assert capsys.readouterr().out == (
        expected
        or f"no conformance targets installed (entry-point group {_loading.ENTRY_POINT_GROUP})\n"
    )


def test_checks_prints_the_table_of_the_checks_declarations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["checks"]) == 0
    out = capsys.readouterr().out
    assert out == "\n".join(needs_table(declared_checks())) + "\n"
    assert out.splitlines()[0] == "| check | judges on | needs | sharper with | witnessed |"
    assert len(out.splitlines()) == 2 + len(declared_checks())
    assert (
        "| bounded memory | a GPU | `cache.reset`, `cache.capacity`, `cache.largest_key` | - | no |"
        in out
    )
    installed = subprocess.run(
        ["pytest-cudagraph", "checks"], capture_output=True, text=True, check=False
    )
    assert (installed.returncode, installed.stdout, installed.stderr) == (0, out, "")


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
