"""Local to the conformance suite: each check's declaration read at collection, the target in a
clean state, its capabilities handed to the checks typed, the witness, and one way to conclude.
The session's target itself is the conformance plugin's ``conformance_target`` fixture
(pytest_cudagraph.conformance._suite).

A check that may break the target (its declaration says so: it injects faults or fills a cache
past its capacity) may leave code that drops its graphs after an error running eagerly for
good: after each such check the target is asked how many graphs a call replays, and when fewer
than before, that check reports the fallback once and the checks after it run on a target
rebuilt from the factory. An error in the user's code (a capability's callable, draw, key_of, a
side) fails the check in the user's words, with the user's frames, never the suite's."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import torch

from pytest_cudagraph import records, settings
from pytest_cudagraph.conformance import _loading, _suite
from pytest_cudagraph.conformance._catalog import (
    Declaration,
    declaration_of,
    lacking_reason,
)
from pytest_cudagraph.conformance._judging import called, in_step, lock_was_held
from pytest_cudagraph.conformance._progress import CheckProgress, check_progress
from pytest_cudagraph.conformance._protocol import CAPABILITIES, Capability, CudaGraphTarget
from pytest_cudagraph.conformance._witness import Factory, Witness, graphs_per_call
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.graph_recorder import DEAD_TENSOR
from pytest_cudagraph.skips import needs_cuda

CHECKS = Path(__file__).parent / "checks"
NO_GRAPHED_SIDE = (
    "the target gives no graphed side here (graphed=None): build the graphs where "
    "pytest_cudagraph.conformance.graphs_on(device) holds, and graphs emulated on the CPU are "
    "judged too"
)
DECLARATION = pytest.StashKey[Declaration]()
# The parameter --cudagraph-repeat N > 1 gives each check: which of its N runs an item is.
REPEAT_PARAMETER = "_cudagraph_repeat"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With ``--cudagraph-repeat N`` (N > 1) each check is collected N times, one after the
    other, as ``test_x[repeat-1-of-N]`` and so on (as pytest-repeat does); once otherwise."""
    config = metafunc.config
    if metafunc.definition.path.parent != CHECKS or settings.SNAPSHOT not in config.stash:
        return
    repeats = settings.snapshot(config).value(settings.REPEAT)
    if repeats > 1:
        metafunc.fixturenames.append(REPEAT_PARAMETER)
        metafunc.parametrize(
            REPEAT_PARAMETER,
            range(1, repeats + 1),
            indirect=True,
            ids=lambda repeat: f"repeat-{repeat}-of-{repeats}",
        )


@pytest.fixture
def _cudagraph_repeat(request: pytest.FixtureRequest) -> int:
    """Which of the runs ``--cudagraph-repeat`` asks for this run of a check is (from 1)."""
    repeat: int = request.param
    return repeat


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Read each check's declaration into its stash, label each of its reports with the check's
    name for the table, and mark what needs CUDA (skipped without it, selected by ``-m cuda``).
    A test of the checks' folder that declares nothing is a collection error."""
    for item in items:
        if item.path.parent != CHECKS:
            continue
        declaration = declaration_of(item)
        if declaration is None:
            raise pytest.UsageError(
                f"{item.nodeid} declares nothing: every check of the suite is declared with "
                "@check(...) (pytest_cudagraph.conformance._catalog)"
            )
        item.stash[DECLARATION] = declaration
        records.record(item, _suite.CHECK, declaration.name)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and REPEAT_PARAMETER in callspec.params:
            records.record(item, _suite.REPEAT, callspec.params[REPEAT_PARAMETER])
        emulated = declaration.runs_on == "graphs" and _suite.graphs_emulated(config)
        if emulated:
            records.record(item, _suite.EMULATED, True)
        elif declaration.runs_on != "cpu":
            for mark in needs_cuda:
                item.add_marker(mark)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """An error raised in the user's code while a check called it fails the check naming what
    was called, with the user's own frames; a replay on freed memory (torch's input-liveness
    check, or the emulated replay's) fails it naming the tensor."""
    try:
        return (yield)
    except _loading.UserCodeError as error:
        if DECLARATION not in item.stash:
            raise
        failure = _loading.explained(error, _suite.frames_asked(item.config))
    except RuntimeError as error:
        if DECLARATION not in item.stash or DEAD_TENSOR not in str(error):
            raise
        failure = (
            "a graph replayed on memory freed since its capture: a tensor it reads was rebound "
            f"or dropped (no rebound tensors names it): {error}"
        )
    pytest.fail(failure, pytrace=False)  # outside the handler: the user's error alone shown


@pytest.fixture(scope="session")
def cuda_device(request: pytest.FixtureRequest) -> torch.device:
    """The device the suite's checks run on: the CPU where they judge emulated graphs (the
    parity engine's fixture asks for it), else the plugin's own ``cuda_device``."""
    if _suite.graphs_emulated(request.config):
        return torch.device("cpu")
    device: torch.device = request.getfixturevalue("cuda_device")  # the plugin's, overridden
    return device


@pytest.fixture
def target(
    conformance_target: CudaGraphTarget, request: pytest.FixtureRequest
) -> Iterator[CudaGraphTarget]:
    """The session's target (or the one rebuilt for it), with what the check needs (it skips
    otherwise, naming what is missing), reset before and after the check (when it can be), its
    two sides' states brought together before it. Its lock must be free before and after: a
    check that finds it held frees it, so that one broken check does not hang the rest. After
    the check, what a failure keeps alive is let go and the device's work finished: a failed
    check leaves nothing for a later one to measure. After a check that may break the target,
    its graphs are looked for."""
    current = request.config.stash.get(_suite.REBUILT, conformance_target)
    declaration = request.node.stash.get(DECLARATION, None)
    if declaration is not None and declaration.lacking(current):
        pytest.skip(lacking_reason(declaration.lacking(current)))
    if declaration is not None and declaration.runs_on != "cpu" and current.graphed is None:
        pytest.skip(NO_GRAPHED_SIDE)
    reset = current.cache.reset if current.cache is not None else None
    require_lock_free(current, "before this check")
    watched = declaration is not None and declaration.breaks_target
    with user_errors_named(request.config):
        graphs_before = graphs_per_call(current) if watched and current.graphed else None
        if reset is not None:
            called("Cache.reset", reset)
        in_step(current)
    yield current
    _suite.forget_last_failure()
    if current.device.type == "cuda":
        torch.cuda.synchronize(current.device)
    held = lock_was_held(current)  # released if it was, so the reset can run
    with user_errors_named(request.config):
        if reset is not None:
            called("Cache.reset", reset)
    if held:
        fail_held_lock("after this check")
    if graphs_before and (graphs_per_call(current) or 0) < graphs_before:
        assert declaration is not None
        fail_permanent_fallback(request.config, declaration.name, current)


@functools.cache
def _capability_fixture(slot: str) -> object:
    """The fixture named ``slot`` (``cache``, ``state``, ...): the target's capability there, or
    None. A check whose declaration needs it skipped without it, so it is given."""

    @pytest.fixture(name=slot)
    def capability(target: CudaGraphTarget) -> Capability | None:
        given: Capability | None = getattr(target, slot)
        return given

    return capability


# One fixture per capability slot, so that a check asks for what it uses by its slot's name.
for _kind in CAPABILITIES:
    globals()[f"{_kind.SLOT}_fixture"] = _capability_fixture(_kind.SLOT)


@pytest.fixture
def witness(
    target: CudaGraphTarget, capture_counter: CaptureCounter, target_factory: Factory
) -> Witness:
    """The witnessed checks' skeleton on this check's target (``_witness``)."""
    return Witness(target, capture_counter, target_factory)


@pytest.fixture
def conclude(request: pytest.FixtureRequest) -> _suite.Conclude:
    """How the check ends: its figure recorded, its verdict given (``_suite.Conclude``)."""
    return _suite.Conclude(request.node)


@contextlib.contextmanager
def user_errors_named(config: pytest.Config) -> Iterator[None]:
    """An error of the user's code inside the block (or a target that breaks a rule of the
    state) fails the test in the user's words, with the user's frames."""
    try:
        yield
        return
    except _loading.UserCodeError as error:
        failure = _loading.explained(error, _suite.frames_asked(config))
    except AssertionError as error:
        failure = str(error)
    # The context manager's exit runs while the error is handled, so even outside the handler
    # the failure would be chained to it (pytest shows the chain above it): the user's error
    # alone is shown.
    try:
        pytest.fail(failure, pytrace=False)
    except pytest.fail.Exception as failed:
        raise failed from None


def fail_permanent_fallback(config: pytest.Config, check: str, broken: CudaGraphTarget) -> None:
    """Report once that the target runs without its graphs since ``check``, and give the checks
    after it a target rebuilt from the factory."""
    try:
        config.stash[_suite.REBUILT] = _suite.fresh_target(config, broken.device)
        after = "the checks after this one run on a target rebuilt from the factory"
    except _loading.TargetError as error:
        after = f"it could not be rebuilt ({error}), so the checks after this one judge it so"
    pytest.fail(
        f"after {check}, the target runs without its graphs for good: its calls replay fewer "
        "graphs than they did before this check (a fall back to eager, as code that drops "
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
def record_figure(request: pytest.FixtureRequest) -> _suite.FigureRecorder:
    """Record the figure behind this check's verdict for the table: its text, and the numbers
    behind it by name (``record_figure(text, peak_mib=...)``), which scripts read."""
    return functools.partial(_suite.record_figure, request.node)


@pytest.fixture
def record_account(request: pytest.FixtureRequest) -> _suite.AccountRecorder:
    """Record which of the user's code ran and what the target lacks for the checks that need
    CUDA, for the account a run without CUDA ends with."""
    return functools.partial(_suite.record_account, request.node)


@pytest.fixture
def explain(request: pytest.FixtureRequest) -> _suite.ErrorExplainer:
    """An error in the user's code as the session asked to see it: its whole message and the
    user's own frames (every frame under --tb=long, --tb=native, --full-trace)."""
    return functools.partial(_loading.explained, frames=_suite.frames_asked(request.config))


@pytest.fixture
def capture_counter() -> CaptureCounter:
    """Counts the captures and replays of torch.cuda.CUDAGraph while entered, and records what
    each capture reads (``engines.graph_recorder``; torch's input-liveness check on too, where
    torch has it)."""
    return CaptureCounter(record=True)


@pytest.fixture
def target_factory(request: pytest.FixtureRequest, target: CudaGraphTarget) -> Factory:
    """A fresh target of the session's spec on the target's device, from the factory: where a
    check saw no capture, it gets one on a target of its own (``_witness``)."""
    return functools.partial(_suite.fresh_target, request.config, target.device)


@pytest.fixture
def progress(request: pytest.FixtureRequest) -> CheckProgress:
    """Where a long check is, said on the terminal now and then (quiet under -q)."""
    return check_progress(request)


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    """A check module installed in a virtual environment inside the project (the README's
    layout) gets its id from the package on (``pytest_cudagraph/conformance/checks/...``), not
    from ``.venv/lib/.../site-packages/``, so that progress lines do not wrap."""
    module = pytest.Module.from_parent(parent, path=module_path)
    prefix, installed, short = module.nodeid.rpartition("-packages/")
    if installed and prefix.endswith(("site", "dist")):
        module = pytest.Module.from_parent(parent, path=module_path, nodeid=short)
    return module
