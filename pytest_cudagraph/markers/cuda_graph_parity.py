"""cuda_graph_parity: the marker, the ``graph_parity`` fixture and the toggled run.

The comparison itself is the engine's (pytest_cudagraph.engines.parity). Every result a test's
checker produces is kept, so a failing check fails its test whatever the body did with the
error (caught it, retried, ran the check in a thread); a test carrying the marker must
compare something, and one that ends without a checked case fails, saying so.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudagraph import results, settings
from pytest_cudagraph.engines.parity import check_toggle
from pytest_cudagraph.markers import (
    MarkerFeature,
    add_report_section,
    body_with_fixtures,
    emulated_on_the_cpu,
)

if TYPE_CHECKING:
    import torch

    from pytest_cudagraph.engines.parity import ParityChecker, ParityResult

RESULTS = pytest.StashKey[list["ParityResult"]]()


@dataclass(frozen=True)
class ParityMark:
    """The marker's arguments; a seed of None means the configured one (--cudagraph-seed)."""

    toggle: str | None
    seed: int | None


def cuda_graph_parity(toggle: str | None = None, seed: int | None = None) -> ParityMark:
    """Compare a graphed callable with its eager twin (fixture graph_parity); with
    toggle=ENV_VAR, run the body with ENV_VAR=0 and =1 and compare what it records."""
    if toggle is not None:
        check_toggle(toggle)
    if seed is not None:
        settings.check_seed(seed)
    return ParityMark(toggle, seed)


def rerun_command(nodeid: str, seed: int, case: int | None) -> str:
    """The command that runs one case of a test again (the whole test for a toggled run)."""
    command = f"pytest {shlex.quote(nodeid)} {settings.SEED.option}={seed}"
    return command if case is None else f"{command} {settings.CASE.option}={case}"


class ParityMarker(MarkerFeature[ParityMark]):
    function = staticmethod(cuda_graph_parity)
    results_key = "parity"
    fixtures = ("graph_parity",)
    PARITY_CHECKER = pytest.StashKey["ParityChecker"]()

    def set_up(self, request: pytest.FixtureRequest, mark: ParityMark) -> None:
        """On a ``cuda_device`` that is the CPU, the test's graphs run emulated (before any
        other fixture of the test builds them)."""
        emulated_on_the_cpu(request, request.getfixturevalue("cuda_device"))
        super().set_up(request, mark)

    @pytest.fixture
    def graph_parity(
        self, request: pytest.FixtureRequest, cuda_device: torch.device
    ) -> ParityChecker:
        """Parity engine on ``cuda_device``; a failing check or toggled run fails the test."""
        from pytest_cudagraph.engines.parity import ParityChecker

        item = request.node
        mark = self.mark_of(item)
        seed = self.settings.value(settings.SEED, mark.seed if mark else None)
        seen = item.stash.setdefault(RESULTS, [])

        def fail_on_mismatch(result: ParityResult) -> None:
            seen.append(result)
            figures = {
                "form": result.form,
                "checked": result.checked,
                "passed": result.passed,
                "failures": [outcome.data() for outcome in result.failures],
            }
            results.record(item, "parity", figures)
            if not result.ok:
                add_report_section(item, "cudagraph parity", result.details())
                pytest.fail(result.reason(), pytrace=False)

        checker = ParityChecker(
            cuda_device,
            seed,
            fail_on_mismatch,
            only_case=self.settings.value(settings.CASE),
            rerun=lambda seed, case: rerun_command(item.nodeid, seed, case),
        )
        item.stash[self.PARITY_CHECKER] = checker
        return checker

    @pytest.hookimpl(tryfirst=True)  # the toggle form runs the body itself, twice
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        mark = self.mark_of(pyfuncitem)
        if mark is None or mark.toggle is None:
            return None
        pyfuncitem.stash[self.PARITY_CHECKER].run_toggled(
            body_with_fixtures(pyfuncitem), mark.toggle
        )
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        __tracebackhide__ = True  # a failure shows the test's frames, not the plugin's
        result = yield
        checker = item.stash.get(self.PARITY_CHECKER, None)
        seen = item.stash.get(RESULTS, [])
        if checker is not None and checker.running:
            pytest.fail(
                f"cuda_graph_parity on {item.nodeid}: a graph_parity check was still running "
                "when the test body returned (in a thread it did not wait for), so its verdict "
                "would be lost; wait for the check before the body returns",
                pytrace=False,
            )
        failed = [parity for parity in seen if not parity.ok]
        if failed:
            pytest.fail(
                f"cuda_graph_parity on {item.nodeid}: the body went on after a failing check "
                "(it caught the failure, retried, or ran the check in another thread), and a "
                f"failing check fails its test: {failed[0].reason()}",
                pytrace=False,
            )
        if self.mark_of(item) is not None and not sum(parity.checked for parity in seen):
            pytest.fail(
                f"cuda_graph_parity on {item.nodeid}: the test compared nothing; call "
                "graph_parity.check(eager, graphed, make_inputs) in its body, or give "
                "toggle=ENV_VAR and graph_parity.record() what each run computes",
                pytrace=False,
            )
        return result

    def section_data(self, records: Sequence[results.Record]) -> list[dict[str, Any]]:
        """Per test and form: the cases checked, those that matched and each failing case."""
        totals: dict[tuple[str, str], dict[str, Any]] = {}
        for record in records:
            if record.kind == "parity":
                value = record.value
                entry = totals.setdefault(
                    (record.nodeid, value["form"]),
                    {
                        "nodeid": record.nodeid,
                        "form": value["form"],
                        "checked": 0,
                        "passed": 0,
                        "failures": [],
                    },
                )
                entry["checked"] += value["checked"]
                entry["passed"] += value["passed"]
                entry["failures"] += value["failures"]
        return list(totals.values())

    def section_lines(self, data: list[dict[str, Any]]) -> list[str]:
        if not data:
            return []
        checked = sum(entry["checked"] for entry in data)
        passed = sum(entry["passed"] for entry in data)
        lines = [f"parity: {passed} of {checked} checked cases match"]
        for entry in data:
            unit = "cases" if entry["form"] == "cases" else "toggled run pairs"
            lines.append(
                f"  {entry['nodeid']}: {entry['passed']} of {entry['checked']} {unit} match"
            )
        return lines
