"""The host-sync detectors' CPU-side behaviour: no CUDA means nothing to wait for, and the
trial capture refuses bad input before touching CUDA."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.engines.hostsync import (
    HostSyncError,
    TrialCapture,
    host_syncs_fail,
    trial_capture,
)


@pytest.mark.parametrize("device", [torch.device("cpu"), None])
def test_sync_debug_detector_on_a_cpu_device_runs_the_block_as_it_is(
    device: torch.device | None,
) -> None:
    if device is None and torch.cuda.is_available():
        pytest.skip("checks the CPU-only path: this torch has CUDA")
    ran = []
    with host_syncs_fail(device):
        ran.append(torch.ones(2).sum().item())
    assert ran == [2.0]


def test_errors_other_than_a_sync_pass_through() -> None:
    with pytest.raises(RuntimeError, match="not a sync"):
        with host_syncs_fail(torch.device("cpu")):
            raise RuntimeError("not a sync")


def test_trial_capture_refuses_a_non_callable_body() -> None:
    with pytest.raises(TypeError, match="body must be callable"):
        trial_capture(42, torch.device("cuda", 0))  # type: ignore[arg-type]


def test_trial_capture_refuses_a_cpu_device_where_graphs_are_not_emulated() -> None:
    ran = []
    with pytest.raises(
        ValueError, match="device must be a CUDA device, or graphs emulated, got cpu"
    ):
        trial_capture(lambda: ran.append(1), torch.device("cpu"))
    assert ran == []


def test_a_failed_trial_names_the_detector_and_the_error() -> None:
    failed = TrialCapture("RuntimeError: operation not permitted when stream is capturing")
    assert not failed.clean
    assert failed.reason() == (
        "no_host_sync: the test body cannot be captured in a CUDA graph (a trial capture on a "
        "side stream failed, as it does on a host sync): RuntimeError: operation not permitted "
        "when stream is capturing"
    )
    assert TrialCapture("").clean and TrialCapture("").reason() == ""


class FakeSyncDebugMode:
    """torch.cuda's sync debug mode switch, on a machine without CUDA."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mode, self.modes = 0, []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: self.mode)
        monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", self.set)

    def set(self, mode: int | str) -> None:
        self.mode = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)
        self.modes.append(self.mode)


def test_a_sync_in_the_block_is_a_host_sync_error_of_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switch = FakeSyncDebugMode(monkeypatch)
    torch_error = RuntimeError("called a synchronizing CUDA operation")
    with pytest.raises(HostSyncError, match=r"^no_host_sync: the test body synchronized") as raised:
        with host_syncs_fail(torch.device("cuda", 0)):
            assert switch.mode == 2
            raise torch_error
    assert raised.value.__cause__ is torch_error
    assert isinstance(raised.value, AssertionError) and not isinstance(raised.value, RuntimeError)
    assert switch.modes == [2, 0]  # restored
