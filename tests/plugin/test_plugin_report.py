"""The report header and the "cudagraph" terminal summary."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph import report
from pytest_cudagraph.devices import DeviceBinding, GpuInfo, NvmlStatus, StrayCheck
from pytest_cudagraph.stack import RunningStack

GiB = 1024**3


def test_header_on_a_machine_without_cuda_or_nvml() -> None:
    environment = report.Environment(
        torch_version="2.13.0+cpu",
        running=RunningStack("3.11.7", "2.13.0", None),
        nvml=NvmlStatus(False, "NVML Shared Library Not Found"),
        gpus=[],
        stack_mismatches=["python 3.11.7 not ~=3.10.0", "cuda none not ~=11.8"],
        binding=DeviceBinding(torch.device("cuda", 0), "default"),
    )
    assert report.header_lines(environment) == [
        "cudagraph: python 3.11.7, torch 2.13.0+cpu, torch CUDA none, driver n/a",
        "cudagraph: GPUs: none (torch.cuda.is_available() is False)",
        "cudagraph: NVML: unavailable (NVML Shared Library Not Found); pinned stack: no "
        "(python 3.11.7 not ~=3.10.0; cuda none not ~=11.8)",
        "cudagraph: device cuda:0 (default)",
    ]


def test_header_on_a_gpu_machine() -> None:
    environment = report.Environment(
        torch_version="2.7.1+cu118",
        running=RunningStack("3.10.14", "2.7.1", "11.8"),
        nvml=NvmlStatus(True, "570.86.15"),
        gpus=[
            GpuInfo("cuda:0", "NVIDIA H200", 140 * GiB),
            GpuInfo("cuda:1", "NVIDIA H200", 140 * GiB),
        ],
        stack_mismatches=[],
        binding=DeviceBinding(
            torch.device("cuda", 0), "xdist worker gw1: CUDA_VISIBLE_DEVICES=1 (of 0,1)"
        ),
    )
    assert report.header_lines(environment) == [
        "cudagraph: python 3.10.14, torch 2.7.1+cu118, torch CUDA 11.8, driver 570.86.15",
        "cudagraph: GPUs: cuda:0 NVIDIA H200 (140.0 GiB), cuda:1 NVIDIA H200 (140.0 GiB)",
        "cudagraph: NVML: ok; pinned stack: yes",
        "cudagraph: device cuda:0 (xdist worker gw1: CUDA_VISIBLE_DEVICES=1 (of 0,1))",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the header where CUDA is absent")
def test_real_header_without_cuda(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess()
    result.stdout.fnmatch_lines(
        [
            f"cudagraph: python *, torch {torch.__version__}, "
            f"torch CUDA {torch.version.cuda or 'none'}, driver *",
            "cudagraph: GPUs: none (torch.cuda.is_available() is False)",
            "cudagraph: NVML: *; pinned stack: *",
        ]
    )
    assert not torch.cuda.is_initialized()


def test_summary_lines_from_records() -> None:
    records = [
        report.SummaryRecord("parity", "t.py::a", {"form": "cases", "checked": 8, "passed": 8}),
        report.SummaryRecord("parity", "t.py::a", {"form": "cases", "checked": 4, "passed": 3}),
        report.SummaryRecord("parity", "t.py::b", {"form": "toggle", "checked": 1, "passed": 1}),
        report.SummaryRecord(
            "memory",
            "t.py::c",
            {
                "device": "cuda:0",
                "growth_mib": 1.5,
                "peak_growth_mib": 40.0,
                "torch_reserved_growth_mib": 0.0,
                "outside_torch_growth_mib": 1.5,
                "bound_mib": 64,
                "passed": True,
            },
        ),
        report.SummaryRecord("skip", "t.py::d", "needs CUDA"),
        report.SummaryRecord("skip", "t.py::e", "pinned stack not running: x"),
        report.SummaryRecord("skip", "t.py::f", "needs CUDA"),
    ]
    assert report.summary_lines(records, [], [], "report") == [
        "parity: 12 of 13 checked cases match",
        "  t.py::a: 11 of 12 cases match",
        "  t.py::b: 1 of 1 toggled run pairs match",
        "memory growth across the test body (NVML, this process):",
        "  t.py::c on cuda:0: +1.5 MiB of 64 MiB bound ok; peak +40.0 MiB; torch reserved "
        "+0.0 MiB, outside torch +1.5 MiB",
        "skips by reason:",
        "  2 x needs CUDA",
        "  1 x pinned stack not running: x",
    ]


def test_summary_is_empty_without_records_or_checks() -> None:
    assert report.summary_lines([], [], [], "report") == []


def test_stray_lines() -> None:
    clean = StrayCheck("pid 1", "")
    stray = StrayCheck("gw1 pid 2", "", ("NVIDIA H200 GPU-bbbb: 500 MiB",))
    hidden = StrayCheck("gw0 pid 3", "NVML lists this process on no GPU, so strays cannot be seen")
    assert report.stray_lines([clean], "report") == [
        "stray CUDA contexts: none (1 process(es) checked)"
    ]
    assert report.stray_lines([clean, stray, hidden], "fail") == [
        "stray CUDA contexts (on a GPU other than the process's own; fail the run):",
        "  gw1 pid 2: NVIDIA H200 GPU-bbbb: 500 MiB",
        "  gw0 pid 3: NVML lists this process on no GPU, so strays cannot be seen",
    ]


STRAY_CONFTEST = """
import pytest
from pytest_cudagraph import plugin
from pytest_cudagraph.devices import StrayCheck

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


def test_other_modules_add_summary_lines_from_their_own_records(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from pytest_cudagraph import report

        def conformance_lines(records):
            rows = [r for r in records if r.kind == "conformance"]
            return [f"conformance: {r.nodeid} {r.value}" for r in rows]

        def pytest_configure(config):
            report.add_summary_renderer(config, conformance_lines)

        @pytest.fixture
        def conformance(request):
            return lambda value: report.record_for_summary(request.node, "conformance", value)
        """
    )
    pytester.makepyfile(
        """
        def test_check(conformance):
            conformance({"check": "stale-memory", "ok": True})
        """
    )
    result = pytester.runpytest_inprocess()
    result.stdout.fnmatch_lines(
        [
            "*= cudagraph =*",
            "conformance: test_*.py::test_check {'check': 'stale-memory', 'ok': True}",
        ]
    )


def test_no_summary_section_when_nothing_to_say(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("def test_a(): pass")
    # A fresh process that sees no GPU: where CUDA has started (the header starts it on a GPU
    # host), the stray-context check always has a line to say, even if only "none".
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = pytester.runpytest_subprocess()
    assert "= cudagraph =" not in result.stdout.str()
