"""pytest plugin and conformance checks for PyTorch code accelerated with CUDA graphs.

The public API is importable from here (``from pytest_cudagraph import ParityChecker``).
Names resolve on first use, so ``import pytest_cudagraph`` (which pytest does in every
session of an environment where the plugin is installed) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pytest_cudagraph._lazy import lazy_door

__version__ = "0.4.0"


class PytestCudagraphDeprecationWarning(DeprecationWarning):
    """A spelling this plugin still accepts and will drop: the message names the release that
    drops it and what to write instead. Filter it by this class."""


if TYPE_CHECKING:
    from pytest_cudagraph.conformance._loading import TargetError as TargetError
    from pytest_cudagraph.conformance._protocol import CudaGraphTarget as CudaGraphTarget
    from pytest_cudagraph.engines.compare import Mismatch as Mismatch
    from pytest_cudagraph.engines.compare import compare_outputs as compare_outputs
    from pytest_cudagraph.engines.faults import FaultInjector as FaultInjector
    from pytest_cudagraph.engines.hostsync import host_syncs_fail as host_syncs_fail
    from pytest_cudagraph.engines.memory import DeviceMemoryProbe as DeviceMemoryProbe
    from pytest_cudagraph.engines.memory import MemoryReport as MemoryReport
    from pytest_cudagraph.engines.memory import judge_growth as judge_growth
    from pytest_cudagraph.engines.parity import ParityChecker as ParityChecker
    from pytest_cudagraph.engines.parity import ParityResult as ParityResult
    from pytest_cudagraph.markers.cuda_graph_parity import cuda_graph_parity as cuda_graph_parity
    from pytest_cudagraph.markers.graph_memory_bound import (
        graph_memory_bound as graph_memory_bound,
    )
    from pytest_cudagraph.markers.no_host_sync import no_host_sync as no_host_sync
    from pytest_cudagraph.markers.pinned_stack import pinned_stack as pinned_stack

__getattr__, __dir__, __all__ = lazy_door(
    __name__, __file__, globals(), ("__version__", "PytestCudagraphDeprecationWarning")
)

# The spellings of earlier releases, a layer on top of the rest until 0.5.0: deleting its module
# drops them, with no other edit. Only that module missing is let go: an import it makes that
# fails is the layer's own error, raised.
_LEGACY = "pytest_cudagraph.conformance._legacy"
try:
    importlib.import_module(_LEGACY)
except ModuleNotFoundError as missing:
    if missing.name != _LEGACY:
        raise
