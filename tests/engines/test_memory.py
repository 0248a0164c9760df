"""The memory engine's measurement on a simulated device: warm-up before the baseline makes
the growth the same whatever ran before, readings wait for NVML to hold still, and a reading
that collected only the block's garbage is taken again, fully, before it can fail a bound."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_cudagraph.engines.devices import nvml_status
from pytest_cudagraph.engines.memory import (
    DeviceMemoryProbe,
    MemoryMeasurement,
    MemoryReport,
    MemorySample,
    judge_growth,
    stable_reading,
)
from pytest_cudagraph.engines.units import MiB

CONTEXT, FIRST_USE, GRAPHS, OLD_CYCLE = 500 * MiB, 200 * MiB, 300 * MiB, 100 * MiB


class SimulatedProcess(DeviceMemoryProbe):
    """A process's device memory as NVML would report it, with a workload whose first run
    also pays one-off costs (library handles, lazily loaded kernels) that are never freed.

    ``drop_old_cycle()`` frees a reference cycle of objects alive at the baseline that holds
    device memory: only a full collection gives that memory back. The collections are
    simulated and recorded."""

    def __init__(self) -> None:  # no GPU here: nothing of the real probe is set up
        self.device = "cuda:0"
        self._interval_s = 0.001
        self.used = CONTEXT
        self.first_use_paid = False
        self.graphs: list[int] = []
        self.dead_old_cycles = 0
        self.collections: list[str] = []

    def settle(self, *, full_collection: bool = True) -> None:
        self.collections.append("full" if full_collection else "young")
        if full_collection:
            self.used -= self.dead_old_cycles
            self.dead_old_cycles = 0

    def process_bytes(self) -> int:
        return self.used

    def allocator_bytes(self) -> tuple[int, int]:
        return 0, sum(self.graphs)

    def build_graphs(self) -> None:
        if not self.first_use_paid:
            self.used += FIRST_USE
            self.first_use_paid = True
        self.graphs.append(GRAPHS)
        self.used += GRAPHS

    def drop_graphs(self) -> None:
        self.used -= sum(self.graphs)
        self.graphs.clear()

    def warm_up(self) -> None:
        self.build_graphs()
        self.drop_graphs()

    def hold_old_cycle(self) -> None:
        self.used += OLD_CYCLE

    def drop_old_cycle(self) -> None:
        self.dead_old_cycles += OLD_CYCLE


def growth_mib(process: SimulatedProcess, warmup: bool) -> tuple[float, float | None]:
    with process.measure(process.warm_up if warmup else None) as measurement:
        process.build_graphs()
    report = measurement.report
    first_use = None if report.first_use_bytes is None else report.first_use_bytes / MiB
    return report.growth / MiB, first_use


def test_warm_up_makes_the_growth_independent_of_what_ran_before() -> None:
    alone = SimulatedProcess()
    after_other_work = SimulatedProcess()
    after_other_work.warm_up()
    assert growth_mib(alone, warmup=True) == (300.0, 200.0)
    assert growth_mib(after_other_work, warmup=True) == (300.0, 0.0)


def test_without_warm_up_first_use_is_charged_to_whoever_comes_first() -> None:
    alone = SimulatedProcess()
    after_other_work = SimulatedProcess()
    after_other_work.warm_up()
    assert growth_mib(alone, warmup=False) == (500.0, None)
    assert growth_mib(after_other_work, warmup=False) == (300.0, None)


def test_every_reading_is_settled_and_the_warm_up_shows_in_the_section() -> None:
    process = SimulatedProcess()
    with process.measure(process.warm_up) as measurement:
        process.build_graphs()
    # Before the warm-up, the baseline, and after the block with its garbage only.
    assert process.collections == ["full", "full", "young"]
    assert measurement.report.section().splitlines()[-1] == (
        "warm-up before the baseline (first use, not judged): +200.0 MiB"
    )
    assert measurement.report.figures()["first_use_mib"] == 200.0


def measured_dropping_an_old_cycle(process: SimulatedProcess) -> MemoryMeasurement:
    """The block builds graphs (+300 MiB) and drops a cycle alive at the baseline (-100 MiB
    once collected): +200 MiB exactly, +300 MiB to a young reading."""
    process.hold_old_cycle()
    with process.measure(process.warm_up) as measurement:
        process.build_graphs()
        process.drop_old_cycle()
    return measurement


def test_a_young_reading_over_the_bound_is_retaken_and_judged_on_the_full_one() -> None:
    process = SimulatedProcess()
    measurement = measured_dropping_an_old_cycle(process)
    assert measurement.report.growth == 300 * MiB
    verdict = measurement.judge(bound_mib=250)
    assert process.collections == ["full", "full", "young", "full"]
    assert verdict.passed
    assert "grew by 200.0 MiB, within the 250 MiB bound" in verdict.reason
    report = measurement.report
    assert report.after.full_collection and report.growth == 200 * MiB
    assert report.young_after.process_bytes == 1100 * MiB
    assert report.section().splitlines()[-2] == (
        "after: taken again with a full garbage collection, as collecting the block's "
        "garbage only read 1100.0 MiB, over the bound"
    )


def test_a_retaken_reading_still_over_the_bound_fails_on_its_own_figure() -> None:
    process = SimulatedProcess()
    measurement = measured_dropping_an_old_cycle(process)
    verdict = measurement.judge(bound_mib=150)
    assert process.collections == ["full", "full", "young", "full"]
    assert not verdict.passed
    assert "grew by 200.0 MiB, over the 150 MiB bound" in verdict.reason


def test_a_young_reading_within_the_bound_is_not_retaken() -> None:
    process = SimulatedProcess()
    measurement = measured_dropping_an_old_cycle(process)
    verdict = measurement.judge(bound_mib=300)
    assert process.collections == ["full", "full", "young"]
    assert verdict.passed
    assert "grew by 300.0 MiB, within the 300 MiB bound" in verdict.reason
    report = measurement.report
    assert not report.after.full_collection and report.young_after is None
    assert report.section().splitlines()[-2] == (
        "after: garbage collected among the block's objects only, so the figure may be above "
        "a full collection's, never below"
    )


def test_judge_needs_the_block_to_have_ended() -> None:
    process = SimulatedProcess()
    with process.measure() as measurement:
        with pytest.raises(RuntimeError, match="the measured block has not ended normally"):
            measurement.judge(bound_mib=1)


def test_sample_within_retakes_only_a_young_reading_over_its_limit() -> None:
    process = SimulatedProcess()
    process.hold_old_cycle()
    process.drop_old_cycle()
    kept = process.sample_within(limit_bytes=CONTEXT + OLD_CYCLE)
    assert (kept.process_bytes, kept.full_collection) == (CONTEXT + OLD_CYCLE, False)
    assert process.collections == ["young"]
    retaken = process.sample_within(limit_bytes=CONTEXT)
    assert (retaken.process_bytes, retaken.full_collection) == (CONTEXT, True)
    assert process.collections == ["young", "young", "full"]
    with pytest.raises(TypeError, match="limit_bytes must be a number of bytes, got '1GiB'"):
        process.sample_within("1GiB")  # type: ignore[arg-type]


def test_warmup_must_be_callable() -> None:
    with pytest.raises(TypeError, match="warmup must be a callable or None"):
        with SimulatedProcess().measure(warmup="yes"):  # type: ignore[arg-type]
            pass


def test_a_reading_waits_until_nvml_holds_still() -> None:
    readings = iter([900, 700, 650, 650, 1])
    assert stable_reading(lambda: next(readings)) == 650
    assert next(readings) == 1  # no reads past the first repeat


def test_a_reading_that_never_holds_still_stops_after_the_limit() -> None:
    readings = iter(range(100))
    assert stable_reading(lambda: next(readings), reads=4) == 3
    with pytest.raises(ValueError, match="reads must be an integer >= 2"):
        stable_reading(lambda: 0, reads=1)


def test_sample_uses_the_settled_stable_reading() -> None:
    process = SimulatedProcess()
    process.graphs = [64 * MiB]
    assert process.sample() == MemorySample(CONTEXT, 0, 64 * MiB, full_collection=True)
    assert process.collections == ["full"]


def test_allocator_growth_the_process_does_not_show_only_warns() -> None:
    before = MemorySample(600 * MiB, 10 * MiB, 400 * MiB)
    after = MemorySample(604 * MiB, 300 * MiB, 400 * MiB)
    verdict = judge_growth(MemoryReport("cuda:0", before, after, 610 * MiB), bound_mib=64)
    assert verdict.passed
    assert verdict.warning == (
        "graph_memory_bound: torch's live tensors on cuda:0 grew by 290.0 MiB, over the 64 MiB "
        "bound, in memory the allocator already held; the process grew only by 4.0 MiB"
    )
    over = judge_growth(MemoryReport("cuda:0", before, after, 610 * MiB), bound_mib=2)
    assert not over.passed and over.warning == ""


def test_a_probe_without_nvml_is_a_lookup_error_naming_nvml() -> None:
    if nvml_status().available:
        pytest.skip("checks the path without NVML: NVML answers here")
    with pytest.raises(LookupError, match=r"NVML is unavailable: "):
        DeviceMemoryProbe(torch.device("cuda", 0))


def two_readings(growth_mib: float) -> MemoryReport:
    before = MemorySample(600 * MiB, 64 * MiB, 128 * MiB)
    after = MemorySample(600 * MiB + int(growth_mib * MiB), 64 * MiB, 128 * MiB)
    return MemoryReport("cuda:0", before, after, after.process_bytes)


@pytest.mark.parametrize(
    ("bound", "error", "message"),
    [
        (
            "16MiB",
            TypeError,
            r"bound_mib must be a number of MiB, got '16MiB' \(a size with a unit",
        ),
        (True, TypeError, "bound_mib must be a number of MiB, got True"),
        (float("inf"), ValueError, "bound_mib must be a finite number >= 0, got inf"),
        (float("nan"), ValueError, "bound_mib must be a finite number >= 0, got nan"),
        (-1, ValueError, "bound_mib must be a finite number >= 0, got -1"),
        pytest.param(10**400, ValueError, "bound_mib must be a finite number >= 0", id="10**400"),
    ],
)
def test_a_bad_bound_is_refused_before_judging(
    bound: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        judge_growth(two_readings(8), bound)  # type: ignore[arg-type]
    measurement = MemoryMeasurement(two_readings(8))
    with pytest.raises(error, match=message):
        measurement.judge(bound)  # type: ignore[arg-type]


def test_a_measurement_without_a_probe_is_judged_as_it_stands() -> None:
    report = two_readings(8)
    young = dataclasses.replace(
        report, after=dataclasses.replace(report.after, full_collection=False)
    )
    measurement = MemoryMeasurement(young)  # a fake's: nothing to take the reading again from
    verdict = measurement.judge(4)
    assert not verdict.passed
    assert measurement.report is young


def test_a_bound_of_zero_allows_no_growth() -> None:
    assert judge_growth(two_readings(0), 0).passed
    assert not judge_growth(two_readings(0.01), 0).passed


def test_judge_growth_needs_a_report() -> None:
    with pytest.raises(TypeError, match="report must be a MemoryReport, got None"):
        judge_growth(None, 16)  # type: ignore[arg-type]
