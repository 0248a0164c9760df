"""Capture-clean forward: one eager forward at the largest key makes no device-to-host
synchronization, the precondition for capturing it at all: run under sync debug mode "error",
then captured once more into a discarded graph (which fails on any host sync, those the debug
mode misses too; on emulated graphs, the one detector)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import called
from pytest_cudagraph.conformance._protocol import CaptureClean
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement


@pytest.fixture
def forward(capture_clean: CaptureClean) -> Callable[[], object]:
    """The target's forward, run once outside the check so that first-use setup (drawing its
    inputs, library handles) is not judged."""
    called("CaptureClean.forward", capture_clean.forward)
    return capture_clean.forward


@check("capture clean forward", needs=("capture_clean",))
@pytest.mark.no_host_sync(trial_capture=True)
def test_capture_clean_forward(forward: Callable[[], object], conclude: Conclude) -> None:
    called("CaptureClean.forward", forward)
    figure = "one eager forward at the largest key, in sync debug mode 'error'"
    conclude(Judgement([], figure, 1, "forwards"), "")
