"""no_host_sync: the marker and the body run under torch's sync debug mode "error".

The mode is the engine's (pytest_cudagraph.hostsync.host_syncs_fail). It exists only for
CUDA, so where ``cuda_device`` is overridden with the CPU the test skips, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_cudagraph.markers import MarkerFeature


def no_host_sync() -> bool:
    """Fail the test when its body makes the host wait for the device (torch sync debug
    mode "error")."""
    return True


class NoHostSyncMarker(MarkerFeature):
    function = staticmethod(no_host_sync)
    fixtures = ("cuda_device",)

    def set_up(self, request: pytest.FixtureRequest, mark: object) -> None:
        device = request.getfixturevalue("cuda_device")
        if device.type != "cuda":
            pytest.skip(
                f"no_host_sync needs a CUDA device: cuda_device is {device}, where no "
                "operation waits for a device"
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        if self.mark_of(item) is None:
            return (yield)
        from pytest_cudagraph.hostsync import host_syncs_fail

        with host_syncs_fail():
            return (yield)
