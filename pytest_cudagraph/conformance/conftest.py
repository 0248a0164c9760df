"""Fixtures local to the conformance suite: the target in a clean state, and figures for the
summary table. The session's target itself is the plugin's ``conformance_target`` fixture."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pytest_cudagraph import report as reports
from pytest_cudagraph.conformance.support import lock_was_held
from pytest_cudagraph.target import CudaGraphTarget


@pytest.fixture
def target(conformance_target: CudaGraphTarget) -> Iterator[CudaGraphTarget]:
    """The session's target, reset before the check (when it can be). Its lock must be free
    before and after: a check that finds it held frees it, so that one broken check does not
    hang the rest."""
    require_lock_free(conformance_target, "before this check")
    if conformance_target.reset is not None:
        conformance_target.reset()
    yield conformance_target
    require_lock_free(conformance_target, "after this check")


def require_lock_free(target: CudaGraphTarget, when: str) -> None:
    if lock_was_held(target):
        pytest.fail(
            f"the target's lock was held {when}; it was released so the suite can go on",
            pytrace=False,
        )


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record the figure behind this check's verdict for the summary table."""

    def record(figure: str) -> None:
        reports.record_for_summary(request.node, "conformance", figure)

    return record
