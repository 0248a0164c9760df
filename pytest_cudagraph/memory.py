"""graph_memory_bound: fail when this process's device memory grows past a bound.

Graph executables and the driver hold memory the torch allocator never sees, so growth
is measured with NVML's per-process figure, with torch's share shown beside it. Samples
are taken after settling (gc, synchronize, empty the caching allocator), as PyTorch's
CudaMemoryLeakCheck does; a background thread samples the peak in between.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pytest_cudagraph import devices

MiB = devices.MiB


@dataclass(frozen=True)
class MemorySample:
    """One settled reading: NVML's figure for this process and the torch allocator's."""

    process_bytes: int
    torch_allocated: int
    torch_reserved: int

    @property
    def outside_torch(self) -> int:
        """What torch cannot see: graph executables, driver and library state."""
        return self.process_bytes - self.torch_reserved


@dataclass(frozen=True)
class MemoryReport:
    """Readings before and after a measured block, and NVML's peak in between."""

    device: str
    before: MemorySample
    after: MemorySample
    peak_process_bytes: int

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
        return "\n".join(lines)

    def figures(self) -> dict[str, object]:
        """Plain numbers for the terminal summary (they travel from xdist workers)."""
        return {
            "device": self.device,
            "growth_mib": self.growth / MiB,
            "peak_growth_mib": (self.peak_process_bytes - self.before.process_bytes) / MiB,
            "torch_reserved_growth_mib": (self.after.torch_reserved - self.before.torch_reserved)
            / MiB,
            "outside_torch_growth_mib": (self.after.outside_torch - self.before.outside_torch)
            / MiB,
        }


@dataclass(frozen=True)
class MemoryVerdict:
    passed: bool
    reason: str


def judge_growth(report: MemoryReport, bound_mib: float) -> MemoryVerdict:
    """Growth over the bound fails; the reason is one line with the figures that matter."""
    figures = report.figures()
    growth_mib = report.growth / MiB
    passed = growth_mib <= bound_mib
    verdict = "within" if passed else "over"
    return MemoryVerdict(
        passed,
        f"graph_memory_bound: this process's memory on {report.device} grew by "
        f"{growth_mib:.1f} MiB, {verdict} the {bound_mib:g} MiB bound "
        f"(torch reserved {figures['torch_reserved_growth_mib']:+.1f} MiB, "
        f"outside torch {figures['outside_torch_growth_mib']:+.1f} MiB)",
    )


def settle(device: torch.device) -> None:
    """Let freed memory really go: collect garbage, wait for the device, and hand the caching
    allocator's free blocks back, so that a reading shows what is still held."""
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


class ProcessNotListed(RuntimeError):
    """NVML cannot attribute memory to this process (e.g. in a PID namespace)."""


@dataclass
class MemoryMeasurement:
    """What ``DeviceMemoryProbe.measure()`` yields; ``report`` is set when the block ends."""

    report: MemoryReport | None = None


class DeviceMemoryProbe:
    """Measures this process's memory on one CUDA device through NVML.

    ``sample()`` settles and reads once; ``measure()`` brackets a block of code.
    """

    def __init__(self, device: torch.device, *, interval_s: float = 0.005) -> None:
        self.device = device
        self.pid = os.getpid()
        self._handle = devices.nvml_handle(device)
        self._interval_s = interval_s

    def settle(self) -> None:
        settle(self.device)

    def process_bytes(self) -> int:
        used = devices.process_used_bytes(self._handle, self.pid)
        if used is None:
            raise ProcessNotListed(
                f"NVML lists no memory for this process (pid {self.pid}) on {self.device}; "
                "per-process memory is unavailable here (a container's PID namespace?)"
            )
        return used

    def sample(self) -> MemorySample:
        self.settle()
        return MemorySample(
            process_bytes=self.process_bytes(),
            torch_allocated=torch.cuda.memory_allocated(self.device),
            torch_reserved=torch.cuda.memory_reserved(self.device),
        )

    @contextmanager
    def measure(self) -> Iterator[MemoryMeasurement]:
        measurement = MemoryMeasurement()
        before = self.sample()
        peak = _PeakSampler(self.process_bytes, self._interval_s, before.process_bytes)
        peak.start()
        try:
            yield measurement
        finally:
            peak.stop()
        after = self.sample()
        measurement.report = MemoryReport(
            str(self.device), before, after, max(peak.value, after.process_bytes)
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
