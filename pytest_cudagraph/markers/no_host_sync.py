"""no_host_sync: the marker and its two detectors around the test body.

The body always runs under torch's sync debug mode "error" (the engine's
pytest_cudagraph.engines.hostsync.host_syncs_fail). With ``trial_capture=True`` it is then run
again through a trial capture (pytest_cudagraph.engines.hostsync.trial_capture), which catches the
syncs the debug mode misses (``torch.cuda.synchronize()``, a non-blocking copy from pageable
memory) but runs the body twice more, so it is opt-in. Where ``cuda_device`` is the CPU the
trial capture is of emulated graphs (``engines.emulation``), and without it the test skips,
saying why: the debug mode exists only for CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_cudagraph.markers import MarkerFeature, body_with_fixtures, emulated_on_the_cpu

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class HostSyncMark:
    """The marker's arguments."""

    trial_capture: bool


def no_host_sync(trial_capture: bool = False) -> HostSyncMark:
    """Fail the test when its body makes the host wait for the device (torch sync debug
    mode "error"); with trial_capture=True also capture the body once more into a discarded
    CUDA graph, which fails on any host sync (the body must be repeatable)."""
    if not isinstance(trial_capture, bool):
        raise TypeError(f"trial_capture must be True or False, got {trial_capture!r}")
    return HostSyncMark(trial_capture)


class NoHostSyncMarker(MarkerFeature[HostSyncMark]):
    function = staticmethod(no_host_sync)
    fixtures = ("cuda_device",)
    DEVICE: pytest.StashKey[torch.device] = pytest.StashKey()  # the device the body runs on

    def set_up(self, request: pytest.FixtureRequest, mark: HostSyncMark) -> None:
        device = request.getfixturevalue("cuda_device")
        if device.type != "cuda" and not mark.trial_capture:
            pytest.skip(
                f"no_host_sync needs a CUDA device for its sync debug mode: cuda_device is "
                f"{device}; give trial_capture=True to judge the body in a capture of emulated "
                "graphs there"
            )
        emulated_on_the_cpu(request, device)
        request.node.stash[self.DEVICE] = device

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        __tracebackhide__ = True  # a failure shows the test's frames, not the plugin's
        mark = self.mark_of(item)
        if mark is None or not isinstance(item, pytest.Function):  # set up only on functions
            return (yield)
        from pytest_cudagraph.engines.hostsync import HostSyncError, host_syncs_fail, trial_capture

        device = item.stash[self.DEVICE]
        if device.type != "cuda":  # emulated graphs: the trial capture is the detector
            result = yield
        else:
            try:
                with host_syncs_fail(device):
                    result = yield
            except HostSyncError as error:  # a failure, shown with torch's error and its line
                raise pytest.fail.Exception(str(error)) from error.__cause__
        if mark.trial_capture:
            trial = trial_capture(body_with_fixtures(item), device)
            if not trial.clean:
                pytest.fail(trial.reason(), pytrace=False)
        return result
