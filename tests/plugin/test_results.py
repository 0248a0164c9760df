"""The report header, the sections the plugins declare, and the results document: how the session
ended, the commit, writing it (strict JSON, atomically, over nothing but an earlier results
file) and reading it back."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from results_schema import assert_valid_results

from pytest_cudagraph import results, sections
from pytest_cudagraph.engines.devices import DeviceBinding, GpuInfo
from pytest_cudagraph.engines.units import GiB

# What the header says of this torch: PyPI's torch 2.7 (the pinned env) is a CUDA build.
BUILD = f"with CUDA {torch.version.cuda}" if torch.version.cuda else "(CPU build, no CUDA)"


CPU_BOX = results.StackFacts(
    python="3.11.7",
    torch="2.13.0+cpu",
    torch_cuda=None,
    driver=None,
    nvml="unavailable (NVML Shared Library Not Found)",
)


def test_header_on_a_machine_without_cuda_names_no_device() -> None:
    assert results.header_lines(CPU_BOX, DeviceBinding(0, "default")) == [
        "cudagraph: python 3.11.7, torch 2.13.0+cpu (CPU build, no CUDA), NVIDIA driver none",
        "cudagraph: no GPU visible to torch, so tests that need CUDA skip",
    ]


def test_header_on_a_gpu_machine() -> None:
    facts = results.StackFacts(
        python="3.10.14",
        torch="2.7.1+cu118",
        torch_cuda="11.8",
        driver="570.86.15",
        nvml="ok",
        gpus=[
            GpuInfo("cuda:0", "NVIDIA H200", 140 * GiB),
            GpuInfo("cuda:1", "NVIDIA H200", 140 * GiB),
        ],
    )
    binding = DeviceBinding(0, "xdist worker gw1: CUDA_VISIBLE_DEVICES=1 (of 0,1)")
    assert results.header_lines(facts, binding) == [
        "cudagraph: python 3.10.14, torch 2.7.1+cu118 with CUDA 11.8, NVIDIA driver 570.86.15",
        "cudagraph: GPUs cuda:0 NVIDIA H200 (140.0 GiB), cuda:1 NVIDIA H200 (140.0 GiB); NVML ok",
        "cudagraph: tests use cuda:0 (xdist worker gw1: CUDA_VISIBLE_DEVICES=1 (of 0,1))",
    ]


def test_an_unrelated_run_prints_no_cudagraph_lines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_unrelated="import pytest\n\ndef test_a(): pass\n\ndef test_b(): pytest.skip('no')"
    )
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    # The plugins line and the directory name aside, no line mentions the plugin.
    lines = [line for line in result.stdout.lines if not line.startswith(("plugins:", "rootdir:"))]
    assert not [line for line in lines if "cudagraph" in line]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the header where CUDA is absent")
@pytest.mark.parametrize(
    "test_file",
    [
        "def test_a(cuda_device): pass",
        "import pytest\n\n@pytest.mark.no_host_sync\ndef test_a(): pass",
    ],
)
def test_a_run_that_uses_the_plugin_gets_the_header(
    pytester: pytest.Pytester, test_file: str
) -> None:
    pytester.makepyfile(test_file)
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines(
        [
            "collected 1 item",
            f"cudagraph: python *, torch {torch.__version__} {BUILD}, NVIDIA driver *",
            "cudagraph: no GPU visible to torch, so tests that need CUDA skip",
        ]
    )
    assert "pinned_stack" not in result.stdout.str()
    assert "cuda:0" not in result.stdout.str()


@pytest.mark.slow
def test_a_given_setting_prints_the_header_before_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_subprocess("--cudagraph-seed=3")
    result.stdout.fnmatch_lines(["cudagraph: python *", "collected 1 item"])


def test_the_pinned_stack_line_appears_only_with_pinned_tests(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = python<3")
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.pinned_stack\ndef test_a(): pass\n\n"
        "@pytest.mark.pinned_stack\ndef test_b(): pass"
    )
    result = pytester.runpytest_inprocess()
    result.stdout.fnmatch_lines(
        [
            "cudagraph: 2 pinned_stack test(s) are meant for python<3; this is not it "
            "(python * not <3), so they skip"
        ]
    )
    result = pytester.runpytest_inprocess("--cudagraph-stack=any")
    result.stdout.fnmatch_lines(["cudagraph: 2 pinned_stack test(s) * they run anyway *"])


@pytest.mark.parametrize(
    ("status", "stopped", "exit", "complete"),
    [
        (pytest.ExitCode.OK, None, "OK", True),
        (pytest.ExitCode.TESTS_FAILED, None, "TESTS_FAILED", True),
        (pytest.ExitCode.NO_TESTS_COLLECTED, None, "NO_TESTS_COLLECTED", True),
        (pytest.ExitCode.TESTS_FAILED, "stopping after 1 failures", "TESTS_FAILED", False),
        (pytest.ExitCode.INTERRUPTED, "KeyboardInterrupt", "INTERRUPTED", False),
        (pytest.ExitCode.INTERNAL_ERROR, None, "INTERNAL_ERROR", False),
        (17, None, "17", False),
    ],
)
def test_how_a_session_ended(status: int, stopped: str | None, exit: str, complete: bool) -> None:
    assert results.session_end(status, stopped) == results.SessionEnd(
        int(status), exit, complete, stopped
    )


def test_the_json_is_strict_whatever_the_values(tmp_path: Path) -> None:
    document = {"a": [float("nan"), float("inf"), -float("inf"), 1.5, (1, 2)], "b": {3: object}}
    path = tmp_path / "deep" / "r.json"
    results.write_json(path, document)

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "a": ["nan", "inf", "-inf", 1.5, [1, 2]],
        "b": {"3": str(object)},
    }
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[1]", "a results document is a JSON object"),
        ('{"format": 1}', "results of format 1; this plugin reads format 2"),
    ],
)
def test_a_file_that_is_not_our_results_is_refused_naming_it(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {message}"):
        results.read_document(path)


def git(folder: Path, *arguments: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    command = ["git", *identity, "-C", str(folder), *arguments]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make a repository")
def test_the_commit_is_the_folders_head_and_dirty_means_tracked_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert results.commit_of(tmp_path) is None  # no repository
    git(tmp_path, "init", "-q")
    assert results.commit_of(tmp_path) is None  # a repository with no commit yet
    (tmp_path / "tracked.txt").write_text("one\n")
    git(tmp_path, "add", "tracked.txt")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("new\n")
    assert results.commit_of(tmp_path) == {"sha": head, "dirty": False}
    (tmp_path / "tracked.txt").write_text("two\n")
    assert results.commit_of(tmp_path) == {"sha": head, "dirty": True}
    # The folder's own repository, whatever repository the environment points git at.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    assert results.commit_of(tmp_path) == {"sha": head, "dirty": True}
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert results.commit_of(tmp_path) is None


STRAY_CONFTEST = """
import pytest
from pytest_cudagraph import plugin
from pytest_cudagraph.engines.devices import StrayCheck

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    stray = StrayCheck("gw1 pid 7", "", ("Fake GPU GPU-bbbb: 500 MiB",))
    session.config.stash[plugin.STRAY_CHECKS].append(stray)
"""


@pytest.mark.parametrize(
    ("args", "exit_code", "consequence"),
    [
        ([], pytest.ExitCode.OK, "reported only"),
        (["--cudagraph-stray-contexts=fail"], pytest.ExitCode.TESTS_FAILED, "fail the run"),
    ],
)
def test_stray_contexts_are_reported_and_can_fail_the_run(
    pytester: pytest.Pytester, args: list[str], exit_code: pytest.ExitCode, consequence: str
) -> None:
    pytester.makeconftest(STRAY_CONFTEST)
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == exit_code
    result.stdout.fnmatch_lines(
        [
            "*= cudagraph =*",
            f"stray CUDA contexts (on a GPU other than the process's own; {consequence}):",
            "  gw1 pid 7: Fake GPU GPU-bbbb: 500 MiB",
            "*1 passed*",
        ]
    )


def test_bad_stray_mode_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_stray_contexts = crash")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini cudagraph_stray_contexts='crash': choose one of report, fail"]
    )


DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugin.md"


def documented_section_example() -> str:
    """The conftest docs/plugin.md gives for adding a section ("Extending the plugin")."""
    text = DOCS.read_text()
    start = text.index("- A new section of the results")
    block = text[text.index("```python", start) + len("```python") : text.index("```\n", start + 1)]
    return textwrap.dedent(block)


def test_other_modules_add_a_section_as_the_docs_say(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(documented_section_example())
    pytester.makepyfile(
        """
        def test_check(stale_reads):
            stale_reads(3)
        """
    )
    result = pytester.runpytest_inprocess("--cudagraph-json=results.json")
    result.stdout.fnmatch_lines(["*= cudagraph =*", "stale reads: test_*.py::test_check: 3"])
    document = json.loads((pytester.path / "results.json").read_text())
    assert document["stale_reads"] == [
        {"nodeid": "test_other_modules_add_a_section_as_the_docs_say.py::test_check", "count": 3}
    ]
    assert_valid_results(document)


DECLARING = """
import pytest
from pytest_cudagraph import results

def pytest_cudagraph_results_sections(config):
    return {returned}
"""


def test_declared_sections_follow_the_markers_in_their_plugins_order(
    pytester: pytest.Pytester,
) -> None:
    returned = '[results.Section("zebra", lambda r: 1), results.Section("aardvark", lambda r: 2)]'
    pytester.makeconftest(DECLARING.format(returned=returned))
    pytester.makepyfile("def test_a(): pass")
    pytester.runpytest_inprocess("--cudagraph-json=results.json").assert_outcomes(passed=1)
    document = json.loads((pytester.path / "results.json").read_text())
    # The suite's table comes where its plugin was registered; the rest is fixed.
    names = [name for name in document if name not in results.DOCUMENT_KEYS | {"conformance"}]
    assert names == [
        "tests",
        "parity",
        "memory",
        "pinned_stack",
        "zebra",
        "aardvark",
        "skips",
        "stray_contexts",
    ]
    assert (document["zebra"], document["aardvark"]) == (1, 2)


KEPT = ", ".join(sorted(results.KEPT_NAMES))


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (
            'results.Section("mine", lambda r: 1)',
            "pytest_cudagraph_results_sections returned pytest_cudagraph.sections.Section: it "
            "returns a list of pytest_cudagraph.sections.Section ([] for none)",
        ),
        (
            '[{"name": "mine"}]',
            "pytest_cudagraph_results_sections returned a dict in its list: each item is a "
            "pytest_cudagraph.sections.Section",
        ),
        *(
            (
                f'[results.Section("{name}", lambda r: 1)]',
                f"pytest_cudagraph_results_sections: '{name}' is a name the results document "
                f"keeps for itself ({KEPT}): name the section otherwise",
            )
            for name in ("tests", "skips", "stray_contexts", "format", "session")
        ),
        (
            '[results.Section("parity", lambda r: 1)]',
            "pytest_cudagraph_results_sections: two sections are named 'parity': each "
            "section's name is its key in the results, so give each its own",
        ),
    ],
    ids=["no list", "no section", "tests", "skips", "strays", "format", "session", "taken"],
)
def test_a_declared_section_is_refused_before_any_test_runs(
    pytester: pytest.Pytester, returned: str, message: str
) -> None:
    pytester.makeconftest(DECLARING.format(returned=returned))
    pytester.makepyfile("def test_a(): raise AssertionError('ran')")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "ran" not in result.stdout.str()


def test_the_hook_is_optional_where_the_plugin_is_off(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(optionalhook=True)
        def pytest_cudagraph_results_sections(config):
            return []
        """
    )
    pytester.makepyfile("def test_a(): pass")
    pytester.runpytest_inprocess("-p", "no:pytest_cudagraph").assert_outcomes(passed=1)


def test_no_summary_section_when_nothing_to_say(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("def test_a(): pass")
    # A fresh process that sees no GPU: where CUDA has started (the header starts it on a GPU
    # host), the stray-context check always has a line to say, even if only "none".
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = pytester.runpytest_subprocess()
    assert "= cudagraph =" not in result.stdout.str()


def test_a_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(source: object, destination: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        results.write_json(tmp_path / "r.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


def earlier_results(path: Path) -> Path:
    results.write_json(path, results.results_document([sections.TESTS], [], None))
    return path


def user_file(path: Path) -> Path:
    path.write_text('{"format": 2, "mine": true}')  # JSON, even of our format, but not ours
    return path


def empty_file(path: Path) -> Path:
    path.touch()
    return path


def folder(path: Path) -> Path:
    path.mkdir()
    return path


def link_to_results(path: Path) -> Path:
    path.symlink_to(earlier_results(path.with_name("target.json")))
    return path


def link_to_stdout(path: Path) -> Path:
    path.symlink_to("/proc/self/fd/1")
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def folder_state(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Each entry's mode and, for a regular file, its content (links and FIFOs not opened)."""
    modes = {path: path.lstat().st_mode for path in folder.iterdir()}
    return {
        path.name: (mode, path.read_bytes() if stat.S_ISREG(mode) else None)
        for path, mode in modes.items()
    }


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (user_file, "holds a file that is not results of this plugin"),
        (empty_file, "holds a file that is not results of this plugin"),
        (folder, "is a folder; give a file path such as"),
        (link_to_results, "is a symlink, never written through nor replaced"),
        (link_to_stdout, "is a symlink, never written through nor replaced"),
        (fifo, "is a FIFO (only the results file of an earlier run is ever replaced)"),
    ],
    ids=["user file", "empty file", "folder", "link to results", "link to stdout", "fifo"],
)
def test_only_an_earlier_results_file_is_ever_replaced(
    tmp_path: Path, make: Callable[[Path], Path], problem: str
) -> None:
    path = make(tmp_path / "r.json")
    before = folder_state(tmp_path)
    for attempt in (
        results.check_replaceable,
        results.remove_earlier_results,
        lambda path: results.write_json(path, {"format": 2}),
    ):
        with pytest.raises(ValueError, match=re.escape(problem)):
            attempt(path)
    assert folder_state(tmp_path) == before  # nothing written or removed, no temporary file


def test_an_earlier_results_file_is_replaced_and_the_new_one_readable_by_others(
    tmp_path: Path,
) -> None:
    path = earlier_results(tmp_path / "r.json")
    results.check_replaceable(path)
    results.check_replaceable(tmp_path / "free" / "r.json")
    previous = os.umask(0o022)
    try:
        results.write_json(path, results.results_document([], [], None))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0o600: CI reads it
    results.remove_earlier_results(path)
    assert not path.exists()
    results.remove_earlier_results(path)  # nothing there is fine too


def test_a_long_results_name_leaves_room_for_the_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / ("r" * 250 + ".json")
    results.write_json(path, {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
