"""scripts/gpu_report.py builds its report from the plugin's JSON results and JUnit XML."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_report.py"


@pytest.fixture
def gpu_report() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_report"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["gpu_report"]


def test_report_from_a_real_step(cpu_pytester: pytest.Pytester, gpu_report: ModuleType) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest
        import torch

        def test_parity(graph_parity):
            graph_parity.check(torch.cos, torch.cos, lambda g, c: torch.randn(2), cases=3)

        @pytest.mark.fake_memory(growth_mib=1)
        @pytest.mark.graph_memory_bound(8)
        def test_memory():
            pass

        def test_skipped():
            pytest.skip("no GPU here")

        def test_failing():
            assert 1 == 2
        """
    )
    outdir = cpu_pytester.path / "out"
    outdir.mkdir()
    cpu_pytester.runpytest_inprocess(
        f"--junitxml={outdir / 'tests.xml'}", f"--cudagraph-json={outdir / 'tests.json'}"
    ).assert_outcomes(passed=2, failed=1, skipped=1)
    report = gpu_report.render(outdir, "cpu", "abc123")
    # The stack line reports the facts the plugin recorded, and those are this machine's.
    stack = json.loads((outdir / "tests.json").read_text())["stack"]
    assert len(stack["gpus"]) == torch.cuda.device_count()
    gpus = ", ".join(
        f"{gpu['name']} ({round(gpu['total_bytes'] / 2**30)} GiB)" for gpu in stack["gpus"]
    )
    for line in [
        "# GPU run: cpu",
        f"- GPUs: {gpus or 'none'}; driver {stack['driver'] or 'none'}",
        "- tree: commit abc123",
        "## tests",
        "2 passed, 1 failed, 1 skipped",
        "Parity: 3 of 3 checked cases match",
        "- 1 x no GPU here",
    ]:
        assert line in report.splitlines(), line
    assert "assert 1 == 2" in report
    assert "| `test_report_from_a_real_step.py::test_memory` | +1.0 | 8 | " in report


def test_stack_lines_name_each_gpu_and_the_driver(gpu_report: ModuleType) -> None:
    gpu = {"name": "NVIDIA H200", "total_bytes": 150_121_545_728}
    stack = {"gpus": [gpu, gpu], "driver": "580.159.04", "python": "3.12.3"}
    stack |= {"torch": "2.11.0+cu130", "torch_cuda": "13.0"}
    assert gpu_report.stack_lines(stack) == [
        "- GPUs: NVIDIA H200 (140 GiB), NVIDIA H200 (140 GiB); driver 580.159.04",
        "- python 3.12.3, torch 2.11.0+cu130, torch CUDA 13.0",
    ]
    no_gpu = stack | {"gpus": [], "driver": None, "torch_cuda": None}
    assert gpu_report.stack_lines(no_gpu)[0] == "- GPUs: none; driver none"
