"""Capture-clean forward: one eager forward at the largest key makes no device-to-host
synchronization, the precondition for capturing it at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.protocol import CaptureClean, CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.skips import needs_cuda


@pytest.fixture
def forward(target: CudaGraphTarget) -> Callable[[], object]:
    """The target's forward, run once outside the check so that first-use setup (drawing its
    inputs, library handles) is not judged."""
    forward = needed(target, CaptureClean).forward
    forward()
    return forward


@needs_cuda
@pytest.mark.no_host_sync
def test_capture_clean_forward(
    forward: Callable[[], object], record_figure: FigureRecorder
) -> None:
    forward()
    record_figure("one eager forward at the largest key, in sync debug mode 'error'")
