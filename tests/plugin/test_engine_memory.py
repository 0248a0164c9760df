"""The memory engine's measurement on a simulated device: warm-up before the baseline makes
the growth the same whatever ran before, and readings wait for NVML to hold still."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.devices import nvml_status
from pytest_cudagraph.memory import (
    DeviceMemoryProbe,
    MemoryReport,
    MemorySample,
    judge_growth,
    stable_reading,
)

MiB = 1024 * 1024
CONTEXT, FIRST_USE, GRAPHS = 500 * MiB, 200 * MiB, 300 * MiB


class SimulatedProcess(DeviceMemoryProbe):
    """A process's device memory as NVML would report it, with a workload whose first run
    also pays one-off costs (library handles, lazily loaded kernels) that are never freed."""

    def __init__(self) -> None:  # no GPU here: nothing of the real probe is set up
        self.device = "cuda:0"
        self._interval_s = 0.001
        self.used = CONTEXT
        self.first_use_paid = False
        self.graphs: list[int] = []
        self.settles = 0

    def settle(self) -> None:
        self.settles += 1

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
    assert process.settles == 3  # before the warm-up, the baseline, after the block
    assert measurement.report.section().splitlines()[-1] == (
        "warm-up before the baseline (first use, not judged): +200.0 MiB"
    )
    assert measurement.report.figures()["first_use_mib"] == 200.0


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
    assert process.sample() == MemorySample(CONTEXT, 0, 64 * MiB)
    assert process.settles == 1


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
