"""Which GPU this test process uses, and NVML lookups that never trust NVML's numbering.

NVML ignores ``CUDA_VISIBLE_DEVICES`` and numbers GPUs its own way, so a torch device is
matched to its NVML handle by UUID (or PCI bus id), never by index. torch and NVML are
imported where they are used: the xdist binding runs in every session and needs neither.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pytest_cudagraph.engines.units import MiB

if TYPE_CHECKING:
    import torch

# The largest device index torch.device holds in every supported torch: an 8-bit signed
# integer in torch 2.7, so larger ones wrap (128 became cuda:-128, 256 cuda:0).
MAX_DEVICE_INDEX = 127


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answers here; ``detail`` is the driver version, or why NVML is unavailable."""

    available: bool
    detail: str


@functools.cache
def nvml_status() -> NvmlStatus:
    """Initialise NVML once per process; never raises."""
    try:
        import pynvml
    except ImportError as error:
        return NvmlStatus(False, f"cannot import pynvml (nvidia-ml-py): {error}")
    try:
        cast("Callable[[], None]", pynvml.nvmlInit)()  # nvidia-ml-py leaves it unannotated
        return NvmlStatus(True, _text(pynvml.nvmlSystemGetDriverVersion()))
    except pynvml.NVMLError as error:
        return NvmlStatus(False, str(error))


def host_gpu_count() -> int | None:
    """GPUs on the host as NVML counts them (no CUDA call, so no context); None without NVML."""
    if not nvml_status().available:
        return None
    return _nvml_device_count()


def _nvml_device_count() -> int:
    """NVML's count of the host's GPUs (nvidia-ml-py leaves ``nvmlDeviceGetCount``
    unannotated)."""
    import pynvml

    return int(cast("Callable[[], int]", pynvml.nvmlDeviceGetCount)())


def cuda_initialized() -> bool:
    """Whether this process has started CUDA: ``torch.cuda.is_initialized()``, which torch
    leaves unannotated."""
    import torch

    return cast("Callable[[], bool]", torch.cuda.is_initialized)()


@dataclass(frozen=True)
class GpuInfo:
    device: str
    name: str
    total_bytes: int


def visible_gpus() -> list[GpuInfo]:
    """The GPUs torch sees; empty, without initialising CUDA, when CUDA is unavailable."""
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        found.append(GpuInfo(f"cuda:{index}", properties.name, int(properties.total_memory)))
    return found


@dataclass(frozen=True)
class DeviceBinding:
    """The CUDA device index this process is bound to and how it was chosen (for the header)."""

    index: int
    how: str

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise TypeError(f"a device index must be an integer, got {self.index!r}")
        if not 0 <= self.index <= MAX_DEVICE_INDEX:
            raise ValueError(
                f"a device index must be in [0, {MAX_DEVICE_INDEX}] (torch's device index), "
                f"got {self.index}"
            )

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.index)


def visible_gpu_entries(cuda_visible_devices: str | None, host_count: int | None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    An outer ``CUDA_VISIBLE_DEVICES`` is honoured (indices, UUIDs or MIG ids alike; like
    CUDA, the list ends at the first empty or negative entry); without one, every GPU on
    the host, counted by NVML.
    """
    if cuda_visible_devices is None:
        return [str(index) for index in range(host_count or 0)]
    entries = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def worker_gpu_entry(worker_id: str, entries: Sequence[str]) -> str:
    """xdist worker gwN gets the N-th visible GPU, wrapping around when workers outnumber GPUs."""
    match = re.fullmatch(r"gw(\d+)", worker_id)
    number = int(match.group(1)) if match else 0
    return entries[number % len(entries)]


def bind_xdist_worker(worker_id: str, environ: MutableMapping[str, str]) -> DeviceBinding:
    """Narrow ``CUDA_VISIBLE_DEVICES`` in ``environ`` to this worker's GPU, which becomes cuda:0.

    Must run before anything in the process initialises CUDA, which reads the variable once.
    """
    outer = environ.get("CUDA_VISIBLE_DEVICES")
    entries = visible_gpu_entries(outer, host_gpu_count())
    if not entries:
        why = (
            f"CUDA_VISIBLE_DEVICES unset and NVML: {nvml_status().detail}"
            if outer is None
            else f"CUDA_VISIBLE_DEVICES={outer!r} lists no GPU"
        )
        return DeviceBinding(0, f"xdist worker {worker_id}: not bound ({why})")
    entry = worker_gpu_entry(worker_id, entries)
    environ["CUDA_VISIBLE_DEVICES"] = entry
    return DeviceBinding(
        0,
        f"xdist worker {worker_id}: CUDA_VISIBLE_DEVICES={entry} (of {','.join(entries)})",
    )


def nvml_handle(device: torch.device) -> object:
    """The NVML handle of a torch CUDA device, looked up by UUID, else by PCI bus id.

    Raises LookupError when NVML knows neither (a MIG instance, for one).
    """
    import pynvml
    import torch

    properties = torch.cuda.get_device_properties(device)
    uuid = "GPU-" + _uuid(properties.uuid)
    bus_id = _pci_bus_id(properties)
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as by_uuid:
        if bus_id is None:
            raise LookupError(f"NVML finds no GPU {uuid} for {device}: {by_uuid}") from None
    try:
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except pynvml.NVMLError as by_bus:
        raise LookupError(
            f"NVML finds neither GPU {uuid} nor PCI bus {bus_id} for {device}: {by_bus}"
        ) from None


def process_used_bytes(handle: object, pid: int) -> int | None:
    """Device memory NVML charges to ``pid`` on this GPU; None when NVML does not list it."""
    import pynvml

    used = [
        process.usedGpuMemory
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        if process.pid == pid and process.usedGpuMemory is not None
    ]
    return sum(used) if used else None


@dataclass(frozen=True)
class StrayCheck:
    """Result of the session-end check in one process; ``strays`` are one line per stray GPU."""

    process: str
    note: str
    strays: tuple[str, ...] = ()


def check_stray_contexts(own_device: torch.device, pid: int, process: str) -> StrayCheck:
    """Every GPU other than ``own_device`` on which NVML lists ``pid`` is a stray."""
    import pynvml
    import torch

    own_uuid = _uuid(torch.cuda.get_device_properties(own_device).uuid)
    strays, listed = [], False
    for index in range(_nvml_device_count()):
        handle = cast("Callable[[int], object]", pynvml.nvmlDeviceGetHandleByIndex)(index)
        used = process_used_bytes(handle, pid)
        if used is None:
            continue
        listed = True
        uuid = _uuid(pynvml.nvmlDeviceGetUUID(handle))
        if uuid != own_uuid:
            name = _text(pynvml.nvmlDeviceGetName(handle))
            strays.append(f"{name} GPU-{uuid}: {used / MiB:.0f} MiB")
    # Memory in torch's pool but no NVML entry: NVML cannot see this PID (a container?).
    hidden = not listed and torch.cuda.memory_reserved(own_device) > 0
    note = "NVML lists this process on no GPU, so strays cannot be seen" if hidden else ""
    return StrayCheck(process, note, tuple(strays))


def _uuid(value: object) -> str:
    """UUIDs as NVML and torch spell them differ in prefix and case; compare bare hex."""
    return re.sub(r"^(gpu|mig)-", "", _text(value).strip().lower())


def _pci_bus_id(properties: object) -> str | None:
    """The PCI bus id NVML understands, where this torch build exposes the PCI ids."""
    ids = [getattr(properties, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    if None in ids:
        return None
    domain, bus, device = ids
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
