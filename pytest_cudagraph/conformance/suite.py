"""The conformance suite's pytest plugin (entry point ``pytest_cudagraph_conformance``): the
session's target, its factory loaded once, the ``conformance_target`` fixture, and the
conformance table.

The table has one row per check with its verdict, the seconds its body took and the figure
behind it, as text and as named numbers (``values``), or why it skipped or failed. Rows are
built from test reports, so under xdist they are built in the controller from what the workers
sent: the suite's conftest labels each check (a ``check`` record) and a check records its figure
with ``record_figure`` (a ``conformance`` record); both travel in ``user_properties``. A check
run twice keeps the verdict pytest would give it: once failed, failed. This plugin runs in every
session and imports torch only when the suite's target is built.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import pytest

from pytest_cudagraph import results, settings
from pytest_cudagraph.conformance import loading
from pytest_cudagraph.conformance.catalog import CHECKS_FOLDER

if TYPE_CHECKING:
    import torch

    from pytest_cudagraph.conformance.protocol import CudaGraphTarget

CHECK = "check"  # the record kind of a check's name, on each of its reports
FIGURE = "conformance"  # the record kind of a check's figure
ACCOUNT = "conformance account"  # the record kind of what the dry run says the run judged
TABLE = "conformance"  # the table's section name (its key in the JSON)
FAILED = ("FAILED", "ERROR")
TARGET_SPEC = pytest.StashKey[str | None]()
# The factory of the spec the session chose, loaded when the session was configured.
FACTORY = pytest.StashKey[loading.Factory]()
# The session's target rebuilt from the factory, after a check left it without its graphs.
REBUILT = pytest.StashKey["CudaGraphTarget"]()


def pytest_configure(config: pytest.Config) -> None:
    if settings.SNAPSHOT not in config.stash:  # the core plugin is disabled (-p no:...)
        return
    spec = settings.snapshot(config).value(settings.TARGET)
    # The target loaded now, so that a bad one is a usage error; none chosen is one only for a
    # run of the checks (collecting them needs no target, whatever is installed).
    if runs_the_suite(config) and (spec is not None or not config.option.collectonly):
        try:
            config.stash[FACTORY] = loading.load_factory(
                loading.resolve_spec(spec),
                search_paths=(config.rootpath, config.invocation_params.dir),
            )
        except loading.TargetError as error:
            raise pytest.UsageError(loading.explained(error, frames_asked(config))) from None
    config.stash[TARGET_SPEC] = spec
    table = ConformanceTable(spec)
    config.pluginmanager.register(table, "cudagraph-conformance-table")
    results.add_section(config, results.Section(TABLE, table.data, table.lines))


def runs_the_suite(config: pytest.Config) -> bool:
    """Whether the session's arguments name the suite's checks: its folder (or the plugin's
    package holding it), a check module, a check. Only such sessions load the target before
    the run; elsewhere a target that cannot be loaded errors only the tests that use it."""
    for argument in config.args:
        name = argument.partition("::")[0]
        path = config.invocation_params.dir / name
        if config.option.pyargs:
            path = _module_path(name) or path
        path, checks = path.resolve(), CHECKS_FOLDER.resolve()
        if path == checks.parent or path.is_relative_to(checks):
            return True
    return False


def _module_path(name: str) -> Path | None:
    """The file (a package: its folder) of the module ``name`` names, if it is one."""
    if not all(part.isidentifier() for part in name.split(".")):
        return None
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None:
        return None
    origin = Path(found.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def frames_asked(config: pytest.Config) -> str:
    """Which frames of an error in the user's code the session asked for: every frame
    (``--full-trace``), every frame from the user's first on (``--tb=long``, ``--tb=native``),
    else the user's own frames only."""
    if config.getoption("fulltrace"):
        return loading.ALL
    return (
        loading.FROM_YOURS if config.getoption("tbstyle") in ("long", "native") else loading.YOURS
    )


def chosen_target_spec(config: pytest.Config) -> str | None:
    """The target the session chose (``--cudagraph-target`` and its kin), or None for the
    default; resolved once, when the session was configured."""
    return config.stash[TARGET_SPEC]


@pytest.fixture(scope="session")
def conformance_target(request: pytest.FixtureRequest) -> CudaGraphTarget:
    """The conformance suite's target (``--cudagraph-target``), built once per session on
    ``cuda_device``, or on the CPU without CUDA (for the checks that need no GPU).

    A target that cannot be built (none chosen, a module that fails to import, a factory that
    raises, a malformed target) errors the test that asked for it, naming the spec and the
    problem, with the error's whole message and the frames of the user's code that raised it
    (every frame with ``--tb=long``, ``--tb=native`` or ``--full-trace``). In a session that
    runs the suite's checks the run stops there (under xdist, each worker's run), rather than
    failing every check with the same message; anywhere else only the tests that use the
    target error, and the rest of the session runs."""
    import torch

    config = request.config
    if torch.cuda.is_available():
        device = request.getfixturevalue("cuda_device")
    else:
        device = torch.device("cpu")
    try:
        return fresh_target(config, device)
    except loading.TargetError as error:
        problem = loading.explained(error, frames_asked(config))
    if any(item.path.parent == CHECKS_FOLDER for item in request.session.items):
        request.session.shouldfail = problem.splitlines()[0]
    pytest.fail(problem, pytrace=False)


def fresh_target(config: pytest.Config, device: torch.device) -> CudaGraphTarget:
    """A new target of the session's spec on ``device``, from the factory loaded once
    (TargetError naming the spec where it cannot be built)."""
    return loading.build_target(chosen_target_spec(config), device, config.stash.get(FACTORY, None))


def forget_last_failure() -> None:
    """Drop what pytest keeps of the last failure for post-mortem debugging (``sys.last_exc``,
    ``sys.last_value``, ``sys.last_traceback``, ``sys.last_type``). Its frames hold what the
    failed check built (a sampler's graphs and their memory) until the next test's body
    starts, which is after a memory check's baseline: a failure would be charged to the next
    check."""
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if hasattr(sys, name):
            delattr(sys, name)


class FigureRecorder(Protocol):
    """The ``record_figure`` fixture: ``record_figure(text, **values)``."""

    def __call__(self, figure: str, /, **values: float) -> None: ...


def record_figure(item: pytest.Item, figure: str, /, **values: float) -> None:
    """Record the figure behind a check's verdict: ``figure`` for people, ``values`` (finite
    numbers by name, e.g. ``peak_mib=350.0``) for scripts. A later call replaces it."""
    if not isinstance(figure, str):
        raise TypeError(f"record_figure: the figure must be text, got {figure!r}")
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"record_figure: {name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"record_figure: {name} must be finite, got {value!r}")
    results.record(item, FIGURE, {"figure": figure, "values": dict(values)})


class ErrorExplainer(Protocol):
    """The ``explain`` fixture: an error in the user's code as the session asked to see it
    (``loading.explained`` with the frames of ``frames_asked``)."""

    def __call__(self, error: BaseException, /) -> str: ...


class AccountRecorder(Protocol):
    """The ``record_account`` fixture: ``record_account(ran, gpu_skips)``."""

    def __call__(self, ran: Sequence[str], gpu_skips: Mapping[str, Sequence[str]], /) -> None: ...


class Account(TypedDict):
    """What the dry run says a run judged: which of the user's code ran (``draw``, ``key_of``,
    ``eager``, ``graphed``), and check -> what it needs that the target does not give."""

    ran: list[str]
    gpu_skips: dict[str, list[str]]


def record_account(
    item: pytest.Item, ran: Sequence[str], gpu_skips: Mapping[str, Sequence[str]], /
) -> None:
    """Record what a run could judge of the target, for the account a run without CUDA ends
    with (``Account``)."""
    gpu = {check: list(needs) for check, needs in gpu_skips.items()}
    results.record(item, ACCOUNT, Account(ran=list(ran), gpu_skips=gpu))


@dataclass
class CheckRow:
    check: str
    verdict: str = "not run"
    seconds: float | None = None
    figure: str = ""
    reason: str = ""
    values: dict[str, float] = field(default_factory=dict)

    def take(self, report: pytest.TestReport, figure: Mapping[str, Any] | None) -> None:
        """Fold in one report of the check. Once failed, a row stays as it failed (as pytest
        counts a failure of a test run twice); a pass outranks a skip."""
        if self.verdict in FAILED:
            return
        if figure is not None:
            self.figure, self.values = str(figure["figure"]), dict(figure["values"])
        if report.when == "call":
            self.seconds = report.duration
        if report.failed:
            self.verdict = "FAILED" if report.when == "call" else "ERROR"
            self.reason = results.failure_reason(report)
        elif report.skipped and self.verdict != "passed":
            self.verdict = "skipped"
            self.reason = results.reason_of(report)
        elif report.passed and report.when == "call":
            self.verdict, self.reason = "passed", ""


class ConformanceTable:
    """Collects the rows from reports (a pytest plugin object) and gives the table's data."""

    def __init__(self, target_spec: str | None) -> None:
        self.target_spec = target_spec
        self.rows: dict[str, CheckRow] = {}
        self.account: Account | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        recorded = dict(results.plugin_values(report.user_properties))
        name = recorded.get(CHECK)
        if name is None:
            return
        account = recorded.get(ACCOUNT)
        if isinstance(account, dict):
            self.account = Account(ran=account["ran"], gpu_skips=account["gpu_skips"])
        row = self.rows.setdefault(f"{report.location[0]}::{name}", CheckRow(str(name)))
        figure = recorded.get(FIGURE)
        row.take(report, figure if isinstance(figure, dict) else None)

    def target_name(self) -> str:
        """The target's name or spec, as the table and the JSON results show it."""
        return loading.describe_spec(self.target_spec)

    def data(self, records: object = None) -> dict[str, object] | None:
        """The table as plain data (None when no check ran in this session)."""
        if not self.rows:
            return None
        rows = [asdict(self.rows[key]) for key in sorted(self.rows)]
        account = {} if self.account is None else {"account": self.account}
        return {"target": self.target_name(), "rows": rows, **account}

    def lines(self, data: object) -> list[str]:
        if data is None:
            return []
        assert isinstance(data, Mapping)
        rows = [CheckRow(**row) for row in data["rows"]]
        counts = Counter(row.verdict.lower() for row in rows)  # pytest's words: failed, error
        tally = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
        from pytest_cudagraph.skips import NEEDS_CUDA  # imports torch, which the checks did

        without_cuda = [
            row for row in rows if row.verdict == "skipped" and row.reason == NEEDS_CUDA
        ]
        shown = [row for row in rows if row not in without_cuda]
        lines = [f"conformance of {data['target']} ({tally}):", *format_table(shown)]
        if without_cuda:
            lines += cpu_account(without_cuda, data.get("account"))
        return lines


def cpu_account(skipped: Sequence[CheckRow], account: Account | None) -> list[str]:
    """What a run without CUDA could not judge, in place of the rows of the checks that
    skipped for it (the results JSON keeps them): which of the user's code ran, which checks
    would still skip on a GPU and for want of what, and that no graph was judged."""
    names = ", ".join(row.check for row in skipped)
    lines = [
        f"  {len(skipped)} checks need CUDA and skipped ({skipped[0].reason}): {names}",
        "Without CUDA no graph was captured, replayed or judged: a green table here says only "
        "that the rows above passed.",
    ]
    if account is None:
        return [*lines, "The dry run did not run: none of your code was called."]
    ran = account["ran"]
    listed = ", ".join(ran[:-1]) + f" and {ran[-1]}" if len(ran) > 1 else ran[0]
    not_run = "" if "graphed" in ran else "; your graphed side did not run"
    lines.append(f"Of your code, {listed} ran (the dry run){not_run}.")
    gpu_skips = account["gpu_skips"]
    if not gpu_skips:
        return [*lines, "The target made for the CPU gives what every check needs."]
    needs = [f"{check} (needs {', '.join(missing)})" for check, missing in gpu_skips.items()]
    count = len(gpu_skips)
    return [
        *lines,
        f"On a GPU, {count} check{'s' if count > 1 else ''} would still skip unless the factory "
        f"gives there what the target made for the CPU lacks: {', '.join(needs)}.",
    ]


def format_table(rows: Sequence[CheckRow]) -> list[str]:
    """Aligned columns: check, verdict, seconds, then the figure or the reason in one line."""
    width = max(len("check"), *(len(row.check) for row in rows))
    lines = [f"  {'check':<{width}}  {'verdict':<7}  {'seconds':>7}  figure"]
    for row in rows:
        seconds = f"{row.seconds:7.1f}" if row.seconds is not None else f"{'-':>7}"
        detail = "; ".join(text for text in (row.figure, results.one_line(row.reason)) if text)
        lines.append(f"  {row.check:<{width}}  {row.verdict:<7}  {seconds}  {detail}")
    return lines
