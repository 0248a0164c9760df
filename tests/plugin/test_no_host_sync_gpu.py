"""no_host_sync on a real GPU: which of its two detectors catches what through the marker.

The engines' own table (every sync, each detector) is test_gpu_engines.py's; here the marker
runs a test body under the debug mode alone, and with ``trial_capture=True`` under both.
"""

from __future__ import annotations

import pytest

from pytest_cudagraph.skips import needs_cuda

pytestmark = needs_cuda

BODIES = """
import pytest
import torch


@pytest.mark.no_host_sync
def test_synchronize_debug_mode_only(cuda_device):
    torch.ones(3, device=cuda_device).mul_(2)
    torch.cuda.synchronize()


@pytest.mark.no_host_sync(trial_capture=True)
def test_synchronize_with_trial(cuda_device):
    torch.ones(3, device=cuda_device).mul_(2)
    torch.cuda.synchronize()


@pytest.mark.no_host_sync(trial_capture=True)
def test_item_with_trial(cuda_device):
    torch.ones(3, device=cuda_device).sum().item()


@pytest.mark.no_host_sync(trial_capture=True)
def test_clean_with_trial(cuda_device):
    x = torch.randn(64, 64, device=cuda_device)
    torch.softmax(x @ x.T, dim=-1)


def test_state_afterwards(cuda_device):
    assert torch.cuda.get_sync_debug_mode() == 0
    assert torch.cuda.current_stream(cuda_device) == torch.cuda.default_stream(cuda_device)
    assert (torch.arange(4.0, device=cuda_device) * 2).sum().item() == 12.0
"""


def test_each_detector_catches_what_it_can(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(BODIES)
    result = pytester.runpytest_inprocess("-rp")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_synchronize_with_trial _*",
            "*no_host_sync: the test body cannot be captured in a CUDA graph (a trial capture "
            "on a side stream failed, as it does on a host sync): *",
            "*_ test_item_with_trial _*",  # the debug mode's verdict, before any trial
            "*no_host_sync: the test body synchronized the host with the device*",
            "PASSED *::test_synchronize_debug_mode_only",  # the debug mode misses it
            "PASSED *::test_clean_with_trial",
            "PASSED *::test_state_afterwards",
        ]
    )
