"""pytest plugin and conformance checks for PyTorch code accelerated with CUDA graphs.

The public API is importable from here (``from pytest_cudagraph import ParityChecker``).
Names resolve on first use, so ``import pytest_cudagraph`` (which pytest does in every
session of an environment where the plugin is installed) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "ParityChecker": "pytest_cudagraph.parity",
    "ParityResult": "pytest_cudagraph.parity",
    "Mismatch": "pytest_cudagraph.parity",
    "compare_outputs": "pytest_cudagraph.parity",
    "DeviceMemoryProbe": "pytest_cudagraph.memory",
    "MemoryReport": "pytest_cudagraph.memory",
    "judge_growth": "pytest_cudagraph.memory",
    "host_syncs_fail": "pytest_cudagraph.hostsync",
    "FaultInjector": "pytest_cudagraph.faults",
    "CudaGraphTarget": "pytest_cudagraph.target",
    "TargetError": "pytest_cudagraph.target",
    "cuda_graph_parity": "pytest_cudagraph.markers.parity",
    "graph_memory_bound": "pytest_cudagraph.markers.memory",
    "no_host_sync": "pytest_cudagraph.markers.hostsync",
    "pinned_stack": "pytest_cudagraph.markers.stack",
}
__all__ = [
    "CudaGraphTarget",
    "DeviceMemoryProbe",
    "FaultInjector",
    "MemoryReport",
    "Mismatch",
    "ParityChecker",
    "ParityResult",
    "TargetError",
    "__version__",
    "compare_outputs",
    "cuda_graph_parity",
    "graph_memory_bound",
    "host_syncs_fail",
    "judge_growth",
    "no_host_sync",
    "pinned_stack",
]

if TYPE_CHECKING:
    from pytest_cudagraph.faults import FaultInjector
    from pytest_cudagraph.hostsync import host_syncs_fail
    from pytest_cudagraph.markers.hostsync import no_host_sync
    from pytest_cudagraph.markers.memory import graph_memory_bound
    from pytest_cudagraph.markers.parity import cuda_graph_parity
    from pytest_cudagraph.markers.stack import pinned_stack
    from pytest_cudagraph.memory import DeviceMemoryProbe, MemoryReport, judge_growth
    from pytest_cudagraph.parity import Mismatch, ParityChecker, ParityResult, compare_outputs
    from pytest_cudagraph.target import CudaGraphTarget, TargetError


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_cudagraph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
