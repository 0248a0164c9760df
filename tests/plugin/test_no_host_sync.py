"""no_host_sync where CUDA is absent (the real sync debug mode is in test_gpu_plugin.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip where CUDA is absent")
def test_marker_skips_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.no_host_sync
        def test_sync():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["  1 x needs CUDA: torch.cuda.is_available() is False"])


def test_marker_skips_where_cuda_device_is_the_cpu(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.no_host_sync
        def test_sync():
            raise AssertionError("must not run")
        """
    )
    result = cpu_pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED * no_host_sync needs a CUDA device: cuda_device is cpu, where no operation *"]
    )


@pytest.mark.parametrize("argument", ["'yes'", "1", "None"])
def test_trial_capture_must_be_a_bool(pytester: pytest.Pytester, argument: str) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.no_host_sync(trial_capture={argument})
        def test_sync():
            pass
        """
    )
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            f"*no_host_sync on test_*.py::test_sync: trial_capture must be True or False, got {argument}"
        ]
    )


def test_trial_capture_skips_too_where_cuda_device_is_the_cpu(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.no_host_sync(trial_capture=True)
        def test_sync():
            raise AssertionError("must not run")
        """
    )
    result = cpu_pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no_host_sync needs a CUDA device: cuda_device is cpu*"])
