"""``-p pytest_cudagraph`` loads the whole plugin, the conformance wing's plugin included, where
plugins are not loaded from their entry points (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1)."""

from __future__ import annotations

import importlib.metadata

import pytest

from pytest_cudagraph import plugin

pytestmark = pytest.mark.skipif(
    not any(
        entry.name == "pytest_cudagraph"
        for entry in importlib.metadata.entry_points(group="pytest11")
    ),
    reason="-p pytest_cudagraph names the installed entry point: install the package",
)


def test_the_wings_plugin_is_named_as_its_entry_point_and_module() -> None:
    [entry] = [
        entry
        for entry in importlib.metadata.entry_points(group="pytest11")
        if entry.name == plugin.CONFORMANCE_ENTRY_POINT
    ]
    assert entry.value == plugin.CONFORMANCE_PLUGIN


@pytest.mark.slow  # runs pytest in a subprocess, twice
def test_the_conformance_suite_runs_without_autoload(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to accept --cudagraph-target, then fail: fixture 'conformance_target' not found."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    arguments = ["--pyargs", "pytest_cudagraph.conformance", "--cudagraph-target", "reasyn"]
    result = pytester.runpytest_subprocess("-p", "pytest_cudagraph", *arguments, "-k", "guards")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["conformance of reasyn (1 passed):", "  guards * passed *"])
    # Kept out by name, as an entry point is.
    blocked = ["-p", "no:pytest_cudagraph_conformance"]
    result = pytester.runpytest_subprocess("-p", "pytest_cudagraph", *blocked, *arguments)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*fixture 'conformance_target' not found*"])
