"""graph_memory_bound: the judgement on simulated readings, and the marker around it."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.engines.devices import nvml_status
from pytest_cudagraph.engines.memory import MemoryReport, MemorySample, judge_growth
from pytest_cudagraph.engines.units import MiB


def readings(growth_mib: float, reserved_growth_mib: float = 0) -> MemoryReport:
    before = MemorySample(
        process_bytes=600 * MiB, torch_allocated=64 * MiB, torch_reserved=128 * MiB
    )
    after = MemorySample(
        process_bytes=600 * MiB + int(growth_mib * MiB),
        torch_allocated=64 * MiB,
        torch_reserved=128 * MiB + int(reserved_growth_mib * MiB),
    )
    return MemoryReport("cuda:0", before, after, after.process_bytes + 8 * MiB)


def test_growth_within_the_bound_passes() -> None:
    verdict = judge_growth(readings(growth_mib=16), bound_mib=16)
    assert verdict.passed
    assert "grew by 16.0 MiB, within the 16 MiB bound" in verdict.reason


def test_growth_over_the_bound_fails_and_splits_torch_from_the_rest() -> None:
    verdict = judge_growth(readings(growth_mib=300, reserved_growth_mib=256), bound_mib=64)
    assert not verdict.passed
    assert verdict.reason == (
        "graph_memory_bound: this process's memory on cuda:0 grew by 300.0 MiB, over the 64 MiB "
        "bound (torch reserved +256.0 MiB, outside torch +44.0 MiB)"
    )


def test_shrinking_passes() -> None:
    assert judge_growth(readings(growth_mib=-32), bound_mib=1).passed


def test_section_shows_nvml_torch_and_the_part_torch_cannot_see() -> None:
    assert readings(growth_mib=300, reserved_growth_mib=256).section().splitlines() == [
        "device cuda:0, in MiB:",
        "                          before     after    change",
        "NVML, this process         600.0     900.0    +300.0",
        "torch allocated             64.0      64.0      +0.0",
        "torch reserved             128.0     384.0    +256.0",
        "outside torch              472.0     516.0     +44.0",
        "NVML peak                            908.0",
    ]


def test_figures_are_plain_numbers() -> None:
    assert readings(growth_mib=10, reserved_growth_mib=4).figures() == {
        "device": "cuda:0",
        "growth_mib": 10.0,
        "peak_growth_mib": 18.0,
        "torch_reserved_growth_mib": 4.0,
        "outside_torch_growth_mib": 6.0,
    }


def test_marker_passes_and_fails_on_the_probe_readings(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.fake_memory(growth_mib=3)
        @pytest.mark.graph_memory_bound(bound="32MiB")
        def test_small():
            pass

        @pytest.mark.fake_memory(growth_mib=300, reserved_growth_mib=256)
        @pytest.mark.graph_memory_bound(64)
        def test_large():
            pass

        @pytest.mark.fake_memory(growth_mib=300)
        @pytest.mark.graph_memory_bound(64)
        def test_failing_body():
            raise ValueError("the body's own failure comes first")
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_large _*",
            "graph_memory_bound: this process's memory on cuda:0 grew by 300.0 MiB, over the 64 "
            "MiB bound (torch reserved +256.0 MiB, outside torch +44.0 MiB)",
            "*- cudagraph memory -*",
            "bound: 64 MiB of growth; device cuda:0, in MiB:",
            "NVML, this process         500.0     800.0    +300.0",
            "*_ test_failing_body _*",
            "E * ValueError: the body's own failure comes first",
            "*= cudagraph =*",
            "memory growth across the test body (NVML, this process):",
            "  test_*.py::test_small on cuda:0: +3.0 MiB of 32 MiB bound ok; peak +5.0 MiB; "
            "torch reserved +0.0 MiB, outside torch +3.0 MiB",
            "  test_*.py::test_large on cuda:0: +300.0 MiB of 64 MiB bound OVER; *",
        ]
    )
    assert "test_failing_body on" not in result.stdout.str()


def test_bound_from_ini_and_env(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_pytester.makeini("[pytest]\ncudagraph_memory_bound = 2")
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.fake_memory(growth_mib=8)
        @pytest.mark.graph_memory_bound
        def test_a():
            pass
        """
    )
    cpu_pytester.runpytest_inprocess().assert_outcomes(failed=1)
    monkeypatch.setenv("PYTEST_CUDAGRAPH_MEMORY_BOUND", "0.01GiB")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip where CUDA is absent")
def test_marker_and_probe_skip_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.graph_memory_bound(64)
        def test_marked():
            raise AssertionError("must not run")

        def test_probe(device_memory):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["  2 x needs CUDA: torch.cuda.is_available() is False"])


@pytest.mark.skipif(nvml_status().available, reason="checks the skip where NVML is absent")
def test_probe_skips_without_nvml(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        import torch

        @pytest.fixture
        def cuda_device():
            return torch.device("cpu")
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.graph_memory_bound(64)
        def test_marked():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"  1 x needs NVML: {nvml_status().detail}"])


@pytest.mark.parametrize(
    ("marker", "option", "outcome"),
    [("64", "1", "passed"), ("1", "64", "failed")],
    ids=["marker-allows-more", "marker-allows-less"],
)
def test_the_marker_bound_beats_the_command_line(
    cpu_pytester: pytest.Pytester, marker: str, option: str, outcome: str
) -> None:
    cpu_pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.fake_memory(growth_mib=10)
        @pytest.mark.graph_memory_bound({marker})
        def test_bounded():
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess(f"--cudagraph-memory-bound={option}")
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines(
        [f"  test_*.py::test_bounded on cuda:0: +10.0 MiB of {marker} MiB *"]
    )


@pytest.mark.parametrize(
    ("bound", "message"),
    [
        ("10**400", "bound must be a positive size, got an integer past 1.8e308"),
        ("float('inf')", "bound must be a positive size, got inf"),
        ("-1", "bound must be a positive size, got -1"),
        ("'16 MB'", "bound must be a number of MiB or a size with a unit KiB, MiB or GiB*"),
    ],
)
def test_a_bad_marker_bound_is_a_collection_error(
    pytester: pytest.Pytester, bound: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.graph_memory_bound({bound})
        def test_bounded():
            pass
        """
    )
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*graph_memory_bound on test_*.py::test_bounded: {message}"])
