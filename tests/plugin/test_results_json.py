"""--cudagraph-json: the session's results as a file, also under xdist (the controller writes),
checked against the shipped schema; how the session ended; the file of an earlier run removed
before anything runs; a bad path refused before the run."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from results_schema import assert_valid_results

import pytest_cudagraph
from pytest_cudagraph import results, settings

# Each test runs pytest in a subprocess (the README's test command leaves it out).
pytestmark = pytest.mark.slow

RESULTS_TESTS = """
import pytest
import torch


def test_parity(graph_parity):
    graph_parity.check(torch.sin, torch.sin, lambda generator, case: torch.randn(3), cases=4)
    graph_parity.check(torch.cos, torch.cos, lambda generator, case: torch.randn(3), cases=2)


@pytest.mark.fake_memory(growth_mib=2)
@pytest.mark.graph_memory_bound("16MiB")
def test_memory():
    pass


@pytest.mark.pinned_stack(python="<3")
def test_pinned():
    pass


@pytest.mark.pinned_stack(python="<3")
def test_pinned_too():
    pass


def test_plain_skip():
    pytest.skip("not today")


def test_plain(record_property):
    record_property("speed", 1.5)


def test_failing():
    assert 1 == 2, "one is not two"
"""


def read_results(pytester: pytest.Pytester, name: str = "results.json") -> dict:
    """The file as ``pytest-cudagraph report`` reads it (its own check against the schema)."""
    document = results.read_document(pytester.path / name)
    results.check_document(document, pytester.path / name)
    return document


def dicts_in(value: object) -> Iterator[dict]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from dicts_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from dicts_in(item)


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_results_hold_each_section_once(cpu_pytester: pytest.Pytester, xdist: list[str]) -> None:
    cpu_pytester.makepyfile(RESULTS_TESTS)
    result = cpu_pytester.runpytest_subprocess("--cudagraph-json=results.json", *xdist)
    result.assert_outcomes(passed=3, failed=1, skipped=3)
    result.stdout.fnmatch_lines(["cudagraph results written to results.json"])
    document = read_results(cpu_pytester)
    assert_valid_results(document)
    assert document["format"] == 2
    assert document["plugin_version"] == pytest_cudagraph.__version__
    date = datetime.datetime.fromisoformat(document["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert document["session"] == {
        "exit_status": 1,
        "exit": "TESTS_FAILED",
        "complete": True,
        "stopped": None,
    }
    # Parity: one entry per test and form, its checks summed, and nowhere else in the file.
    [parity] = document["parity"]
    assert parity["nodeid"].endswith("::test_parity")
    assert parity == {
        "nodeid": parity["nodeid"],
        "form": "cases",
        "checked": 6,
        "passed": 6,
        "failures": [],
    }
    assert sum("form" in entry for entry in dicts_in(document)) == 1
    [memory] = document["memory"]
    assert memory["bound_mib"] == 16
    assert memory["growth_mib"] == pytest.approx(2.0)
    assert memory["passed"] is True
    # Skips of the tests that use the plugin, counted one by one; the user's own skip is not.
    reason = document["skips"]["by_reason"][0]["reason"]
    assert reason.startswith("pinned stack not running: python")
    assert document["skips"] == {"total": 2, "by_reason": [{"reason": reason, "count": 2}]}
    # Every test's outcome, with its reason and the user's own properties.
    tests = {entry["nodeid"].split("::")[1]: entry for entry in document["tests"]}
    assert {name: entry["outcome"] for name, entry in tests.items()} == {
        "test_parity": "passed",
        "test_memory": "passed",
        "test_pinned": "skipped",
        "test_pinned_too": "skipped",
        "test_plain_skip": "skipped",
        "test_plain": "passed",
        "test_failing": "failed",
    }
    # The whole message: pytest's explanation of the assertion follows the test's own words.
    assert tests["test_failing"]["reason"] == "AssertionError: one is not two\nassert 1 == 2"
    assert tests["test_failing"]["when"] == "call"
    assert tests["test_plain_skip"]["reason"] == "not today"
    assert tests["test_plain"]["properties"] == [["speed", 1.5]]
    assert all(entry["duration"] >= 0 for entry in document["tests"])
    assert not any(entry["properties"] for name, entry in tests.items() if name != "test_plain")
    assert document["stack"]["torch"].startswith("2.")
    assert set(document["stack"]) >= {"python", "torch", "torch_cuda", "driver", "gpus"}
    assert document["pinned_stack"]["pinned"] == {}  # the plugin pins nothing by default
    assert document["pinned_stack"]["stack_mode"] == "pinned"
    assert document["conformance"] is None


def test_path_from_ini_or_env(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_pytester.makepyfile("def test_a(graph_parity): pass")
    cpu_pytester.makeini("[pytest]\ncudagraph_json = from_ini.json")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)
    assert read_results(cpu_pytester, "from_ini.json")["parity"] == []
    monkeypatch.setenv("PYTEST_CUDAGRAPH_JSON", "out/from_env.json")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)
    assert read_results(cpu_pytester, "out/from_env.json")["skips"]["total"] == 0


def test_conformance_rows_are_in_the_results(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs",
        "pytest_cudagraph.conformance",
        "-k",
        "contract or guards",
        "--cudagraph-target",
        "reasyn",
        "--cudagraph-json=results.json",
    )
    result.assert_outcomes(passed=2)
    document = read_results(pytester)
    assert_valid_results(document)
    table = document["conformance"]
    assert table["target"] == "reasyn"
    assert [(row["check"], row["verdict"]) for row in table["rows"]] == [
        ("target contract", "passed"),
        ("guards", "passed"),
    ]
    assert all(row["figure"] for row in table["rows"])
    # The figures live in the table only: no test lists one among its own properties.
    assert not any(entry["properties"] for entry in document["tests"])


def test_the_file_of_an_earlier_run_is_gone_before_any_test_runs(
    cpu_pytester: pytest.Pytester,
) -> None:
    """A run that dies part-way must leave no results behind, not the last run's."""
    stale = results.results_document([], [], None) | {"stale": True}
    results.write_json(cpu_pytester.path / "results.json", stale)
    cpu_pytester.makepyfile(
        """
        from pathlib import Path

        def test_first():
            assert not Path("results.json").exists()
        """
    )
    cpu_pytester.runpytest_inprocess("--cudagraph-json=results.json").assert_outcomes(passed=1)
    assert "stale" not in read_results(cpu_pytester)


def test_what_is_not_our_results_is_never_replaced(cpu_pytester: pytest.Pytester) -> None:
    """``pytest --cudagraph-json tests/test_b.py tests/test_a.py`` took the test file for the
    option's value and wrote the results over it; a link and a FIFO went the same way."""
    tests = cpu_pytester.mkdir("tests")
    (tests / "test_a.py").write_text("def test_a(): pass\n")
    (tests / "test_b.py").write_text("def test_b(): pass\n")
    (cpu_pytester.path / "notes.txt").write_text("mine")
    (cpu_pytester.path / "link.json").symlink_to("notes.txt")
    os.mkfifo(cpu_pytester.path / "fifo.json")
    for arguments, given, problem in (
        (["--cudagraph-json", "tests/test_b.py", "tests/test_a.py"], "tests/test_b.py", "holds"),
        (["--cudagraph-json=link.json"], "link.json", "is a symlink, never written through"),
        (["--cudagraph-json=fifo.json"], "fifo.json", "is a FIFO (only the results file of"),
    ):
        result = cpu_pytester.runpytest_inprocess(*arguments)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: --cudagraph-json={given!r}: {problem} *"])
        assert "collected" not in result.stdout.str()
    assert (tests / "test_b.py").read_text() == "def test_b(): pass\n"
    assert (cpu_pytester.path / "notes.txt").read_text() == "mine"
    assert (cpu_pytester.path / "link.json").is_symlink()
    assert stat.S_ISFIFO((cpu_pytester.path / "fifo.json").lstat().st_mode)


def test_a_file_of_the_users_made_during_the_run_is_kept_and_the_run_ends_as_it_would(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        from pathlib import Path

        def test_a():
            Path("results.json").write_text("the user's own")
        """
    )
    result = cpu_pytester.runpytest_inprocess("--cudagraph-json=results.json")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["cudagraph results NOT written to results.json: holds a file that is not results *"]
    )
    assert (cpu_pytester.path / "results.json").read_text() == "the user's own"


@pytest.mark.parametrize(
    ("arguments", "test_file", "stopped", "last"),
    [
        (
            ["-x"],
            "def test_a(): assert 0\n\ndef test_b(): pass\n",
            "stopping after 1 failures",
            "failed",
        ),
        (["-x", "-n", "2"], "def test_a(): assert 0\n", None, "failed"),
        ([], "def test_a():\n    raise KeyboardInterrupt\n", "KeyboardInterrupt", "unfinished"),
    ],
    ids=["exitfirst", "exitfirst-xdist", "ctrl-c"],
)
def test_a_run_that_stopped_early_says_its_results_are_partial(
    cpu_pytester: pytest.Pytester,
    arguments: list[str],
    test_file: str,
    stopped: str | None,
    last: str,
) -> None:
    # With one test under xdist, -x stops nothing early: a second one is left for the stop.
    if "-n" in arguments:
        test_file += "\nimport time\n\ndef test_slow():\n    time.sleep(1)\n"
    cpu_pytester.makepyfile(test_file)
    result = cpu_pytester.runpytest_subprocess("--cudagraph-json=results.json", *arguments)
    document = read_results(cpu_pytester)
    assert_valid_results(document)
    session = document["session"]
    assert session["complete"] is False, session
    assert session["stopped"]
    if stopped is not None:
        assert session["stopped"] == stopped
    assert session["exit_status"] == result.ret
    [first] = [entry for entry in document["tests"] if entry["nodeid"].endswith("::test_a")]
    assert first["outcome"] == last
    result.stdout.fnmatch_lines(["cudagraph results written to results.json (partial: *)"])


def a_folder_nobody_may_write() -> Path:
    """A folder this process cannot create a file in, even as root (a read-only sysfs)."""
    for folder in (Path("/sys"), Path("/proc")):
        try:
            handle, probe = tempfile.mkstemp(dir=folder)
        except OSError:
            return folder
        os.close(handle)
        os.unlink(probe)
    pytest.skip("no folder here refuses new files to this process")


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", "must be a file path, got an empty one"),
        ("out", "is a folder; give a file path such as out/results.json"),
        ("notes.txt/results.json", "is under */notes.txt, which is a file, not a folder"),
        ("UNWRITABLE/deeper/results.json", "cannot create a file in UNWRITABLE: *"),
    ],
    ids=["empty", "folder", "under a file", "unwritable"],
)
def test_a_bad_path_is_a_usage_error_before_the_run(
    cpu_pytester: pytest.Pytester, given: str, problem: str
) -> None:
    if "UNWRITABLE" in given:
        folder = str(a_folder_nobody_may_write())
        given, problem = given.replace("UNWRITABLE", folder), problem.replace("UNWRITABLE", folder)
    (cpu_pytester.path / "out").mkdir()
    (cpu_pytester.path / "notes.txt").write_text("mine")
    cpu_pytester.makepyfile("def test_a(): pass")
    result = cpu_pytester.runpytest_subprocess(f"--cudagraph-json={given}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --cudagraph-json={given!r}: {problem}"])
    assert "Traceback" not in result.stderr.str()
    assert "collected" not in result.stdout.str()
    assert (cpu_pytester.path / "notes.txt").read_text() == "mine"


def test_the_environment_variable_is_named_when_it_is_the_bad_source(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cpu_pytester.path / "out").mkdir()
    monkeypatch.setenv("PYTEST_CUDAGRAPH_JSON", "out")
    result = cpu_pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: PYTEST_CUDAGRAPH_JSON='out': is a folder; *"])


def test_a_file_that_cannot_be_written_at_the_end_is_said_not_raised(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        from pathlib import Path

        def test_a():
            Path("out").write_text("a file where the results' folder was to be")
        """
    )
    result = cpu_pytester.runpytest_subprocess("--cudagraph-json=out/results.json")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["cudagraph results NOT written to out/results.json: *"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_users_values_under_our_prefix_crash_nothing(cpu_pytester: pytest.Pytester) -> None:
    """record_property("cudagraph_memory", ...) is the user's: it used to crash the summary,
    and one in the envelope's documented shape was read as the plugin's (a KeyError, or a
    forged "passed" row in the conformance table)."""
    cpu_pytester.makepyfile(
        """
        def test_mine(record_property):
            record_property("cudagraph_memory", 5)
            record_property("cudagraph_parity", {"pytest_cudagraph": {"checked": 1}})
            record_property("cudagraph_check", {"pytest_cudagraph": "guards"})
            record_property("cudagraph_conformance", "a figure")

        def test_plugin(graph_parity):
            pass
        """
    )
    for arguments in ([], ["--cudagraph-json=results.json"], ["-p", "no:xdist", "-k", "mine"]):
        result = cpu_pytester.runpytest_subprocess(*arguments)
        result.assert_outcomes(passed=1 if "-k" in arguments else 2)
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
        assert "memory growth" not in result.stdout.str()
    document = read_results(cpu_pytester)
    assert_valid_results(document)
    assert (document["memory"], document["parity"], document["conformance"]) == ([], [], None)
    [mine] = [entry for entry in document["tests"] if entry["nodeid"].endswith("test_mine")]
    assert [name for name, _ in mine["properties"]] == [
        "cudagraph_memory",
        "cudagraph_parity",
        "cudagraph_check",
        "cudagraph_conformance",
    ]


def test_properties_json_cannot_hold_end_the_run_as_it_would(
    cpu_pytester: pytest.Pytester,
) -> None:
    """They used to end a passing run with a raw traceback, no summary and exit 1."""
    cpu_pytester.makepyfile(
        """
        class SourText:
            def __str__(self):
                raise ValueError("no text")

        def test_a(record_property):
            looped = [1]
            looped.append(looped)
            deep = []
            for _ in range(5000):
                deep = [deep]
            record_property("huge", 10**5000)
            record_property("looped", looped)
            record_property("deep", deep)
            record_property("sour", SourText())
            record_property("keys", {1: "int", "1": "str"})
        """
    )
    result = cpu_pytester.runpytest_inprocess("--cudagraph-json=results.json")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "record_property values JSON cannot hold, kept as descriptions:",
            "  test_*.py::test_a: 'huge'",
            "  test_*.py::test_a: 'looped'",
            "  test_*.py::test_a: 'deep'",
            "  test_*.py::test_a: 'sour'",
            "cudagraph results written to results.json",
            "*= 1 passed*",
        ]
    )
    document = read_results(cpu_pytester)
    assert_valid_results(document)
    [entry] = document["tests"]
    assert dict(entry["properties"])["keys"] == [[1, "int"], ["1", "str"]]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make a repository")
def test_the_commit_is_the_rootdirs(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile("def test_a(): pass")

    def git(*arguments: str) -> str:
        identity = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
        command = ["git", *identity, "-C", str(cpu_pytester.path), *arguments]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "the tests")
    cpu_pytester.runpytest_inprocess("--cudagraph-json=results.json").assert_outcomes(passed=1)
    assert read_results(cpu_pytester)["commit"] == {"sha": git("rev-parse", "HEAD"), "dirty": False}


def test_the_schema_is_a_valid_schema_and_refuses_what_is_not_results() -> None:
    jsonschema = pytest.importorskip(
        "jsonschema", reason="checking against the schema needs jsonschema (the test extra)"
    )
    jsonschema.Draft202012Validator.check_schema(results.schema())
    stack_mode = results.schema()["properties"]["pinned_stack"]["properties"]["stack_mode"]
    assert tuple(stack_mode["enum"]) == settings.STACK.choices
    row = {"check": "guards", "verdict": "passed", "seconds": 0.1, "figure": "4 of 4"}
    row |= {"reason": "", "values": {"refused": 4}}
    data = {
        "tests": [],
        "parity": [{"nodeid": "t.py::a", "form": "cases", "checked": 4, "passed": 4}],
        "memory": [],
        "conformance": {"target": "reasyn", "rows": [row]},
        "skips": {"total": 0, "by_reason": []},
        "stray_contexts": [],
    }
    sections = [results.Section(name, lambda records, d=d: d) for name, d in data.items()]
    end = results.session_end(pytest.ExitCode.OK, None)
    valid = json.loads(json.dumps(results.results_document(sections, [], None, session=end)))
    assert_valid_results(valid)
    broken = {
        "no session": lambda d: d.pop("session"),
        "a format-1 parity entry": lambda d: d["parity"][0].update(value={"checked": 4}),
        "a verdict of no kind": lambda d: d["conformance"]["rows"][0].update(verdict="PASSED"),
        "a figure's value as text": lambda d: d["conformance"]["rows"][0]["values"].update(
            refused="4"
        ),
        "a skip counted zero times": lambda d: d["skips"]["by_reason"].append(
            {"reason": "x", "count": 0}
        ),
        "a date that is not ISO 8601": lambda d: d.update(date="Mon Jun 1 12:00:00 2025"),
    }
    validator = jsonschema.Draft202012Validator(results.schema())
    assert results.schema_problem(valid, results.schema()) == ""  # the plugin's own reading
    for name, breaking in broken.items():
        document = json.loads(json.dumps(valid))
        breaking(document)
        assert not validator.is_valid(document), name
        assert results.schema_problem(document, results.schema()), name
