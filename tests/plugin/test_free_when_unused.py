"""An installed plugin runs in every session: importing it must not import torch or NVML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pytest_cudagraph


@pytest.mark.parametrize("module", ["pytest_cudagraph", "pytest_cudagraph.plugin"])
def test_importing_the_plugin_imports_neither_torch_nor_nvml(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "loaded = [name for name in ('torch', 'pynvml') if name in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unrelated_session_imports_no_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_unrelated="def test_a(): pass")
    pytester.makeconftest(
        """
        import sys

        def pytest_sessionfinish(session):
            print("torch imported:", "torch" in sys.modules)
        """
    )
    result = pytester.runpytest_subprocess("-s", "-p", "pytest_cudagraph")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*torch imported: False*"])


def test_public_names_are_exported_lazily() -> None:
    from pytest_cudagraph.conformance._protocol import CudaGraphTarget
    from pytest_cudagraph.engines.compare import compare_outputs
    from pytest_cudagraph.engines.faults import FaultInjector
    from pytest_cudagraph.engines.parity import ParityChecker

    assert pytest_cudagraph.ParityChecker is ParityChecker
    assert pytest_cudagraph.compare_outputs is compare_outputs
    assert pytest_cudagraph.FaultInjector is FaultInjector
    assert pytest_cudagraph.CudaGraphTarget is CudaGraphTarget
    for name in pytest_cudagraph.__all__:
        assert getattr(pytest_cudagraph, name) is not None
    assert set(pytest_cudagraph.__all__) <= set(dir(pytest_cudagraph))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'ParityCheckr'"):
        _ = pytest_cudagraph.ParityCheckr


@pytest.mark.slow
def test_the_checkout_runs_without_pytest_benchmark() -> None:
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pytest", "-p", "no:benchmark", "-p", "no:cacheprovider"]
    run = subprocess.run(
        [*command, "--collect-only", "-q", "tests/plugin/test_pinned_stack.py"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
