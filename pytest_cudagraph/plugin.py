"""pytest hooks of pytest-cudagraph (entry point ``pytest_cudagraph``).

All hooks, options and fixtures are here, in the order pytest uses them: options and
configuration, collection (marker arguments are validated and off-stack tests marked
skipped there), fixtures, the test run (call, report), then the session's end (stray
contexts, summary). What each marker does lives in its own module: parity, memory, stack
and hostsync.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterator

import pytest
import torch
from packaging.specifiers import SpecifierSet

from pytest_cudagraph import bench, devices, hostsync, memory, parity, settings, stack, target
from pytest_cudagraph import report as reports
from pytest_cudagraph.conformance import summary as conformance_summary
from pytest_cudagraph.faults import FaultInjector

# The marker functions validate a marker's arguments and define its --markers help.
MARKERS = (
    parity.cuda_graph_parity,
    memory.graph_memory_bound,
    stack.pinned_stack,
    hostsync.no_host_sync,
)
MARKER_NAMES = tuple(marker.__name__ for marker in MARKERS)
NEEDS_CUDA = "needs CUDA: torch.cuda.is_available() is False"


@dataclasses.dataclass(frozen=True)
class Marks:
    """One test's validated marker arguments, stashed on the item at collection."""

    parity: parity.ParityMark | None = None
    memory_bound_mib: float | None = None
    pinned_overrides: dict[str, SpecifierSet] | None = None
    no_host_sync: bool = False


MARKS = pytest.StashKey[Marks]()
PARITY_CHECKER = pytest.StashKey[parity.ParityChecker]()
MEMORY_PROBE = pytest.StashKey[memory.DeviceMemoryProbe]()
SECTIONS = pytest.StashKey[list[tuple[str, str]]]()
BINDING = pytest.StashKey[devices.DeviceBinding]()
PINNED_STACK = pytest.StashKey[dict[str, SpecifierSet]]()
STRAY_CHECKS = pytest.StashKey[list[devices.StrayCheck]]()
STRAY_CHECK_OUTPUT = "cudagraph_stray_check"  # key in xdist's workeroutput


# Options and configuration


def pytest_addoption(parser: pytest.Parser) -> None:
    for setting in settings.SETTINGS:
        settings.add_to_parser(parser, setting)
    settings.add_to_parser(parser, target.TARGET)
    parser.addini(
        "cudagraph_pinned_stack",
        type="args",
        default=list(stack.DEFAULT_PINNED_STACK),
        help="the stack pinned_stack tests need, as entries like python~=3.10.0 torch~=2.7.0 "
        "cuda~=11.8 (component name followed by PEP 440 specifiers)",
    )


@pytest.hookimpl(tryfirst=True)  # an xdist worker's GPU must be chosen before CUDA starts
def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", _marker_help(marker))
    for setting in settings.SETTINGS:
        settings.resolve(config, setting)  # a bad value is a usage error now, not mid-run
    try:
        config.stash[PINNED_STACK] = stack.parse_pinned_stack(
            config.getini("cudagraph_pinned_stack")
        )
    except ValueError as error:
        raise pytest.UsageError(f"ini cudagraph_pinned_stack: {error}") from None
    config.stash[BINDING] = _bind_device(config)
    config.stash[STRAY_CHECKS] = []
    config.stash[reports.SUMMARY_RECORDS] = []
    config.pluginmanager.register(_SummaryRecords(config), "cudagraph-summary-records")
    conformance_summary.register(config, target.target_spec(config))  # loads an explicit spec
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(config), "cudagraph-xdist")
    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(bench.BenchmarkHooks(), "cudagraph-benchmark")


def _marker_help(marker: Callable[..., object]) -> str:
    parameters = inspect.signature(marker).parameters.values()
    arguments = ", ".join(f"{parameter.name}={parameter.default!r}" for parameter in parameters)
    summary = " ".join(inspect.getdoc(marker).split("\n\n")[0].split())
    return (
        f"{marker.__name__}({arguments}): {summary}"
        if arguments
        else f"{marker.__name__}: {summary}"
    )


def _bind_device(config: pytest.Config) -> devices.DeviceBinding:
    chosen = settings.resolve(config, settings.DEVICE)
    if chosen.value is not None:
        return devices.DeviceBinding(chosen.value, chosen.source)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        distributed = config.getoption("dist", "no") != "no"  # an xdist controller
        how = "xdist controller; each worker binds its own GPU" if distributed else "default"
        return devices.DeviceBinding(torch.device("cuda", 0), how)
    worker_id = workerinput["workerid"]
    if torch.cuda.is_initialized():
        reason = (
            f"xdist worker {worker_id}: not bound, CUDA was initialised before pytest_configure"
        )
        config.issue_config_time_warning(pytest.PytestConfigWarning(reason), stacklevel=2)
        return devices.DeviceBinding(torch.device("cuda", 0), reason)
    return devices.bind_xdist_worker(worker_id, os.environ)


def pytest_report_header(config: pytest.Config) -> list[str]:
    running = stack.running_stack()
    environment = reports.Environment(
        torch_version=torch.__version__,
        running=running,
        nvml=devices.nvml_status(),
        gpus=devices.visible_gpus(),
        stack_mismatches=stack.mismatches(config.stash[PINNED_STACK], running),
        binding=config.stash[BINDING],
    )
    return reports.header_lines(environment)


# Collection


class MarkerArgumentError(Exception):
    pass


@pytest.hookimpl(trylast=True)  # validate only what selection left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    valid = []
    for item in items:
        try:
            marks = item.stash[MARKS] = _read_marks(item)
        except MarkerArgumentError as error:
            failed = pytest.CollectReport(item.nodeid, "failed", str(error), [])
            config.hook.pytest_collectreport(report=failed)
            continue
        if marks.pinned_overrides is not None:
            _skip_off_stack(item, marks.pinned_overrides)
        valid.append(item)
    items[:] = valid


def _read_marks(item: pytest.Item) -> Marks:
    def arguments(marker_function: Callable[..., object]) -> object:
        name = marker_function.__name__
        marker = item.get_closest_marker(name)
        if marker is None:
            return None
        try:
            return marker_function(*marker.args, **marker.kwargs)
        except (TypeError, ValueError) as error:
            message = str(error).removeprefix(f"{name}() ")
            raise MarkerArgumentError(f"{name} on {item.nodeid}: {message}") from None

    bound = arguments(memory.graph_memory_bound)
    bound_mib = None
    if bound is not None:
        bound_mib = settings.resolve(item.config, settings.MEMORY_BOUND_MIB, bound.mib).value
        if bound_mib is None:
            raise MarkerArgumentError(
                f"graph_memory_bound on {item.nodeid}: needs mib, or a default bound from "
                f"{settings.MEMORY_BOUND_MIB.option}"
            )
    return Marks(
        parity=arguments(parity.cuda_graph_parity),
        memory_bound_mib=bound_mib,
        pinned_overrides=arguments(stack.pinned_stack),
        no_host_sync=bool(arguments(hostsync.no_host_sync)),
    )


def _skip_off_stack(item: pytest.Item, overrides: dict[str, SpecifierSet]) -> None:
    if settings.resolve(item.config, settings.STACK).value == "any":
        return
    pinned = {**item.config.stash[PINNED_STACK], **overrides}
    found = stack.mismatches(pinned, stack.running_stack())
    if found:
        # A skip mark, so the skip is reported at the test's own location.
        item.add_marker(pytest.mark.skip(reason=stack.skip_reason(found)))


# Fixtures


@pytest.fixture(scope="session")
def cuda_device(pytestconfig: pytest.Config) -> torch.device:
    """The CUDA device this test process is bound to; skips without CUDA."""
    if not torch.cuda.is_available():
        pytest.skip(NEEDS_CUDA)
    device = pytestconfig.stash[BINDING].device
    if device.index >= torch.cuda.device_count():
        pytest.fail(f"bound to {device}, but {torch.cuda.device_count()} GPU(s) are visible")
    torch.cuda.set_device(device)
    return device


@pytest.fixture
def graph_parity(request: pytest.FixtureRequest, cuda_device: torch.device) -> parity.ParityChecker:
    """Parity engine on ``cuda_device``; a failing check or toggled run fails the test."""
    marks = request.node.stash.get(MARKS, Marks())
    marker_seed = marks.parity.seed if marks.parity else None
    seed = settings.resolve(request.config, settings.SEED, marker_seed).value

    def fail_on_mismatch(result: parity.ParityResult) -> None:
        counts = {"form": result.form, "checked": result.checked, "passed": result.passed}
        reports.record_for_summary(request.node, "parity", counts)
        if not result.ok:
            request.node.stash.setdefault(SECTIONS, []).append(
                ("cudagraph parity", result.details())
            )
            pytest.fail(result.reason(), pytrace=False)

    return parity.ParityChecker(cuda_device, seed, fail_on_mismatch)


@pytest.fixture
def device_memory(cuda_device: torch.device) -> memory.DeviceMemoryProbe:
    """NVML probe of this process's memory on ``cuda_device``; skips where NVML cannot tell."""
    nvml = devices.nvml_status()
    if not nvml.available:
        pytest.skip(f"needs NVML: {nvml.detail}")
    try:
        probe = memory.DeviceMemoryProbe(cuda_device)
        probe.sample()
    except (LookupError, memory.ProcessNotListed) as error:
        pytest.skip(str(error))
    return probe


@pytest.fixture
def fault_injector() -> Iterator[FaultInjector]:
    """Make a named call raise on its N-th invocation; patches are undone at teardown."""
    injector = FaultInjector()
    yield injector
    injector.restore()


@pytest.fixture(scope="session")
def conformance_target(request: pytest.FixtureRequest) -> target.CudaGraphTarget:
    """The conformance suite's target (``--cudagraph-target``), built once per session on
    ``cuda_device``, or on the CPU without CUDA (for the checks that need no GPU)."""
    return target.session_target(request)


@pytest.fixture
def cuda_timer(cuda_device: torch.device) -> Callable[[], float]:
    """A clock that synchronizes ``cuda_device`` before each reading (for benchmarks)."""
    return bench.synchronizing_timer(cuda_device)


@pytest.fixture(autouse=True)
def _cudagraph_marker_fixtures(request: pytest.FixtureRequest) -> None:
    """Set up the fixtures this test's markers work through, so their skips apply (and so
    overriding those fixtures, e.g. ``cuda_device``, reaches the markers too)."""
    item = request.node
    marks = item.stash.get(MARKS, None)
    if marks is None:
        return
    if marks.parity is not None:
        item.stash[PARITY_CHECKER] = request.getfixturevalue("graph_parity")
    if marks.memory_bound_mib is not None:
        item.stash[MEMORY_PROBE] = request.getfixturevalue("device_memory")
    if marks.no_host_sync:
        request.getfixturevalue("cuda_device")


# The test run


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marks = item.stash.get(MARKS, Marks())
    with contextlib.ExitStack() as layers:
        measurement = None
        if marks.memory_bound_mib is not None:
            # Outermost, so the settling synchronize stays outside sync debug mode.
            measurement = layers.enter_context(item.stash[MEMORY_PROBE].measure())
        if marks.no_host_sync:
            layers.enter_context(hostsync.host_syncs_fail())
        result = yield
    if measurement is not None:
        _judge_memory(item, measurement.report, marks.memory_bound_mib)
    return result


def _judge_memory(item: pytest.Item, measured: memory.MemoryReport, bound_mib: float) -> None:
    verdict = memory.judge_growth(measured, bound_mib)
    figures = {**measured.figures(), "bound_mib": bound_mib, "passed": verdict.passed}
    reports.record_for_summary(item, "memory", figures)
    section = f"bound: {bound_mib:g} MiB of growth; {measured.section()}"
    item.stash.setdefault(SECTIONS, []).append(("cudagraph memory", section))
    if not verdict.passed:
        pytest.fail(verdict.reason, pytrace=False)


@pytest.hookimpl(tryfirst=True)  # the toggle form runs the body itself, twice
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marks = pyfuncitem.stash.get(MARKS, None)
    if marks is None or marks.parity is None or marks.parity.toggle is None:
        return None
    # Function-scoped fixtures are set up once; both runs share them.
    parameters = inspect.signature(pyfuncitem.obj).parameters
    arguments = {
        name: pyfuncitem.funcargs[name] for name in parameters if name in pyfuncitem.funcargs
    }
    body = functools.partial(pyfuncitem.obj, **arguments)
    pyfuncitem.stash[PARITY_CHECKER].run_toggled(body, marks.parity.toggle)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    test_report = yield
    if test_report.when == "call":
        test_report.sections.extend(item.stash.get(SECTIONS, []))
    return test_report


class _SummaryRecords:
    """Gathers summary records from reports; in the xdist controller they come from workers."""

    def __init__(self, config: pytest.Config) -> None:
        self._records = config.stash[reports.SUMMARY_RECORDS]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._records.extend(reports.records_from(report, MARKER_NAMES))


# The session's end


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if torch.cuda.is_initialized() and devices.nvml_status().available:
        check = _check_stray_contexts(config)
        if hasattr(config, "workeroutput"):  # an xdist worker: the controller reports it
            config.workeroutput[STRAY_CHECK_OUTPUT] = dataclasses.asdict(check)
        else:
            config.stash[STRAY_CHECKS].append(check)
    strays = any(check.strays for check in config.stash[STRAY_CHECKS])
    fail = settings.resolve(config, settings.STRAY_CONTEXTS).value == "fail"
    if strays and fail and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_stray_contexts(config: pytest.Config) -> devices.StrayCheck:
    worker_id = getattr(config, "workerinput", {}).get("workerid")
    process = f"{worker_id} pid {os.getpid()}" if worker_id else f"pid {os.getpid()}"
    try:
        return devices.check_stray_contexts(config.stash[BINDING].device, os.getpid(), process)
    except Exception as error:  # a diagnostic must not turn a finished run into a crash
        return devices.StrayCheck(process, f"not checked: {error}")


class _XdistHooks:
    """Registered only with pytest-xdist, whose hook names are unknown otherwise."""

    def __init__(self, config: pytest.Config) -> None:
        self._checks = config.stash[STRAY_CHECKS]

    def pytest_testnodedown(self, node: object, error: object) -> None:
        check = getattr(node, "workeroutput", {}).get(STRAY_CHECK_OUTPUT)
        if check is not None:
            self._checks.append(
                devices.StrayCheck(check["process"], check["note"], tuple(check["strays"]))
            )


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = reports.summary_lines(
        config.stash[reports.SUMMARY_RECORDS],
        config.stash.get(reports.SUMMARY_RENDERERS, []),
        config.stash[STRAY_CHECKS],
        settings.resolve(config, settings.STRAY_CONTEXTS).value,
    )
    if lines:
        terminalreporter.write_sep("=", "cudagraph")
        for line in lines:
            terminalreporter.write_line(line)
