"""graph_memory_bound: the marker, the ``device_memory`` fixture and the measured body.

Measuring and judging are the engine's (pytest_cudagraph.engines.memory); here the bound is read
(a number of MiB or a size such as "1.5GiB", else the session's ``--cudagraph-memory-bound``)
and the body is wrapped in the measurement.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudagraph import results, settings
from pytest_cudagraph.engines import devices
from pytest_cudagraph.markers import MarkerFeature, add_report_section

if TYPE_CHECKING:
    import torch

    from pytest_cudagraph.engines.memory import DeviceMemoryProbe, MemoryMeasurement


@dataclass(frozen=True)
class MemoryBound:
    """The marker's bound in MiB; None means the configured default (--cudagraph-memory-bound)."""

    mib: float | None


def graph_memory_bound(bound: float | str | None = None) -> MemoryBound:
    """Fail when this process's memory on the test's device (NVML) grows by more than bound
    across the test body: MiB, or a size such as "512MiB" or "1.5GiB"."""
    if bound is None:
        return MemoryBound(None)
    try:
        return MemoryBound(settings.parse_mib(bound))
    except ValueError as error:
        raise ValueError(f"bound {error}") from None
    except OverflowError:  # an integer past what a float holds
        raise ValueError("bound must be a positive size, got an integer past 1.8e308") from None


class MemoryBoundMarker(MarkerFeature[MemoryBound]):
    function = staticmethod(graph_memory_bound)
    results_key = "memory"
    fixtures = ("device_memory",)
    PROBE = pytest.StashKey["DeviceMemoryProbe"]()

    def complete(self, mark: MemoryBound) -> MemoryBound:
        if mark.mib is not None:
            return mark
        default = self.settings.value(settings.MEMORY_BOUND)
        if default is None:
            raise ValueError(f"needs a bound, or a default from {settings.MEMORY_BOUND.option}")
        return MemoryBound(default)

    def set_up(self, request: pytest.FixtureRequest, mark: MemoryBound) -> None:
        request.node.stash[self.PROBE] = request.getfixturevalue("device_memory")

    @pytest.fixture
    def device_memory(self, cuda_device: torch.device) -> DeviceMemoryProbe:
        """NVML probe of this process's memory on ``cuda_device``; skips where NVML cannot tell."""
        from pytest_cudagraph.engines.memory import DeviceMemoryProbe, ProcessNotListed

        nvml = devices.nvml_status()
        if not nvml.available:
            pytest.skip(f"needs NVML: {nvml.detail}")
        try:
            probe = DeviceMemoryProbe(cuda_device)
            probe.release_freed()  # makes sure this process has a context on the device
            probe.process_bytes()
        except (LookupError, ProcessNotListed) as error:
            pytest.skip(str(error))
        return probe

    # Outermost of the markers' wrappers, so the settling synchronize stays outside sync
    # debug mode (no_host_sync).
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        __tracebackhide__ = True  # a failure shows the test's frames, not the plugin's
        mark = self.mark_of(item)
        if mark is None:
            return (yield)
        assert mark.mib is not None  # complete() gave every collected mark its bound
        with item.stash[self.PROBE].measure() as measurement:
            result = yield
        self._judge(item, measurement, mark.mib)
        return result

    def _judge(self, item: pytest.Item, measurement: MemoryMeasurement, bound_mib: float) -> None:
        verdict = measurement.judge(bound_mib)  # before reading the report: it may retake
        measured = measurement.report
        assert measured is not None  # judge() raised otherwise
        figures = {
            **measured.figures(),
            "bound_mib": bound_mib,
            "passed": verdict.passed,
            "warning": verdict.warning,
        }
        results.record(item, "memory", figures)
        section = f"bound: {bound_mib:g} MiB of growth; {measured.section()}"
        if verdict.warning:
            section += f"\nwarning: {verdict.warning}"
            item.warn(pytest.PytestWarning(verdict.warning))
        add_report_section(item, "cudagraph memory", section)
        if not verdict.passed:
            pytest.fail(verdict.reason, pytrace=False)

    def section_data(self, records: Sequence[results.Record]) -> list[dict[str, Any]]:
        """Each measured test's figures."""
        found = [{"nodeid": r.nodeid, **r.value} for r in records if r.kind == "memory"]
        return found

    def section_lines(self, data: list[dict[str, Any]]) -> list[str]:
        if not data:
            return []
        lines = ["memory growth across the test body (NVML, this process):"]
        for figures in data:
            verdict = "ok" if figures["passed"] else "OVER"
            lines.append(
                f"  {figures['nodeid']} on {figures['device']}: {figures['growth_mib']:+.1f} MiB "
                f"of {figures['bound_mib']:g} MiB bound {verdict}; "
                f"peak {figures['peak_growth_mib']:+.1f} MiB; "
                f"torch reserved {figures['torch_reserved_growth_mib']:+.1f} MiB, "
                f"outside torch {figures['outside_torch_growth_mib']:+.1f} MiB"
            )
            if figures.get("warning"):
                lines.append(f"    warning: {figures['warning']}")
        return lines
