"""The conformance suite's pytest plugin (entry point ``pytest_cudagraph_conformance``): the
session's target, its factory loaded once, the ``conformance_target`` fixture, and the
conformance table.

The table has one row per check with its verdict, the seconds its body took and the figure
behind it, as text and as named numbers (``values``), or why it skipped or failed. Rows are
built from test reports, so under xdist they are built in the controller from what the workers
sent: the suite's conftest labels each check (a ``check`` record) and a check records its figure
with ``record_figure`` (a ``conformance`` record); both travel in ``user_properties``. A check
run twice keeps the verdict pytest would give it: once failed, failed; but the runs that
``--cudagraph-repeat N`` asks for (each labelled with its ``repeat``) are kept apart, and a check
that passed in one and failed in another is flaky. This plugin runs in every session and imports
torch only when the suite's target is built.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import pytest

from pytest_cudagraph import results, settings
from pytest_cudagraph.conformance import _loading
from pytest_cudagraph.conformance._catalog import CHECKS_FOLDER, MARK
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import liveness_tracked

if TYPE_CHECKING:
    import torch

    from pytest_cudagraph.conformance._protocol import CudaGraphTarget

CHECK = "check"  # the record kind of a check's name, on each of its reports
FIGURE = "conformance"  # the record kind of a check's figure
ACCOUNT = "conformance account"  # the record kind of what the dry run says the run judged
TABLE = "conformance"  # the table's section name (its key in the JSON)
FAILED = ("FAILED", "ERROR")
PASSED = "passed"
FLAKY = "flaky"  # the verdict of a check whose repeats passed and failed
REPEAT = "repeat"  # the record kind of which of its repeats (from 1) a check's run is
TARGET_SPEC = pytest.StashKey[str | None]()
# The factory of the spec the session chose, loaded when the session was configured.
FACTORY = pytest.StashKey[_loading.Factory]()
# The session's target rebuilt from the factory, after a check left it without its graphs.
REBUILT = pytest.StashKey["CudaGraphTarget"]()
EMULATED = "emulated"  # the record kind on a check judged on emulated graphs
# Whether the session's checks judge graphs emulated on the CPU (``graphs_emulated``).
EMULATING = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}(declaration): a conformance check's declaration (its @check(...))"
    )
    if settings.SNAPSHOT not in config.stash:  # the core plugin is disabled (-p no:...)
        return
    spec = settings.snapshot(config).value(settings.TARGET)
    # The target loaded now, so that a bad one is a usage error; none chosen is one only for a
    # run of the checks (collecting them needs no target, whatever is installed).
    if runs_the_suite(config) and (spec is not None or not config.option.collectonly):
        try:
            config.stash[FACTORY] = _loading.load_factory(
                _loading.resolve_spec(spec),
                search_paths=(config.rootpath, config.invocation_params.dir),
            )
        except _loading.TargetError as error:
            raise pytest.UsageError(_loading.explained(error, frames_asked(config))) from None
    config.stash[TARGET_SPEC] = spec
    table = ConformanceTable(spec, settings.snapshot(config).value(settings.REPEAT))
    config.pluginmanager.register(table, "cudagraph-conformance-table")


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
        return _loading.ALL
    return (
        _loading.FROM_YOURS if config.getoption("tbstyle") in ("long", "native") else _loading.YOURS
    )


def graphs_emulated(config: pytest.Config) -> bool:
    """Whether this session's checks judge CUDA graphs emulated on the CPU: asked for
    (``--cudagraph-emulate on``), or a run of the suite on a host without CUDA (``auto``, the
    default). Decided once per session."""
    if EMULATING not in config.stash:
        chosen = settings.snapshot(config).value(settings.EMULATE)
        if chosen == "auto" and runs_the_suite(config):
            import torch

            config.stash[EMULATING] = not torch.cuda.is_available()
        else:
            config.stash[EMULATING] = chosen == "on"
    return config.stash[EMULATING]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """For a run of the suite: where its graphs are judged, and a protection torch lacks."""
    if not runs_the_suite(config):
        return []
    if graphs_emulated(config):
        return [
            "conformance: CUDA graphs emulated on the CPU "
            f"({settings.EMULATE.option} {settings.snapshot(config).value(settings.EMULATE)}): "
            "the checks that judge graphs run on them (their rows marked *), those that need a "
            "GPU itself skip"
        ]
    import torch

    if torch.cuda.is_available() and not liveness_tracked(torch.cuda.CUDAGraph.capture_begin, None):
        return [
            f"conformance: torch {torch.__version__} has no input-liveness check of CUDA graph "
            "captures (torch 2.13 and later): a graph's freed inputs are found by the suite's "
            "recorder alone, after the call that freed them"
        ]
    return []


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

    from pytest_cudagraph.conformance._adapters import release_compiled_targets
    from pytest_cudagraph.engines.emulation import emulated_graphs

    config = request.config
    # At the session's end, after the target is dropped: compiled targets' graphs let go.
    request.addfinalizer(release_compiled_targets)
    emulated = graphs_emulated(config)
    if torch.cuda.is_available() and not emulated:
        device = request.getfixturevalue("cuda_device")
    else:
        device = torch.device("cpu")
    if emulated:  # for the whole session: the factory builds graphs, the checks replay them
        scope = emulated_graphs()
        scope.__enter__()
        request.addfinalizer(lambda: scope.__exit__(None, None, None))
    try:
        return fresh_target(config, device)
    except _loading.TargetError as error:
        problem = _loading.explained(error, frames_asked(config))
    if any(item.path.parent == CHECKS_FOLDER for item in request.session.items):
        request.session.shouldfail = problem.splitlines()[0]
    pytest.fail(problem, pytrace=False)


def fresh_target(config: pytest.Config, device: torch.device) -> CudaGraphTarget:
    """A new target of the session's spec on ``device``, from the factory loaded once
    (TargetError naming the spec where it cannot be built)."""
    return _loading.build_target(
        chosen_target_spec(config), device, config.stash.get(FACTORY, None)
    )


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


class Conclude:
    """``conclude(judgement, headline, also="")``, how a check ends: its figure recorded (its
    judgement's, then ``also``), then it fails with ``headline`` and its problems where it found
    some, or as not exercised where it judged nothing (``Judgement.failure``)."""

    def __init__(self, item: pytest.Item) -> None:
        self.item = item

    def __call__(self, judgement: Judgement, headline: str, also: str = "") -> None:
        figure = "; ".join(part for part in (judgement.figure, also) if part)
        record_figure(self.item, figure, **judgement.values)
        failure = replace(judgement, figure=figure).failure(headline)
        if failure is not None:
            pytest.fail(failure, pytrace=False)


class ErrorExplainer(Protocol):
    """The ``explain`` fixture: an error in the user's code as the session asked to see it
    (``loading.explained`` with the frames of ``frames_asked``)."""

    def __call__(self, error: BaseException, /) -> str: ...


class AccountRecorder(Protocol):
    """The ``record_account`` fixture: ``record_account(ran, gpu_skips, could_not)``."""

    def __call__(
        self,
        ran: Sequence[str],
        gpu_skips: Mapping[str, Sequence[str]],
        could_not: Sequence[str] = (),
        /,
    ) -> None: ...


class Account(TypedDict):
    """What the dry run says a run judged: which of the user's code ran (``draw``, ``key_of``,
    ``eager``, ``graphed``, each capability's callables by field), which could not run without
    CUDA, and check -> what it needs that the target does not give."""

    ran: list[str]
    could_not: list[str]
    gpu_skips: dict[str, list[str]]


def record_account(
    item: pytest.Item,
    ran: Sequence[str],
    gpu_skips: Mapping[str, Sequence[str]],
    could_not: Sequence[str] = (),
    /,
) -> None:
    """Record what a run could judge of the target, for the account a run without CUDA ends
    with (``Account``)."""
    gpu = {check: list(needs) for check, needs in gpu_skips.items()}
    account = Account(ran=list(ran), could_not=list(could_not), gpu_skips=gpu)
    results.record(item, ACCOUNT, account)


@dataclass
class CheckRow:
    check: str
    verdict: str = "not run"
    seconds: float | None = None
    figure: str = ""
    reason: str = ""
    values: dict[str, float] = field(default_factory=dict)
    emulated: bool = False  # judged on CUDA graphs emulated on the CPU
    # Only with --cudagraph-repeat N > 1: N, and each repeat's run (``RepeatRun``), in order.
    repeats: int | None = None
    runs: list[RepeatRun] | None = None

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


class RepeatRun(TypedDict):
    """One repeat of a check (``--cudagraph-repeat``): which (from 1), and its own verdict,
    seconds, figure, values and reason, as a row of a check run once has them."""

    repeat: int
    verdict: str
    seconds: float | None
    figure: str
    values: dict[str, float]
    reason: str


def repeat_run(repeat: int, row: CheckRow) -> RepeatRun:
    return RepeatRun(
        repeat=repeat,
        verdict=row.verdict,
        seconds=row.seconds,
        figure=row.figure,
        values=dict(row.values),
        reason=row.reason,
    )


def merged_row(check: str, runs: Mapping[int, CheckRow], repeats: int) -> CheckRow:
    """One row of a check run ``repeats`` times, from each repeat's own row (by repeat): flaky
    where one repeat passed and another failed (or errored), with the first failing repeat's
    figure, values and seconds and a reason naming both runs; else the verdict the repeats share
    as a check run twice has it (a failure stands, a pass outranks a skip), from the first
    repeat that gave it. Each repeat's run is kept (``runs``)."""
    ordered = sorted(runs.items())
    failed = [(n, run) for n, run in ordered if run.verdict in FAILED]
    passed = [(n, run) for n, run in ordered if run.verdict == PASSED]
    skipped = [(n, run) for n, run in ordered if run.verdict == "skipped"]
    _, shown = (failed or passed or skipped or ordered)[0]
    row = replace(
        shown,
        check=check,
        values=dict(shown.values),
        emulated=any(run.emulated for _, run in ordered),
        repeats=repeats,
        runs=[repeat_run(n, run) for n, run in ordered],
    )
    if failed and passed:
        row.verdict, row.reason = FLAKY, flaky_reason(row)
    return row


def flaky_reason(row: CheckRow) -> str:
    """Why ``row`` is flaky, whole: each verdict and the repeats that gave it, then the first
    failing repeat's figure and reason and the first passing repeat's figure."""
    runs = row.runs or []
    fail = next(run for run in runs if run["verdict"] in FAILED)
    success = next(run for run in runs if run["verdict"] == PASSED)
    return "\n".join(
        [
            f"flaky: {verdicts_by_repeat(runs, row.repeats)}",
            run_said(fail, fail["figure"], fail["reason"]),
            run_said(success, success["figure"]),
        ]
    )


def run_said(run: RepeatRun, *texts: str) -> str:
    """The run's repeat and verdict, then ``texts`` joined by "; " where any is given
    ("repeat 2 FAILED: 1 of 3 modes refused")."""
    said = "; ".join(text for text in texts if text)
    return f"repeat {run['repeat']} {run['verdict']}" + (f": {said}" if said else "")


def verdicts_by_repeat(runs: Sequence[RepeatRun], repeats: int | None) -> str:
    """Each verdict and the repeats that gave it ("FAILED in repeat 2, passed in repeats 1 and
    3 of 3")."""
    numbers: dict[str, list[str]] = {}
    for run in runs:
        numbers.setdefault(run["verdict"], []).append(str(run["repeat"]))
    said = []
    for verdict, which in numbers.items():
        listed = f"{', '.join(which[:-1])} and {which[-1]}" if len(which) > 1 else which[0]
        said.append(f"{verdict} in repeat{'s' if len(which) > 1 else ''} {listed}")
    return ", ".join(said) + f" of {repeats if repeats is not None else len(runs)}"


def row_data(row: CheckRow) -> dict[str, object]:
    """A row as plain data: a check run once has no ``repeats`` and ``runs``."""
    data = asdict(row)
    if row.repeats is None:
        del data["repeats"], data["runs"]
    return data


class ConformanceTable:
    """Collects the rows from reports (a pytest plugin object) and gives the table's data."""

    def __init__(self, target_spec: str | None, repeats: int = 1) -> None:
        self.target_spec = target_spec
        self.repeats = repeats  # --cudagraph-repeat
        self.rows: dict[str, CheckRow] = {}
        # Each repeated check's runs by repeat (from 1), under its row's key.
        self.runs: dict[str, dict[int, CheckRow]] = {}
        self.account: Account | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        recorded = dict(results.plugin_values(report.user_properties))
        name = recorded.get(CHECK)
        if name is None:
            return
        account = recorded.get(ACCOUNT)
        if isinstance(account, dict):
            self.account = Account(
                ran=account["ran"],
                could_not=account.get("could_not", []),
                gpu_skips=account["gpu_skips"],
            )
        key = f"{report.location[0]}::{name}"
        row = self.rows.setdefault(key, CheckRow(str(name)))
        repeat = recorded.get(REPEAT)
        if isinstance(repeat, int) and not isinstance(repeat, bool):
            # One of the repeats --cudagraph-repeat asks for: folded into that repeat's run.
            row = self.runs.setdefault(key, {}).setdefault(repeat, CheckRow(str(name)))
        # Judged on emulated graphs: its call ran there (a skip judged nothing).
        judged = report.when == "call" and not report.skipped
        row.emulated = row.emulated or (judged and recorded.get(EMULATED) is True)
        figure = recorded.get(FIGURE)
        row.take(report, figure if isinstance(figure, dict) else None)

    def pytest_cudagraph_results_sections(self) -> list[results.Section]:
        """The conformance table, the suite's one section of the results."""
        return [results.Section(TABLE, self.data, self.lines)]

    def target_name(self) -> str:
        """The target's name or spec, as the table and the JSON results show it."""
        return _loading.describe_spec(self.target_spec)

    def data(self, records: object = None) -> dict[str, object] | None:
        """The table as plain data (None when no check ran in this session)."""
        if not self.rows:
            return None
        rows = [row_data(self.row(key)) for key in sorted(self.rows)]
        account = {} if self.account is None else {"account": self.account}
        repeats = {"repeats": self.repeats} if self.repeats > 1 else {}
        return {"target": self.target_name(), **repeats, "rows": rows, **account}

    def row(self, key: str) -> CheckRow:
        """The row under ``key``: a repeated check's merged from its runs (``merged_row``)."""
        runs = self.runs.get(key)
        if not runs:
            return self.rows[key]
        return merged_row(self.rows[key].check, runs, max(self.repeats, *runs))

    def flaky(self) -> list[CheckRow]:
        """The rows whose repeats passed and failed."""
        rows = (self.row(key) for key in sorted(self.runs))
        return [row for row in rows if row.verdict == FLAKY]

    @pytest.hookimpl(tryfirst=True)  # before the results file is written with the status
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A flaky row never passes as green: the run fails (pytest failed it already, as one
        repeat failed; this holds where a plugin turned that failure into another outcome)."""
        if self.flaky() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """pytest's closing line counts the flaky rows too ("1 failed, 5 passed, 1 flaky")."""
        flaky = self.flaky()
        if flaky:
            terminalreporter.stats.setdefault(FLAKY, []).extend(flaky)

    def lines(self, data: object) -> list[str]:
        if data is None:
            return []
        assert isinstance(data, Mapping)
        rows = [CheckRow(**row) for row in data["rows"]]
        counts = Counter(row.verdict.lower() for row in rows)  # pytest's words: failed, error
        tally = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
        if data.get("repeats"):
            tally += f"; each check run {data['repeats']} times"
        from pytest_cudagraph.skips import NEEDS_CUDA  # imports torch, which the checks did

        without_cuda = [
            row for row in rows if row.verdict == "skipped" and row.reason == NEEDS_CUDA
        ]
        shown = [row for row in rows if row not in without_cuda]
        # Every row may be a check that needs CUDA (``-k parity`` without it): no table then.
        table = format_table(shown) if shown else []
        lines = [f"conformance of {data['target']} ({tally}):", *table]
        emulated = [row for row in shown if row.emulated]
        if emulated:
            lines.append(
                f"  * {len(emulated)} rows judged on CUDA graphs emulated on the CPU: what a GPU "
                "adds (streams, the allocator's reuse of a pool, other threads during a capture) "
                "is judged only on one"
            )
        if without_cuda:
            lines += cpu_account(without_cuda, data.get("account"), bool(emulated))
        return lines


def cpu_account(
    skipped: Sequence[CheckRow], account: Account | None, emulated: bool = False
) -> list[str]:
    """What a run without CUDA could not judge, in place of the rows of the checks that
    skipped for it (the results JSON keeps them): which of the user's code ran, which checks
    would still skip on a GPU and for want of what, and what was judged of its graphs (on
    emulated graphs, or nothing)."""
    names = ", ".join(row.check for row in skipped)
    checks = f"{len(skipped)} checks need" if len(skipped) > 1 else "1 check needs"
    judged = (
        "Without CUDA the rows marked * judged your graphs emulated on the CPU; the checks "
        "above that need a GPU itself judge them only on one."
        if emulated
        else "Without CUDA no graph was captured, replayed or judged: a green table here says "
        "only that the rows above passed."
    )
    lines = [f"  {checks} CUDA and skipped ({skipped[0].reason}): {names}", judged]
    if account is None:
        return [*lines, "The dry run did not run: none of your code was called."]
    ran = account["ran"]
    listed = ", ".join(ran[:-1]) + f" and {ran[-1]}" if len(ran) > 1 else ran[0]
    not_run = "" if "graphed" in ran else "; your graphed side did not run"
    lines.append(f"Of your code, {listed} ran (the dry run){not_run}.")
    if account.get("could_not"):
        lines.append(f"Without CUDA, {', '.join(account['could_not'])} could not run.")
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
    width = max([len("check"), *(len(row.check) for row in rows)])
    lines = [f"  {'check':<{width}}  {'verdict':<7}  {'seconds':>7}  figure"]
    for row in rows:
        seconds = f"{row.seconds:7.1f}" if row.seconds is not None else f"{'-':>7}"
        detail = "; ".join(text for text in (row.figure, results.one_line(row.reason)) if text)
        if row.verdict == FLAKY and row.runs:
            detail = flaky_detail(row.runs, row.repeats)
        verdict = row.verdict + ("*" if row.emulated else "")
        lines.append(f"  {row.check:<{width}}  {verdict:<7}  {seconds}  {detail}")
    return lines


def flaky_detail(runs: Sequence[RepeatRun], repeats: int | None) -> str:
    """A flaky row's figure column, both messages in one line: which repeats gave which
    verdict, then the first failing repeat's figure and reason, then the first passing
    repeat's figure."""
    fail = next(run for run in runs if run["verdict"] in FAILED)
    success = next(run for run in runs if run["verdict"] == PASSED)
    failing = run_said(fail, fail["figure"], results.one_line(fail["reason"]))
    passing = run_said(success, success["figure"])
    return f"{verdicts_by_repeat(runs, repeats)}: {failing} | {passing}"
