"""The memory probe's garbage collection, for real: the reading at a block's end collects gc's
young generations only, which frees the block's own garbage but not that of objects alive at
the baseline (judge() retakes it fully), and gc's state is the same during and after a
measurement as before it, also where the process froze objects itself or disabled gc.

The device is simulated by CPU objects: the process "holds" the bytes of every DeviceBlock
still alive, so what gc frees is what NVML would stop counting.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import pytest

from pytest_cudagraph.engines.memory import DeviceMemoryProbe
from pytest_cudagraph.engines.units import MiB

CONTEXT, BLOCK = 500 * MiB, 64 * MiB
FULL, YOUNG = 2, 1  # the generation a collection reports: the oldest, or the young ones


class DeviceBlock:
    def __init__(self, size: int) -> None:
        self.size = size


class LiveObjectsProcess(DeviceMemoryProbe):
    """The real probe's collections; its device memory is the live DeviceBlocks."""

    def __init__(self) -> None:  # no GPU here: nothing of the real probe is set up
        self.device = "cuda:0"
        self._interval_s = 0.001
        self.blocks: weakref.WeakSet[DeviceBlock] = weakref.WeakSet()

    def cycle_holding_a_block(self) -> list[object]:
        block = DeviceBlock(BLOCK)
        self.blocks.add(block)
        cycle: list[object] = [block]
        cycle.append(cycle)
        return cycle

    def release_freed(self) -> None:
        pass

    def process_bytes(self) -> int:
        return CONTEXT + sum(block.size for block in self.blocks)

    def allocator_bytes(self) -> tuple[int, int]:
        return 0, 0


def gc_state() -> tuple[int, bool, tuple[int, ...]]:
    return gc.get_freeze_count(), gc.isenabled(), gc.get_threshold()


@pytest.fixture(autouse=True)
def gc_state_is_restored() -> Iterator[None]:
    """Every test leaves gc as it found it."""
    before = gc_state()
    yield
    assert gc_state() == before


@contextmanager
def no_automatic_collection() -> Iterator[None]:
    """So that only the probe's own collections free anything."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def collected_generations() -> Iterator[list[int]]:
    """The oldest generation each garbage collection took, in order."""
    generations: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield generations
    finally:
        gc.callbacks.remove(record)


@contextmanager
def frozen_by_the_process() -> Iterator[None]:
    """Objects frozen by the process itself, as the H200 host's Python does at start-up.
    Where some are frozen already, that is the case as it is: unfreezing ours would unfreeze
    those too."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_the_young_reading_frees_a_cycle_made_in_the_block_collecting_young_generations() -> None:
    process = LiveObjectsProcess()
    with no_automatic_collection(), collected_generations() as generations:
        with process.measure() as measurement:
            process.cycle_holding_a_block()  # dropped at once: garbage only gc frees
            assert process.process_bytes() == CONTEXT + BLOCK
    report = measurement.report
    assert generations == [FULL, YOUNG]  # the baseline's, then the young reading's
    assert (report.after.full_collection, report.after.process_bytes) == (False, CONTEXT)


def test_the_young_reading_counts_a_cycle_alive_at_the_baseline_until_judge_retakes() -> None:
    process = LiveObjectsProcess()
    process.cycle_holding_a_block()  # garbage before the baseline: its full collection frees it
    old = process.cycle_holding_a_block()
    with no_automatic_collection(), collected_generations() as generations:
        with process.measure() as measurement:
            kept = process.cycle_holding_a_block()
            del old
        young = measurement.report
        assert young.before.process_bytes == CONTEXT + BLOCK
        # The conservative side: the young reading still counts the dead cycle.
        assert (young.after.full_collection, young.growth) == (False, BLOCK)
        verdict = measurement.judge(bound_mib=32)
    assert generations == [FULL, YOUNG, FULL]
    assert verdict.passed and "grew by 0.0 MiB, within the 32 MiB bound" in verdict.reason
    assert measurement.report.after.full_collection
    assert measurement.report.young_after == young.after
    del kept


def test_a_reading_in_the_block_is_young_or_exact_as_asked() -> None:
    process = LiveObjectsProcess()
    old = process.cycle_holding_a_block()
    with no_automatic_collection(), process.measure():
        del old
        assert process.young_sample().process_bytes == CONTEXT + BLOCK
        assert process.sample_within(limit_bytes=CONTEXT + BLOCK).process_bytes == CONTEXT + BLOCK
        exact = process.sample_within(limit_bytes=CONTEXT)
        assert (exact.full_collection, exact.process_bytes) == (True, CONTEXT)


@pytest.mark.parametrize("process_gc", ["as_default", "frozen_by_the_process", "disabled"])
def test_a_measurement_and_its_retake_leave_gc_state_as_they_found_it(process_gc: str) -> None:
    process = LiveObjectsProcess()
    setting = {
        "as_default": nullcontext,
        "frozen_by_the_process": frozen_by_the_process,
        "disabled": no_automatic_collection,
    }[process_gc]
    with setting():
        state = gc_state()
        old = process.cycle_holding_a_block()
        with process.measure() as measurement:
            assert gc_state() == state
            process.cycle_holding_a_block()
            kept = process.cycle_holding_a_block()
            del old
        assert gc_state() == state
        # Young, the growth is a block (the dead old cycle still counted): over, so retaken.
        verdict = measurement.judge(bound_mib=32)
        assert gc_state() == state
    assert verdict.passed and measurement.report.growth == 0
    assert measurement.report.young_after is not None  # judged on the retaken reading
    del kept


def test_with_objects_frozen_by_the_process_readings_stay_young_and_the_freeze_stays() -> None:
    process = LiveObjectsProcess()
    with frozen_by_the_process():
        own_freeze = gc.get_freeze_count()
        assert own_freeze > 0
        old = process.cycle_holding_a_block()  # made after the freeze: gc still tracks it
        with no_automatic_collection(), collected_generations() as generations:
            with process.measure() as measurement:
                process.cycle_holding_a_block()  # garbage the young reading frees
                kept = process.cycle_holding_a_block()
                del old
            young = measurement.report
            verdict = measurement.judge(bound_mib=32)
        assert gc.get_freeze_count() == own_freeze
    assert generations == [FULL, YOUNG, FULL]
    assert (young.after.full_collection, young.growth) == (False, BLOCK)
    assert verdict.passed and measurement.report.growth == 0
    del kept
