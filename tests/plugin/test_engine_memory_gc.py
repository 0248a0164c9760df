"""The memory probe's garbage collection, for real: the reading at a block's end collects the
block's own garbage but not the baseline's objects (gc.freeze), readings meant to be exact
collect everything, and gc's state is the same after a measurement as before it.

The device is simulated by CPU objects: the process "holds" the bytes of every DeviceBlock
still alive, so what gc frees is what NVML would stop counting.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_cudagraph.memory import DeviceMemoryProbe

MiB = 1024 * 1024
CONTEXT, BLOCK = 500 * MiB, 64 * MiB


class DeviceBlock:
    def __init__(self, size: int) -> None:
        self.size = size


class LiveObjectsProcess(DeviceMemoryProbe):
    """The real probe's collections and freeze; its device memory is the live DeviceBlocks."""

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


@pytest.fixture(autouse=True)
def gc_state_is_restored() -> Iterator[None]:
    """Every test starts from an unfrozen, enabled gc and must leave it so."""
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    yield
    assert gc.get_freeze_count() == 0 and gc.isenabled()


@contextmanager
def no_automatic_collection() -> Iterator[None]:
    """So that only the probe's own collections free anything."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_the_young_reading_collects_a_cycle_made_in_the_block() -> None:
    process = LiveObjectsProcess()
    with process.young_collections(), no_automatic_collection():
        process.cycle_holding_a_block()  # dropped at once: garbage only gc frees
        assert process.process_bytes() == CONTEXT + BLOCK
        reading = process.young_sample()
    assert (reading.full_collection, reading.process_bytes) == (False, CONTEXT)


def test_the_young_reading_leaves_a_cycle_alive_at_the_baseline_which_judge_retakes() -> None:
    process = LiveObjectsProcess()
    process.cycle_holding_a_block()  # garbage before the baseline: its full collection frees it
    old = process.cycle_holding_a_block()
    with process.measure() as measurement:
        kept = process.cycle_holding_a_block()
        del old
    young = measurement.report
    assert young.before.process_bytes == CONTEXT + BLOCK
    # The conservative side: the young reading still counts the dead cycle.
    assert (young.after.full_collection, young.growth) == (False, BLOCK)
    verdict = measurement.judge(bound_mib=32)
    assert verdict.passed and "grew by 0.0 MiB, within the 32 MiB bound" in verdict.reason
    assert measurement.report.after.full_collection
    assert measurement.report.young_after == young.after
    del kept


def test_sample_in_the_block_is_exact_and_the_freeze_goes_on() -> None:
    process, other_probe = LiveObjectsProcess(), LiveObjectsProcess()
    old = process.cycle_holding_a_block()
    with process.measure():
        del old
        assert process.young_sample().process_bytes == CONTEXT + BLOCK
        assert other_probe.sample().full_collection
        # Any probe's exact reading collects what another probe froze.
        assert process.process_bytes() == CONTEXT
        assert gc.get_freeze_count() > 0  # what is alive is frozen again
        with other_probe.young_collections():  # nested: the outer freeze serves
            assert not other_probe.young_sample().full_collection
        assert gc.get_freeze_count() > 0


def test_the_freeze_is_undone_when_the_block_raises() -> None:
    process = LiveObjectsProcess()
    with pytest.raises(ValueError, match="the block's own error"):
        with process.measure():
            assert gc.get_freeze_count() > 0
            raise ValueError("the block's own error")
    # (the autouse fixture checks that nothing is left frozen)


def test_a_process_that_froze_objects_itself_keeps_its_freeze_and_full_readings() -> None:
    process = LiveObjectsProcess()
    gc.freeze()
    try:
        own_freeze = gc.get_freeze_count()
        old = process.cycle_holding_a_block()
        with process.measure() as measurement:
            assert gc.get_freeze_count() == own_freeze
            del old
        assert gc.get_freeze_count() == own_freeze
    finally:
        gc.unfreeze()
    report = measurement.report
    assert report.after.full_collection and report.growth == -BLOCK


def test_with_gc_disabled_nothing_is_frozen_and_readings_stay_full() -> None:
    process = LiveObjectsProcess()
    old = process.cycle_holding_a_block()
    with no_automatic_collection():
        with process.measure() as measurement:
            assert gc.get_freeze_count() == 0
            del old
        assert not gc.isenabled()
    report = measurement.report
    assert report.after.full_collection and report.growth == -BLOCK
