"""pytest plugin and conformance checks for PyTorch code accelerated with CUDA graphs.

The public API is importable from here (``from pytest_cudagraph import ParityChecker``).
Names resolve on first use, so ``import pytest_cudagraph`` (which pytest does in every
session of an environment where the plugin is installed) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.4.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "ParityChecker": "pytest_cudagraph.engines.parity",
    "ParityResult": "pytest_cudagraph.engines.parity",
    "Mismatch": "pytest_cudagraph.engines.parity",
    "compare_outputs": "pytest_cudagraph.engines.parity",
    "DeviceMemoryProbe": "pytest_cudagraph.engines.memory",
    "MemoryReport": "pytest_cudagraph.engines.memory",
    "judge_growth": "pytest_cudagraph.engines.memory",
    "host_syncs_fail": "pytest_cudagraph.engines.hostsync",
    "FaultInjector": "pytest_cudagraph.engines.faults",
    "CudaGraphTarget": "pytest_cudagraph.conformance.protocol",
    "TargetError": "pytest_cudagraph.conformance.loading",
    "cuda_graph_parity": "pytest_cudagraph.markers.cuda_graph_parity",
    "graph_memory_bound": "pytest_cudagraph.markers.graph_memory_bound",
    "no_host_sync": "pytest_cudagraph.markers.no_host_sync",
    "pinned_stack": "pytest_cudagraph.markers.pinned_stack",
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
    from pytest_cudagraph.conformance.loading import TargetError
    from pytest_cudagraph.conformance.protocol import CudaGraphTarget
    from pytest_cudagraph.engines.faults import FaultInjector
    from pytest_cudagraph.engines.hostsync import host_syncs_fail
    from pytest_cudagraph.engines.memory import DeviceMemoryProbe, MemoryReport, judge_growth
    from pytest_cudagraph.engines.parity import (
        Mismatch,
        ParityChecker,
        ParityResult,
        compare_outputs,
    )
    from pytest_cudagraph.markers.cuda_graph_parity import cuda_graph_parity
    from pytest_cudagraph.markers.graph_memory_bound import graph_memory_bound
    from pytest_cudagraph.markers.no_host_sync import no_host_sync
    from pytest_cudagraph.markers.pinned_stack import pinned_stack


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_cudagraph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
