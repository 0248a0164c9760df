"""cuda_graph_parity: the marker, the ``graph_parity`` fixture and the toggled run.

The comparison itself is the engine's (pytest_cudagraph.engines.parity). A test carrying the marker
must compare something: one that ends without a checked case fails, saying so.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_cudagraph import results, settings
from pytest_cudagraph.markers import MarkerFeature, add_report_section, body_with_fixtures

if TYPE_CHECKING:
    import torch

    from pytest_cudagraph.engines.parity import ParityChecker, ParityResult

CHECKED = pytest.StashKey[int]()


@dataclass(frozen=True)
class ParityMark:
    """The marker's arguments; a seed of None means the configured one (--cudagraph-seed)."""

    toggle: str | None
    seed: int | None


def cuda_graph_parity(toggle: str | None = None, seed: int | None = None) -> ParityMark:
    """Compare a graphed callable with its eager twin (fixture graph_parity); with
    toggle=ENV_VAR, run the body with ENV_VAR=0 and =1 and compare what it records."""
    if toggle is not None and not (isinstance(toggle, str) and toggle.strip()):
        raise ValueError(f"toggle must name an environment variable, got {toggle!r}")
    if seed is not None:
        settings.check_seed(seed)
    return ParityMark(toggle, seed)


class ParityMarker(MarkerFeature):
    function = staticmethod(cuda_graph_parity)
    results_key = "parity"
    fixtures = ("graph_parity",)
    PARITY_CHECKER = pytest.StashKey["ParityChecker"]()

    def set_up(self, request: pytest.FixtureRequest, mark: object) -> None:
        request.node.stash[self.PARITY_CHECKER] = request.getfixturevalue("graph_parity")

    @pytest.fixture
    def graph_parity(
        self, request: pytest.FixtureRequest, cuda_device: torch.device
    ) -> ParityChecker:
        """Parity engine on ``cuda_device``; a failing check or toggled run fails the test."""
        from pytest_cudagraph.engines.parity import ParityChecker

        item = request.node
        mark = self.mark_of(item)
        seed = self.settings.value(settings.SEED, mark.seed if mark else None)

        def fail_on_mismatch(result: ParityResult) -> None:
            item.stash[CHECKED] = item.stash.get(CHECKED, 0) + result.checked
            counts = {"form": result.form, "checked": result.checked, "passed": result.passed}
            results.record(item, "parity", counts)
            if not result.ok:
                add_report_section(item, "cudagraph parity", result.details())
                pytest.fail(result.reason(), pytrace=False)

        return ParityChecker(cuda_device, seed, fail_on_mismatch)

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
        result = yield
        if self.mark_of(item) is not None and item.stash.get(CHECKED, 0) == 0:
            pytest.fail(
                f"cuda_graph_parity on {item.nodeid}: the test compared nothing; call "
                "graph_parity.check(eager, graphed, make_inputs) in its body, or give "
                "toggle=ENV_VAR and graph_parity.record() what each run computes",
                pytrace=False,
            )
        return result

    def section_data(self, records: Sequence[results.Record]) -> list[dict[str, object]]:
        """Per test and form: the cases checked and those that matched."""
        totals: dict[tuple[str, str], dict[str, object]] = {}
        for record in records:
            if record.kind == "parity":
                value = record.value
                entry = totals.setdefault(
                    (record.nodeid, value["form"]),
                    {"nodeid": record.nodeid, "form": value["form"], "checked": 0, "passed": 0},
                )
                entry["checked"] += value["checked"]
                entry["passed"] += value["passed"]
        return list(totals.values())

    def section_lines(self, data: object) -> list[str]:
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
