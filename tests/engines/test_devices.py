"""Device binding (xdist worker -> GPU) and NVML lookups, against simulated GPUs and NVML."""

from __future__ import annotations

import types

import pynvml
import pytest
import torch

from pytest_cudagraph import settings
from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.units import MiB


@pytest.mark.parametrize(
    ("cuda_visible_devices", "host_count", "entries"),
    [
        (None, 4, ["0", "1", "2", "3"]),
        (None, None, []),
        ("2,3", 8, ["2", "3"]),
        (" 5 , 7 ", None, ["5", "7"]),
        ("GPU-aaaa,GPU-bbbb", 2, ["GPU-aaaa", "GPU-bbbb"]),
        ("1,-1,2", 4, ["1"]),
        ("3,,4", 8, ["3"]),
        ("", 4, []),
    ],
)
def test_visible_gpus_honour_an_outer_cuda_visible_devices(
    cuda_visible_devices: str | None, host_count: int | None, entries: list[str]
) -> None:
    assert devices.visible_gpu_entries(cuda_visible_devices, host_count) == entries


@pytest.mark.parametrize(
    ("worker_id", "entries", "entry"),
    [
        ("gw0", ["0", "1", "2"], "0"),
        ("gw2", ["0", "1", "2"], "2"),
        ("gw3", ["0", "1", "2"], "0"),
        ("gw5", ["4", "6"], "6"),
        ("gw1", ["7"], "7"),
        ("master", ["4", "6"], "4"),
    ],
)
def test_worker_n_gets_the_nth_visible_gpu_modulo_their_count(
    worker_id: str, entries: list[str], entry: str
) -> None:
    assert devices.worker_gpu_entry(worker_id, entries) == entry


def test_binding_a_worker_narrows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "host_gpu_count", lambda: 3)
    environ: dict[str, str] = {}
    binding = devices.bind_xdist_worker("gw4", environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "1"}
    assert binding == devices.DeviceBinding(
        0, "xdist worker gw4: CUDA_VISIBLE_DEVICES=1 (of 0,1,2)"
    )
    assert binding.device == torch.device("cuda", 0)


def test_binding_a_worker_indexes_into_the_outer_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "host_gpu_count", lambda: 8)
    environ = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    devices.bind_xdist_worker("gw1", environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}


def test_without_a_gpu_count_the_worker_is_not_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "host_gpu_count", lambda: None)
    environ: dict[str, str] = {}
    binding = devices.bind_xdist_worker("gw1", environ)
    assert environ == {}
    assert binding.how.startswith(
        "xdist worker gw1: not bound (CUDA_VISIBLE_DEVICES unset and NVML:"
    )


@pytest.mark.parametrize("text", ["cuda:1", "1", " cuda:1 "])
def test_device_setting_accepts_cuda_n_or_n(text: str) -> None:
    assert settings.DEVICE.parse(text) == 1


@pytest.mark.parametrize("text", ["cpu", "cuda", "gpu:1", "-1"])
def test_device_setting_rejects_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="expected cuda:N or N"):
        settings.DEVICE.parse(text)


@pytest.mark.parametrize("text", ["128", "cuda:255", "256", 1000])
def test_device_indices_torch_cannot_hold_are_refused(text: object) -> None:
    """torch.device keeps an 8-bit index: 128 became cuda:-128, 255 no index, 256 cuda:0."""
    with pytest.raises(ValueError, match=r"N at most 127, the largest device index torch holds"):
        settings.DEVICE.parse(text)
    assert settings.DEVICE.parse("cuda:127") == devices.MAX_DEVICE_INDEX == 127
    assert torch.device("cuda", devices.MAX_DEVICE_INDEX).index == devices.MAX_DEVICE_INDEX


def test_a_device_binding_holds_only_an_index_torch_holds() -> None:
    with pytest.raises(ValueError, match=r"a device index must be in \[0, 127\]"):
        devices.DeviceBinding(128, "test")
    with pytest.raises(TypeError, match="a device index must be an integer"):
        devices.DeviceBinding("0", "test")  # type: ignore[arg-type]


def test_a_device_past_torch_s_range_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--cudagraph-device=256")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --cudagraph-device='256': expected cuda:N or N with N *"])


def test_bad_device_setting_is_a_usage_error_naming_its_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_CUDAGRAPH_DEVICE", "gpu1")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: PYTEST_CUDAGRAPH_DEVICE='gpu1': expected cuda:N or N"])


def test_device_option_beats_env(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        """
        import os

        from pytest_cudagraph import plugin

        def test_binding(pytestconfig):
            binding = pytestconfig.stash[plugin.BINDING]
            assert (binding.index, binding.how) == (int(os.environ["INDEX"]), os.environ["HOW"])
        """
    )
    monkeypatch.setenv("PYTEST_CUDAGRAPH_DEVICE", "cuda:2")
    monkeypatch.setenv("INDEX", "3")
    monkeypatch.setenv("HOW", "--cudagraph-device")
    pytester.runpytest_inprocess("--cudagraph-device=3").assert_outcomes(passed=1)
    monkeypatch.setenv("INDEX", "2")
    monkeypatch.setenv("HOW", "PYTEST_CUDAGRAPH_DEVICE")
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


# NVML lookups against a simulated NVML: identity by UUID (or PCI bus id), never by index.


class FakeNvml:
    """Two GPUs as NVML numbers them, each with its compute processes."""

    def __init__(self, processes: dict[str, list[tuple[int, int | None]]]) -> None:
        self.uuids = list(processes)
        self.processes = processes

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(self.uuids))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: self.uuids[index])
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda handle: handle)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: b"Fake GPU")
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", self.handle_by_uuid)
        monkeypatch.setattr(
            pynvml,
            "nvmlDeviceGetComputeRunningProcesses",
            lambda handle: [
                types.SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, used in self.processes[handle]
            ],
        )

    def handle_by_uuid(self, uuid: str) -> str:
        if uuid not in self.uuids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return uuid


def fake_torch_device(
    monkeypatch: pytest.MonkeyPatch, uuid: str, reserved: int = 0, **pci: int
) -> None:
    properties = types.SimpleNamespace(uuid=uuid, **pci)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: reserved)


def test_handle_is_found_by_uuid_whatever_its_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml({"GPU-0000aaaa": [], "GPU-1111bbbb": []}).install(monkeypatch)
    fake_torch_device(monkeypatch, "1111BBBB")
    assert devices.nvml_handle(torch.device("cuda", 0)) == "GPU-1111bbbb"


def test_handle_falls_back_to_the_pci_bus_id(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml({"GPU-0000aaaa": []}).install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByPciBusId", lambda bus_id: f"bus {bus_id}")
    fake_torch_device(monkeypatch, "ffff", pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0)
    assert devices.nvml_handle(torch.device("cuda", 0)) == "bus 00000000:1b:00.0"


def test_a_gpu_nvml_cannot_find_is_a_lookup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml({"GPU-0000aaaa": []}).install(monkeypatch)
    fake_torch_device(monkeypatch, "ffff")
    with pytest.raises(LookupError, match="NVML finds no GPU GPU-ffff for cuda:0: Not Found"):
        devices.nvml_handle(torch.device("cuda", 0))


def test_process_memory_counts_only_this_pid() -> None:
    nvml = FakeNvml({"GPU-a": [(10, 100 * MiB), (11, 5 * MiB), (10, 20 * MiB), (12, None)]})
    with pytest.MonkeyPatch.context() as monkeypatch:
        nvml.install(monkeypatch)
        assert devices.process_used_bytes("GPU-a", 10) == 120 * MiB
        assert devices.process_used_bytes("GPU-a", 12) is None
        assert devices.process_used_bytes("GPU-a", 99) is None


def test_contexts_on_other_gpus_are_strays(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(
        {"GPU-0000aaaa": [(10, 300 * MiB)], "GPU-1111bbbb": [(10, 500 * MiB), (11, MiB)]}
    ).install(monkeypatch)
    fake_torch_device(monkeypatch, "0000aaaa")
    check = devices.check_stray_contexts(torch.device("cuda", 0), 10, "gw1 pid 10")
    assert check == devices.StrayCheck("gw1 pid 10", "", ("Fake GPU GPU-1111bbbb: 500 MiB",))


def test_own_gpu_only_is_no_stray(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml({"GPU-0000aaaa": [(10, 300 * MiB)], "GPU-1111bbbb": [(11, MiB)]}).install(monkeypatch)
    fake_torch_device(monkeypatch, "0000aaaa")
    assert devices.check_stray_contexts(torch.device("cuda", 0), 10, "pid 10").strays == ()


def test_a_pid_nvml_cannot_see_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml({"GPU-0000aaaa": [(4242, 300 * MiB)]}).install(monkeypatch)
    fake_torch_device(monkeypatch, "0000aaaa", reserved=64 * MiB)
    check = devices.check_stray_contexts(torch.device("cuda", 0), 10, "pid 10")
    assert check.note == "NVML lists this process on no GPU, so strays cannot be seen"
