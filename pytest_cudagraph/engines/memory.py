"""graph_memory_bound: fail when this process's device memory grows past a bound.

Graph executables and the driver hold memory the torch allocator never sees, so growth
is measured with NVML's per-process figure, with torch's share shown beside it. As in
PyTorch's CudaMemoryLeakCheck, every reading is settled first (gc, synchronize, empty the
caching allocator, re-read NVML until it holds still), and first-use costs (library
handles and workspaces, lazily loaded kernels, the eager model's first call) are paid by
an optional warm-up before the baseline, so the growth is the measured block's alone
whatever ran before it. A background thread samples the peak in between. The reading at
the block's end collects gc's young generations only (``young_sample``), which is what
makes it cheap; ``MemoryMeasurement.judge`` keeps the verdict exact. torch and NVML are
imported when a probe is made, so loading the plugin costs nothing.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_cudagraph.engines.arguments import non_negative_number
from pytest_cudagraph.engines.units import MiB

if TYPE_CHECKING:
    import torch

# Most NVML reads per settled reading: a figure is kept once two reads in a row agree, so a
# read taken while the driver is still handing memory back is not the one kept.
STABLE_READS = 8
# A young collection takes generations 0 up to this one: all but the oldest.
YOUNG_GENERATIONS = 1


@dataclass(frozen=True)
class MemorySample:
    """One settled reading: NVML's figure for this process and the torch allocator's.

    ``full_collection`` is False for a reading whose garbage collection took gc's young
    generations only (``DeviceMemoryProbe.young_sample()``): garbage among older objects
    still holds its memory, so the figures are at least what a full collection gives, never
    less.
    """

    process_bytes: int
    torch_allocated: int
    torch_reserved: int
    full_collection: bool = True

    @property
    def outside_torch(self) -> int:
        """What torch cannot see: graph executables, driver and library state."""
        return self.process_bytes - self.torch_reserved


@dataclass(frozen=True)
class MemoryReport:
    """Readings before and after a measured block, and NVML's peak in between.

    ``before`` is the baseline, taken after the warm-up when there is one;
    ``first_use_bytes`` is what the warm-up added (shown, never judged), None without one.
    ``young_after`` is the young reading (``full_collection`` False) that ``after`` replaced
    with a full collection, because its growth was over the bound (``MemoryMeasurement.judge``).
    """

    device: str
    before: MemorySample
    after: MemorySample
    peak_process_bytes: int
    first_use_bytes: int | None = None
    young_after: MemorySample | None = None

    @property
    def growth(self) -> int:
        return self.after.process_bytes - self.before.process_bytes

    def section(self) -> str:
        """The text of the "cudagraph memory" report section."""
        rows = [
            ("NVML, this process", "process_bytes"),
            ("torch allocated", "torch_allocated"),
            ("torch reserved", "torch_reserved"),
            ("outside torch", "outside_torch"),
        ]
        lines = [
            f"device {self.device}, in MiB:",
            f"{'':22}{'before':>10}{'after':>10}{'change':>10}",
        ]
        for label, field in rows:
            before, after = getattr(self.before, field) / MiB, getattr(self.after, field) / MiB
            lines.append(f"{label:22}{before:>10.1f}{after:>10.1f}{after - before:>+10.1f}")
        lines.append(f"{'NVML peak':22}{'':>10}{self.peak_process_bytes / MiB:>10.1f}")
        if not self.after.full_collection:
            lines.append(
                "after: garbage collected among the block's objects only, so the figure may "
                "be above a full collection's, never below"
            )
        if self.young_after is not None:
            lines.append(
                "after: taken again with a full garbage collection, as collecting the block's "
                f"garbage only read {self.young_after.process_bytes / MiB:.1f} MiB, over the bound"
            )
        if self.first_use_bytes is not None:
            lines.append(
                f"warm-up before the baseline (first use, not judged): "
                f"{self.first_use_bytes / MiB:+.1f} MiB"
            )
        return "\n".join(lines)

    def figures(self) -> dict[str, object]:
        """Plain numbers for the terminal summary (they travel from xdist workers)."""
        figures: dict[str, object] = {
            "device": self.device,
            "growth_mib": self.growth / MiB,
            "peak_growth_mib": (self.peak_process_bytes - self.before.process_bytes) / MiB,
            "torch_reserved_growth_mib": (self.after.torch_reserved - self.before.torch_reserved)
            / MiB,
            "outside_torch_growth_mib": (self.after.outside_torch - self.before.outside_torch)
            / MiB,
        }
        if self.first_use_bytes is not None:
            figures["first_use_mib"] = self.first_use_bytes / MiB
        return figures


@dataclass(frozen=True)
class MemoryVerdict:
    """``passed`` judges NVML's growth; ``warning`` (or "") notes torch-allocator growth the
    process figure does not confirm, which CudaMemoryLeakCheck also only warns about."""

    passed: bool
    reason: str
    warning: str = ""


def check_bound_mib(bound_mib: object) -> float:
    """``bound_mib`` when it is a finite number of MiB >= 0."""
    try:
        return non_negative_number("bound_mib", bound_mib, kind="a number of MiB")
    except TypeError as error:
        raise TypeError(
            f"{error} (a size with a unit, such as '16MiB', is for the marker and the setting)"
        ) from None


def judge_growth(report: MemoryReport, bound_mib: float) -> MemoryVerdict:
    """Growth over the bound fails; the reason is one line with the figures that matter.

    The driver's figure (NVML) decides. Live tensors that grew past the bound while the
    process did not (memory the allocator already held, reused) give a warning only.
    ``bound_mib`` is a finite number >= 0 (a size with a unit is the marker's and the
    setting's business: ``settings.parse_mib``).
    """
    if not isinstance(report, MemoryReport):
        raise TypeError(f"report must be a MemoryReport, got {report!r}")
    check_bound_mib(bound_mib)
    figures = report.figures()
    growth_mib = report.growth / MiB
    passed = growth_mib <= bound_mib
    verdict = "within" if passed else "over"
    allocated_mib = (report.after.torch_allocated - report.before.torch_allocated) / MiB
    warning = ""
    if passed and allocated_mib > bound_mib:
        warning = (
            f"graph_memory_bound: torch's live tensors on {report.device} grew by "
            f"{allocated_mib:.1f} MiB, over the {bound_mib:g} MiB bound, in memory the "
            f"allocator already held; the process grew only by {growth_mib:.1f} MiB"
        )
    return MemoryVerdict(
        passed,
        f"graph_memory_bound: this process's memory on {report.device} grew by "
        f"{growth_mib:.1f} MiB, {verdict} the {bound_mib:g} MiB bound "
        f"(torch reserved {figures['torch_reserved_growth_mib']:+.1f} MiB, "
        f"outside torch {figures['outside_torch_growth_mib']:+.1f} MiB)",
        warning,
    )


def settle(device: torch.device) -> None:
    """Let freed memory really go: collect garbage, wait for the device, and hand the caching
    allocator's free blocks back, so that a reading shows what is still held."""
    gc.collect()
    release_freed(device)


def release_freed(device: torch.device) -> None:
    """Wait for the device, then hand the caching allocator's free blocks back to the driver.

    cuBLAS workspaces are left alone: a captured graph may still use one, so freeing them
    here could hand a graph's memory back to the driver.
    """
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def stable_reading(read: Callable[[], int], reads: int = STABLE_READS) -> int:
    """``read()`` again until two readings in a row agree (at most ``reads`` times); the
    last reading. No sleeping: NVML answers in well under a millisecond when nothing moves."""
    if not isinstance(reads, int) or isinstance(reads, bool) or reads < 2:
        raise ValueError(f"reads must be an integer >= 2, got {reads!r}")
    previous = read()
    for _ in range(reads - 1):
        current = read()
        if current == previous:
            return current
        previous = current
    return previous


class ProcessNotListed(RuntimeError):
    """NVML cannot attribute memory to this process (e.g. in a PID namespace)."""


@dataclass
class MemoryMeasurement:
    """What ``DeviceMemoryProbe.measure()`` yields; ``report`` is set when the block ends.

    Judge it with ``judge(bound_mib)`` right after the block: the report's ``after`` reading
    may have collected only the block's garbage, and ``judge`` takes it again, exactly, from
    ``probe`` when that matters (a measurement without a probe is judged as it stands).
    """

    report: MemoryReport | None = None
    probe: DeviceMemoryProbe | None = None

    def judge(self, bound_mib: float) -> MemoryVerdict:
        """``judge_growth`` on the report, with a verdict as exact as a full collection's.

        The baseline is exact, and a young collection frees a part of what a full one frees,
        so a young ``after`` reading is at least the full one, and growth within the bound is
        within it. Growth over the bound is judged on a reading taken again with a full
        collection, which replaces ``after`` in the report (the young one is kept as
        ``young_after``).
        """
        check_bound_mib(bound_mib)
        if self.report is None:
            raise RuntimeError("no report to judge: the measured block has not ended normally")
        verdict = judge_growth(self.report, bound_mib)
        if verdict.passed or self.report.after.full_collection or self.probe is None:
            return verdict
        young = self.report.after
        self.report = replace(self.report, after=self.probe.sample(), young_after=young)
        return judge_growth(self.report, bound_mib)


class DeviceMemoryProbe:
    """Measures this process's memory on one CUDA device through NVML.

    ``sample()`` settles and reads once, exactly. ``measure(warmup)`` brackets a block of
    code, running ``warmup`` (the workload once, undone, for example) before the baseline
    so that first-use costs are not charged to the block. ``young_sample()`` and
    ``sample_within(limit_bytes)`` are the cheap readings, for after a full one. Making a
    probe raises LookupError where NVML is unavailable or does not know the device.
    """

    def __init__(self, device: torch.device, *, interval_s: float = 0.005) -> None:
        from pytest_cudagraph.engines import devices

        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"interval_s must be a number > 0, got {interval_s!r}")
        nvml = devices.nvml_status()  # initialises NVML once per process
        if not nvml.available:
            raise LookupError(f"NVML is unavailable: {nvml.detail}")
        self.device = device
        self.pid = os.getpid()
        self._handle = devices.nvml_handle(device)
        self._interval_s = interval_s

    def settle(self, *, full_collection: bool = True) -> None:
        """``settle(device)``; ``full_collection=False`` collects gc's young generations only
        (see ``young_sample()``)."""
        if full_collection:
            gc.collect()
        else:
            gc.collect(YOUNG_GENERATIONS)
        self.release_freed()

    def release_freed(self) -> None:
        release_freed(self.device)

    def process_bytes(self) -> int:
        """NVML's figure for this process right now (not settled)."""
        from pytest_cudagraph.engines import devices

        used = devices.process_used_bytes(self._handle, self.pid)
        if used is None:
            raise ProcessNotListed(
                f"NVML lists no memory for this process (pid {self.pid}) on {self.device}; "
                "per-process memory is unavailable here (a container's PID namespace?)"
            )
        return used

    def allocator_bytes(self) -> tuple[int, int]:
        """The torch caching allocator's (allocated, reserved) bytes on the device."""
        import torch

        return torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device)

    def sample(self) -> MemorySample:
        """Settle with a full collection, then read NVML until it holds still, and the
        allocator beside it: the exact reading."""
        return self._reading(full_collection=True)

    def young_sample(self) -> MemorySample:
        """The cheap reading: ``sample()`` with a collection of gc's young generations only,
        never below the exact figure.

        A full collection (a baseline's, any ``sample()``'s) leaves every survivor in the
        oldest generation, so the young collection scans only objects made since (those gc's
        automatic collections have not moved to the oldest yet) and frees their garbage: it
        costs what the block made, not every object gc tracks. Garbage among older objects
        keeps its memory until a full collection, so the figure may read high, never low: a
        partial collection frees a part of what a full one frees. On Python 3.14's
        incremental gc the collection is one increment instead, partial too. gc's state
        (thresholds, frozen objects, enabled or not) is left as it is: an explicit collection
        runs with gc disabled as well.
        """
        return self._reading(full_collection=False)

    def sample_within(self, limit_bytes: int) -> MemorySample:
        """``young_sample()``, taken again with ``sample()`` when NVML reads over
        ``limit_bytes``: exact wherever it matters to whether the figure is within the limit."""
        if not isinstance(limit_bytes, (int, float)) or isinstance(limit_bytes, bool):
            raise TypeError(f"limit_bytes must be a number of bytes, got {limit_bytes!r}")
        young = self.young_sample()
        if young.process_bytes <= limit_bytes:
            return young
        return self.sample()

    def _reading(self, full_collection: bool) -> MemorySample:
        self.settle(full_collection=full_collection)
        process = stable_reading(self.process_bytes)
        allocated, reserved = self.allocator_bytes()
        return MemorySample(process, allocated, reserved, full_collection)

    @contextmanager
    def measure(self, warmup: Callable[[], object] | None = None) -> Iterator[MemoryMeasurement]:
        """Measure the block; ``warmup``, when given, runs first and its cost is reported as
        ``first_use_bytes`` instead of growth.

        The baseline is a full reading and the block ends with a young one, which the
        measurement's ``judge()`` takes again with a full collection where it is over the
        bound.
        """
        if warmup is not None and not callable(warmup):
            raise TypeError(f"warmup must be a callable or None, got {warmup!r}")
        measurement = MemoryMeasurement(probe=self)
        first_use = None
        if warmup is not None:
            cold = self.sample()
            warmup()
        before = self.sample()
        if warmup is not None:
            first_use = before.process_bytes - cold.process_bytes
        peak = _PeakSampler(self.process_bytes, self._interval_s, before.process_bytes)
        peak.start()
        try:
            yield measurement
        finally:
            peak.stop()
        after = self.young_sample()
        measurement.report = MemoryReport(
            str(self.device), before, after, max(peak.value, after.process_bytes), first_use
        )


class _PeakSampler(threading.Thread):
    """Polls NVML (not CUDA, so graph capture in the test body is not disturbed)."""

    def __init__(self, read: Callable[[], int], interval_s: float, start_value: int) -> None:
        super().__init__(name="cudagraph-memory-peak", daemon=True)
        self._read = read
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self.value = start_value

    def run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.value = max(self.value, self._read())
            except ProcessNotListed:
                continue

    def stop(self) -> None:
        self._stopped.set()
        self.join()
