"""Local to the conformance suite: each check labelled for the table, the target in a clean
state, and figures (text and named numbers) for the table. The session's target itself is the
conformance plugin's ``conformance_target`` fixture (pytest_cudagraph.conformance.suite).

A check that injects faults or fills a cache past its capacity may leave code that drops its
graphs after an error running eagerly for good: after each such check the target is asked
whether it still replays its graphs (it did before), and when it no longer does, that check
reports the fallback once and the checks after it run on a target rebuilt from the factory."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_cudagraph import results
from pytest_cudagraph.conformance import loading, suite
from pytest_cudagraph.conformance.judging import in_step, lock_was_held
from pytest_cudagraph.conformance.progress import CheckProgress, check_progress
from pytest_cudagraph.conformance.protocol import CudaGraphTarget
from pytest_cudagraph.conformance.witness import Factory, runs_its_graphs
from pytest_cudagraph.engines.captures import CaptureCounter

SUITE = Path(__file__).parent
# The checks that inject faults or fill a cache past its capacity (see above).
BREAKING_CHECKS = ("lock safety", "bounded memory", "memory over a long run")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Label each check of this suite with its name ("test_no_baked_inputs" -> "no baked
    inputs"), on every report it makes (set-up errors included), for the table."""
    for item in items:
        if item.path.parent == SUITE and isinstance(item, pytest.Function):
            results.record(item, suite.CHECK, check_name(item))


def check_name(item: pytest.Function) -> str:
    """A check's name as the table shows it ("test_no_baked_inputs" -> "no baked inputs")."""
    return item.originalname.removeprefix("test_").replace("_", " ")


@pytest.fixture
def target(
    conformance_target: CudaGraphTarget, request: pytest.FixtureRequest
) -> Iterator[CudaGraphTarget]:
    """The session's target (or the one rebuilt for it), reset before and after the check
    (when it can be), its two sides' states brought together before it (``State.sides``: what
    one check called on one side alone does not reach the next check's comparisons). Its lock
    must be free before and after: a check that finds it held frees it, so that one broken
    check does not hang the rest. After the check, what a failure keeps alive is let go and
    the device's work finished: a failed check leaves nothing for a later one to measure.
    After a check that may break the target, its graphs are looked for."""
    current = request.config.stash.get(suite.REBUILT, conformance_target)
    reset = current.cache.reset if current.cache is not None else None
    require_lock_free(current, "before this check")
    check = check_name(request.node)
    watched = check in BREAKING_CHECKS and current.device.type == "cuda"
    ran_graphs = watched and runs_its_graphs(current)
    if reset is not None:
        reset()
    in_step(current)
    yield current
    suite.forget_last_failure()
    if current.device.type == "cuda":
        torch.cuda.synchronize(current.device)
    held = lock_was_held(current)  # released if it was, so the reset can run
    if reset is not None:
        reset()
    if held:
        fail_held_lock("after this check")
    if ran_graphs and runs_its_graphs(current) is False:
        fail_permanent_fallback(request.config, check, current)


def fail_permanent_fallback(config: pytest.Config, check: str, broken: CudaGraphTarget) -> None:
    """Report once that the target runs without its graphs since ``check``, and give the checks
    after it a target rebuilt from the factory."""
    try:
        config.stash[suite.REBUILT] = suite.fresh_target(config, broken.device)
        after = "the checks after this one run on a target rebuilt from the factory"
    except loading.TargetError as error:
        after = f"it could not be rebuilt ({error}), so the checks after this one judge it so"
    pytest.fail(
        f"after {check}, the target runs without its graphs for good: its calls replay none, "
        "where they did before this check (a permanent fallback to eager, as code that drops "
        f"its graphs after an error makes); {after}",
        pytrace=False,
    )


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
def target_factory(request: pytest.FixtureRequest, target: CudaGraphTarget) -> Factory:
    """A fresh target of the session's spec on the target's device, from the factory: where a
    check saw no capture, it gets one on a target of its own (``witness``)."""
    return functools.partial(suite.fresh_target, request.config, target.device)


@pytest.fixture
def progress(request: pytest.FixtureRequest) -> CheckProgress:
    """Where a long check is, said on the terminal now and then (quiet under -q)."""
    return check_progress(request)
