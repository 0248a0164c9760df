"""no_host_sync where CUDA is absent, and its failure with torch's switch faked (the real
sync debug mode is in test_no_host_sync_gpu.py)."""

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
        [
            "SKIPPED * no_host_sync needs a CUDA device for its sync debug mode: cuda_device is "
            "cpu; give trial_capture=True to judge the body in a capture of emulated graphs there"
        ]
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


def test_the_marker_turns_the_engine_s_host_sync_error_into_a_failure(
    pytester: pytest.Pytester,
) -> None:
    """torch's sync debug mode switch faked, so that no GPU is needed: the body raises what
    torch raises in mode "error"."""
    pytester.makeconftest(
        """
        import pytest
        import torch

        @pytest.fixture
        def cuda_device(monkeypatch):
            monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
            monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
            monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
            return torch.device("cuda", 0)
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.no_host_sync
        def test_syncs():
            raise RuntimeError("called a synchronizing CUDA operation at line 3")
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*RuntimeError: called a synchronizing CUDA operation at line 3",
            "*The above exception was the direct cause of the following exception:*",
            "E *Failed: no_host_sync: the test body synchronized the host with the device, so "
            "this code is not capture-clean (torch: called a synchronizing CUDA operation at "
            "line 3)",
        ]
    )
    assert "HostSyncError" not in result.stdout.str()
    assert "pytest_cudagraph/markers" not in result.stdout.str()  # the plugin's frames hidden
