"""The report header and the "cudagraph" terminal summary."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from pytest_cudagraph import results
from pytest_cudagraph.engines.devices import DeviceBinding, GpuInfo, StrayCheck
from pytest_cudagraph.engines.units import GiB
from pytest_cudagraph.markers.cuda_graph_parity import ParityMarker
from pytest_cudagraph.markers.graph_memory_bound import MemoryBoundMarker

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


def test_summary_lines_from_records() -> None:
    records = [
        results.Record(
            "parity", "t.py::a", {"form": "cases", "checked": 8, "passed": 8, "failures": []}
        ),
        results.Record(
            "parity", "t.py::a", {"form": "cases", "checked": 4, "passed": 3, "failures": []}
        ),
        results.Record(
            "parity", "t.py::b", {"form": "toggle", "checked": 1, "passed": 1, "failures": []}
        ),
        results.Record(
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
        results.Record("skip", "t.py::d", "needs CUDA"),
        results.Record("skip", "t.py::e", "pinned stack not running: x"),
        results.Record("skip", "t.py::f", "needs CUDA"),
    ]
    sections = [
        results.Section(
            feature.results_key,
            partial(feature.section_data, None),
            partial(feature.section_lines, None),
        )
        for feature in (ParityMarker, MemoryBoundMarker)
    ]
    lines = results.summary_lines([*sections, results.SKIPS], records)
    assert lines == [
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
    assert results.summary_lines([results.SKIPS], []) == []


def test_stray_lines() -> None:
    clean = StrayCheck("pid 1", "")
    stray = StrayCheck("gw1 pid 2", "", ("NVIDIA H200 GPU-bbbb: 500 MiB",))
    hidden = StrayCheck("gw0 pid 3", "NVML lists this process on no GPU, so strays cannot be seen")
    assert results.stray_lines([clean], "report") == [
        "stray CUDA contexts: none (1 process(es) checked)"
    ]
    assert results.stray_lines([clean, stray, hidden], "fail") == [
        "stray CUDA contexts (on a GPU other than the process's own; fail the run):",
        "  gw1 pid 2: NVIDIA H200 GPU-bbbb: 500 MiB",
        "  gw0 pid 3: NVML lists this process on no GPU, so strays cannot be seen",
    ]


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


def test_other_modules_add_summary_lines_from_their_own_records(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from pytest_cudagraph import results

        def checks(records):
            return [(r.nodeid, r.value) for r in records if r.kind == "my_checks"]

        def check_lines(data):
            return [f"my checks: {nodeid} {value}" for nodeid, value in data]

        def pytest_configure(config):
            results.add_section(config, results.Section("my_checks", checks, check_lines))

        @pytest.fixture
        def my_check(request):
            return lambda value: results.record(request.node, "my_checks", value)
        """
    )
    pytester.makepyfile(
        """
        def test_check(my_check):
            my_check({"check": "stale-memory", "ok": True})
        """
    )
    result = pytester.runpytest_inprocess("--cudagraph-json=results.json")
    result.stdout.fnmatch_lines(
        [
            "*= cudagraph =*",
            "my checks: test_*.py::test_check {'check': 'stale-memory', 'ok': True}",
        ]
    )
    document = json.loads((pytester.path / "results.json").read_text())
    assert document["my_checks"] == [
        [
            "test_other_modules_add_summary_lines_from_their_own_records.py::test_check",
            {"check": "stale-memory", "ok": True},
        ]
    ]


def test_no_summary_section_when_nothing_to_say(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("def test_a(): pass")
    # A fresh process that sees no GPU: where CUDA has started (the header starts it on a GPU
    # host), the stray-context check always has a line to say, even if only "none".
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = pytester.runpytest_subprocess()
    assert "= cudagraph =" not in result.stdout.str()
