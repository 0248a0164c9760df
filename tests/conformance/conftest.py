"""Running the conformance suite as a user would: ``pytest --pyargs pytest_cudagraph.conformance``
in a fresh process, from an empty folder, optionally against a target from this folder."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from suite_runner import HERE, REPO_ROOT, plugin_arguments


@pytest.fixture
def run_suite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., pytest.RunResult]:
    """``run_suite(*args)``: the conformance suite in a subprocess, with the source tree and
    this folder (broken_targets) importable and no cudagraph settings from the outer run."""
    for name in list(os.environ):
        if name.startswith("PYTEST_CUDAGRAPH_"):
            monkeypatch.delenv(name)
    paths = [str(REPO_ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in paths if path))

    def run(*args: str, timeout: float = 600) -> pytest.RunResult:
        return pytester.runpytest_subprocess(
            "--pyargs",
            "pytest_cudagraph.conformance",
            "-p",
            "no:cacheprovider",
            *plugin_arguments(),
            *args,
            timeout=timeout,
        )

    return run
