"""Local to the conformance suite: each check labelled for the table, the target in a clean
state, and figures (text and named numbers) for the table. The session's target itself is the conformance plugin's
``conformance_target`` fixture (pytest_cudagraph.conformance.suite)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_cudagraph import results
from pytest_cudagraph.conformance import loading, suite
from pytest_cudagraph.conformance.judging import lock_was_held
from pytest_cudagraph.conformance.progress import CheckProgress, check_progress
from pytest_cudagraph.conformance.protocol import CudaGraphTarget
from pytest_cudagraph.engines.captures import CaptureCounter

SUITE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Label each check of this suite with its name ("test_no_baked_inputs" -> "no baked
    inputs"), on every report it makes (set-up errors included), for the table."""
    for item in items:
        if item.path.parent == SUITE and isinstance(item, pytest.Function):
            name = item.originalname.removeprefix("test_").replace("_", " ")
            results.record(item, suite.CHECK, name)


@pytest.fixture
def target(conformance_target: CudaGraphTarget) -> Iterator[CudaGraphTarget]:
    """The session's target, reset before and after the check (when it can be). Its lock
    must be free before and after: a check that finds it held frees it, so that one broken
    check does not hang the rest. After the check, what a failure keeps alive is let go and
    the device's work finished: a failed check leaves nothing for a later one to measure."""
    reset = conformance_target.cache.reset if conformance_target.cache is not None else None
    require_lock_free(conformance_target, "before this check")
    if reset is not None:
        reset()
    yield conformance_target
    suite.forget_last_failure()
    if conformance_target.device.type == "cuda":
        torch.cuda.synchronize(conformance_target.device)
    held = lock_was_held(conformance_target)  # released if it was, so the reset can run
    if reset is not None:
        reset()
    if held:
        fail_held_lock("after this check")


def require_lock_free(target: CudaGraphTarget, when: str) -> None:
    if lock_was_held(target):
        fail_held_lock(when)


def fail_held_lock(when: str) -> None:
    pytest.fail(
        f"the target's lock was held {when}; it was released so the suite can go on",
        pytrace=False,
    )


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> suite.FigureRecorder:
    """Record the figure behind this check's verdict for the table: its text, and the numbers
    behind it by name (``record_figure(text, peak_mib=...)``), which scripts read."""
    return functools.partial(suite.record_figure, request.node)


@pytest.fixture
def record_account(request: pytest.FixtureRequest) -> suite.AccountRecorder:
    """Record which of the user's code ran and what the target lacks for the checks that need
    CUDA, for the account a run without CUDA ends with."""
    return functools.partial(suite.record_account, request.node)


@pytest.fixture
def explain(request: pytest.FixtureRequest) -> suite.ErrorExplainer:
    """An error in the user's code as the session asked to see it: its whole message and the
    user's own frames (every frame under --tb=long, --tb=native, --full-trace)."""
    return functools.partial(loading.explained, frames=suite.frames_asked(request.config))


@pytest.fixture
def capture_counter() -> CaptureCounter:
    """Counts the captures and replays of torch.cuda.CUDAGraph while entered."""
    return CaptureCounter()


@pytest.fixture
def progress(request: pytest.FixtureRequest) -> CheckProgress:
    """Where a long check is, said on the terminal now and then (quiet under -q)."""
    return check_progress(request)
