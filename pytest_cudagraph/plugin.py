"""pytest hooks of pytest-cudagraph (entry point ``pytest_cudagraph``).

This module registers the features, declares the hooks of pytest_cudagraph.hookspec (the
markers' results sections come through them too) and resolves the settings once; what each
marker does lives in its own module under pytest_cudagraph.markers. Installed, the plugin runs in every
pytest session of the environment, so it stays quiet and cheap until a session uses it (a
cudagraph setting given, a marker or a fixture of its own on a collected test): neither
torch nor NVML is imported here, and the header is printed only for a session that uses it.
The one thing it always does is an xdist worker's GPU binding, which must happen before
anything starts CUDA and needs only ``CUDA_VISIBLE_DEVICES`` arithmetic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudagraph import hookspec, records, results, sections, settings
from pytest_cudagraph.engines import devices
from pytest_cudagraph.markers import SECTIONS, MarkerArgumentError, MarkerFeature
from pytest_cudagraph.markers.cuda_graph_parity import ParityMarker
from pytest_cudagraph.markers.graph_memory_bound import MemoryBoundMarker
from pytest_cudagraph.markers.no_host_sync import NoHostSyncMarker
from pytest_cudagraph.markers.pinned_stack import PinnedStackMarker

if TYPE_CHECKING:
    import torch

    from pytest_cudagraph.engines.faults import FaultInjector

# One line per marker; its module holds the rest.
FEATURES: tuple[type[MarkerFeature[Any]], ...] = (
    ParityMarker,
    MemoryBoundMarker,
    PinnedStackMarker,
    NoHostSyncMarker,
)
# Requesting one of these means the session uses the plugin.
FIXTURES = frozenset(
    (
        "cuda_device",
        "graph_parity",
        "device_memory",
        "fault_injector",
        "conformance_target",
        "cuda_timer",
        "cuda_benchmark",
    )
)
FEATURE_OBJECTS = pytest.StashKey[tuple[MarkerFeature[Any], ...]]()
BINDING = pytest.StashKey[devices.DeviceBinding]()
USED_BY = pytest.StashKey[list[str]]()
STRAY_CHECKS = pytest.StashKey[list[devices.StrayCheck]]()
RECORDS = pytest.StashKey[list[records.Record]]()
DECLARED = pytest.StashKey[list[sections.Section]]()  # the sections the plugins declare
USES_PLUGIN = pytest.StashKey[bool]()  # on an item that uses the plugin
INTERRUPTION = pytest.StashKey[str]()  # what interrupted the session, if anything did
JSON_OUTCOME = pytest.StashKey[str]()  # the terminal's line about the results file
# The session-wide emulation of CUDA graphs (``--cudagraph-emulate on``), open until unconfigure.
EMULATION = pytest.StashKey[contextlib.ExitStack]()
STRAY_CHECK_OUTPUT = "cudagraph_stray_check"  # key in xdist's workeroutput
RUN_TOKEN_INPUT = "cudagraph_run_token"  # key in xdist's workerinput
# The conformance wing's pytest plugin: its entry point's name (pyproject.toml) and module.
CONFORMANCE_ENTRY_POINT = "pytest_cudagraph_conformance"
CONFORMANCE_PLUGIN = "pytest_cudagraph.conformance._suite"
# The marker pytest_cudagraph.skips.needs_cuda adds beside its skip; registered here because the
# conformance checks carry it in every project that runs them.
CUDA_MARKER = (
    "cuda: needs a CUDA device; skipped without one, selected by the GPU recipe's test steps"
)


# Options and configuration


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """The hooks other plugins implement: their sections of the results."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    for setting in settings.SETTINGS:
        settings.add_to_parser(parser, setting)


@pytest.hookimpl(tryfirst=True)  # an xdist worker's GPU must be chosen before CUDA starts
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", {})
    if RUN_TOKEN_INPUT in workerinput:  # an xdist worker records for its controller to read
        records.join_run(workerinput[RUN_TOKEN_INPUT])
    snapshot = settings.take_snapshot(config)
    config.stash[BINDING] = _bind_device(config, snapshot)
    config.stash[USED_BY] = snapshot.given()
    config.stash[STRAY_CHECKS] = []
    config.stash[RECORDS] = []
    config.addinivalue_line("markers", CUDA_MARKER)
    features = config.stash[FEATURE_OBJECTS] = tuple(feature(config) for feature in FEATURES)
    for feature in features:
        config.addinivalue_line("markers", feature.help())
        config.pluginmanager.register(feature, f"cudagraph-{feature.name()}")
    config.pluginmanager.register(_RecordGatherer(config), "cudagraph-records")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(config), "cudagraph-xdist")
    # The cuda_benchmark fixture comes with these: pytest-benchmark's own, or a skip.
    from pytest_cudagraph import bench

    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(bench.BenchmarkHooks(), "cudagraph-benchmark")
    else:
        config.pluginmanager.register(bench.MissingBenchmark(), "cudagraph-benchmark-missing")
    if snapshot.value(settings.EMULATE) == "on":
        from pytest_cudagraph.engines.emulation import emulated_graphs

        config.stash[EMULATION] = contextlib.ExitStack()
        config.stash[EMULATION].enter_context(emulated_graphs())
    _load_conformance_wing(config.pluginmanager)


def pytest_unconfigure(config: pytest.Config) -> None:
    if EMULATION in config.stash:
        config.stash[EMULATION].close()


def _load_conformance_wing(manager: pytest.PytestPluginManager) -> None:
    """The plugin loads whole: with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, ``-p pytest_cudagraph``
    loads this module alone, so the wing's plugin is registered here where it is not yet (by
    module name: nothing of the wing is imported by this module). Entry points load before
    pytest_configure, so one registered under the entry point's name is found here. Its
    pytest_configure, a historic hook, runs as it is registered, after this one."""
    wing = sys.modules.get(CONFORMANCE_PLUGIN)
    if manager.is_blocked(CONFORMANCE_ENTRY_POINT) or (
        wing is not None and manager.is_registered(wing)
    ):
        return
    manager.import_plugin(CONFORMANCE_PLUGIN)


def _bind_device(config: pytest.Config, snapshot: settings.Snapshot) -> devices.DeviceBinding:
    chosen = snapshot[settings.DEVICE]
    if chosen.value is not None:
        return devices.DeviceBinding(chosen.value, chosen.source)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        distributed = config.getoption("dist", "no") != "no"  # an xdist controller
        how = "xdist controller; each worker binds its own GPU" if distributed else "default"
        return devices.DeviceBinding(0, how)
    worker_id = workerinput["workerid"]
    if _cuda_initialized():
        reason = (
            f"xdist worker {worker_id}: not bound, CUDA was initialised before pytest_configure"
        )
        config.issue_config_time_warning(pytest.PytestConfigWarning(reason), stacklevel=2)
        return devices.DeviceBinding(0, reason)
    return devices.bind_xdist_worker(worker_id, os.environ)


def _cuda_initialized() -> bool:
    """Without importing torch: a process that never imported it has not started CUDA."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Before collection: only a session that gave a cudagraph setting is known to use us."""
    if not config.stash[USED_BY]:
        return []
    lines = results.header_lines(results.stack_facts(), config.stash[BINDING])
    if EMULATION in config.stash:
        lines.append(
            f"cudagraph: CUDA graphs emulated on the CPU ({settings.EMULATE.option} on): "
            "cuda_device is the CPU, and graph code runs there with CUDA graphs' semantics"
        )
    return lines


# Collection


@pytest.hookimpl(trylast=True)  # validate only what selection left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    features = config.stash[FEATURE_OBJECTS]
    valid = []
    for item in items:
        try:
            marks = [(feature, feature.read(item)) for feature in features]
        except MarkerArgumentError as error:
            failed = pytest.CollectReport(item.nodeid, "failed", str(error), [])
            config.hook.pytest_collectreport(report=failed)
            continue
        for feature, mark in marks:
            if mark is not None:
                item.stash[feature.key] = mark
                feature.collected(item, mark)
        if any(mark is not None for _, mark in marks) or FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            config.stash[USED_BY].append(item.nodeid)
            item.stash[USES_PLUGIN] = True
        valid.append(item)
    items[:] = valid


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """After collection: the header, where a collected test uses the plugin."""
    used_by = config.stash[USED_BY]
    lines = []
    if used_by and not settings.snapshot(config).given():  # else the header said it
        lines += results.header_lines(results.stack_facts(), config.stash[BINDING])
    if used_by:
        for feature in config.stash[FEATURE_OBJECTS]:
            lines += getattr(feature, "header_lines", list)()
    return lines


# Fixtures


@pytest.fixture(scope="session")
def cuda_device(pytestconfig: pytest.Config) -> torch.device:
    """The CUDA device this test process is bound to; the CPU with ``--cudagraph-emulate on``
    (graphs then emulated there); skips without CUDA otherwise."""
    import torch

    from pytest_cudagraph.skips import NEEDS_CUDA

    if settings.snapshot(pytestconfig).value(settings.EMULATE) == "on":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip(NEEDS_CUDA)
    device = pytestconfig.stash[BINDING].device
    if device.index >= torch.cuda.device_count():
        pytest.fail(f"bound to {device}, but {torch.cuda.device_count()} GPU(s) are visible")
    torch.cuda.set_device(device)
    return device


@pytest.fixture
def emulated_graphs() -> Iterator[None]:
    """torch.cuda's graph API emulated on the CPU for the test (``engines.emulation``): graph
    code written for a GPU runs on CPU tensors with CUDA graphs' semantics."""
    from pytest_cudagraph.engines.emulation import emulated_graphs as emulated

    with emulated():
        yield


@pytest.fixture
def fault_injector() -> Iterator[FaultInjector]:
    """Make a named call raise on its N-th invocation; patches are undone at teardown."""
    from pytest_cudagraph.engines.faults import FaultInjector

    injector = FaultInjector()
    yield injector
    injector.restore()


@pytest.fixture
def cuda_timer(cuda_device: torch.device) -> Callable[[], float]:
    """A clock that synchronizes ``cuda_device`` before each reading (for benchmarks)."""
    from pytest_cudagraph import bench

    return bench.synchronizing_timer(cuda_device)


@pytest.fixture(autouse=True)
def _cudagraph_marker_fixtures(request: pytest.FixtureRequest) -> None:
    """Set up what this test's markers work through, before its body (so their skips apply)."""
    for feature in request.config.stash[FEATURE_OBJECTS]:
        mark = feature.mark_of(request.node)
        if mark is not None:
            feature.set_up(request, mark)


# The test run


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    test_report = yield
    if test_report.when == "call":
        report_sections = item.stash.get(SECTIONS, [])
        test_report.sections.extend(report_sections)
    if item.stash.get(USES_PLUGIN, False):
        setattr(test_report, records.USES_PLUGIN, True)
    return test_report


class _RecordGatherer:
    """Gathers the records from reports; in the xdist controller they come from workers
    (whose reports also tell the controller, which collects nothing, that a test used the
    plugin). Also notes what interrupted the session, for the results' session end."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._records = config.stash[RECORDS]
        self._used_by = config.stash[USED_BY]

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Ctrl-C, collection errors, and -x under xdist all end the session through here."""
        self._config.stash[INTERRUPTION] = str(excinfo.value) or excinfo.typename

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = records.records_from(report)
        self._records.extend(found)
        if any(record.kind == records.PHASE and record.value["uses_plugin"] for record in found):
            self._used_by.append(report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._records.extend(records.records_from(report))


# The session's start and end


def pytest_cudagraph_results_sections(config: pytest.Config) -> list[sections.Section]:
    """The markers' sections, in the order of ``FEATURES``."""
    found = (feature.section() for feature in config.stash[FEATURE_OBJECTS])
    return [section for section in found if section is not None]


def pytest_sessionstart(session: pytest.Session) -> None:
    """The sections the plugins declare, read once, every plugin configured; and a results
    file from an earlier run must not outlive this one, even if it dies."""
    try:
        session.config.stash[DECLARED] = results.declared_sections(session.config)
    except (TypeError, ValueError) as error:  # another plugin's section, refused before any test
        raise pytest.UsageError(str(error)) from None
    json_path = settings.snapshot(session.config)[settings.JSON]
    if json_path.value is None or hasattr(session.config, "workerinput"):
        return
    given = f"{json_path.source}={str(json_path.value)!r}"
    try:
        results.remove_earlier_results(json_path.value)
    except ValueError as error:  # something else came to be there since the path was checked
        raise pytest.UsageError(f"{given}: {error}") from None
    except OSError as error:
        raise pytest.UsageError(
            f"{given}: cannot remove the results of an earlier run: {error.strerror or error}"
        ) from None


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _cuda_initialized() and devices.nvml_status().available:
        check = _check_stray_contexts(config)
        if hasattr(config, "workeroutput"):  # an xdist worker: the controller reports it
            config.workeroutput[STRAY_CHECK_OUTPUT] = dataclasses.asdict(check)
        else:
            config.stash[STRAY_CHECKS].append(check)
    snapshot = settings.snapshot(config)
    strays = any(check.strays for check in config.stash[STRAY_CHECKS])
    fail = snapshot.value(settings.STRAY_CONTEXTS) == "fail"
    if strays and fail and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    json_path = snapshot.value(settings.JSON)
    if json_path is not None and not hasattr(config, "workerinput"):
        config.stash[JSON_OUTCOME] = _write_results(session, json_path)


def _write_results(session: pytest.Session, path: Path) -> str:
    """Write the results file; gives the terminal's line about it (a file that cannot be
    written is said there, never raised: the run's own outcome stands)."""
    config = session.config
    end = results.session_end(session.exitstatus, _stopped(session))
    recorded = config.stash[RECORDS]
    try:
        document = results.results_document(
            _sections(config),
            recorded,
            results.stack_facts(),
            session=end,
            commit=results.commit_of(config.rootpath),
        )
        results.write_json(path, document)
    except (OSError, ValueError) as error:  # a section that failed, a path now not ours
        return f"cudagraph results NOT written to {path}: {error}"
    partial = "" if end.complete else f" (partial: {end.stopped or end.exit})"
    return f"cudagraph results written to {path}{partial}"


def _stopped(session: pytest.Session) -> str | None:
    """What ended the session before it ran all it collected (-x, Ctrl-C, ...), if anything."""
    for reason in (
        session.shouldfail,
        session.shouldstop,
        session.config.stash.get(INTERRUPTION, ""),
    ):
        if reason:
            return reason if isinstance(reason, str) else "stopped early"
    return None


def _sections(config: pytest.Config) -> list[sections.Section]:
    """Every section of the session's results: each test's outcome, the declared ones (read
    when the session started), then the skips and the stray-context check."""
    mode = settings.snapshot(config).value(settings.STRAY_CONTEXTS)
    checks = config.stash[STRAY_CHECKS]
    strays = sections.Section(
        sections.STRAY_CONTEXTS,
        lambda found: [dataclasses.asdict(check) for check in checks],
        lambda data: sections.stray_lines(checks, mode),
    )
    return [sections.TESTS, *config.stash[DECLARED], sections.SKIPS, strays]


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

    def pytest_configure_node(self, node: Any) -> None:
        """A worker's records must carry this run's token for this controller to read them."""
        node.workerinput[RUN_TOKEN_INPUT] = records.run_token()

    def pytest_testnodedown(self, node: object, error: object) -> None:
        check = getattr(node, "workeroutput", {}).get(STRAY_CHECK_OUTPUT)
        if check is not None:
            self._checks.append(
                devices.StrayCheck(check["process"], check["note"], tuple(check["strays"]))
            )


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    used_by, stray_checks = config.stash[USED_BY], config.stash[STRAY_CHECKS]
    if not (used_by or stray_checks):
        return
    recorded = config.stash[RECORDS]
    lines = sections.summary_lines(_sections(config), recorded)
    if lines:
        terminalreporter.write_sep("=", "cudagraph")
        for line in lines:
            terminalreporter.write_line(line)
    if JSON_OUTCOME in config.stash:
        terminalreporter.write_line(config.stash[JSON_OUTCOME])
