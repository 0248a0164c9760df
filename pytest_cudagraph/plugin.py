"""pytest hooks of pytest-cudagraph (entry point ``pytest_cudagraph``)."""

from __future__ import annotations

import pytest

MARKERS = {
    "cuda_graph_parity": "cuda_graph_parity(toggle=None, seed=0): compare a graphed callable "
    "with its eager twin",
    "graph_memory_bound": "graph_memory_bound(mib): fail when device memory grows by more "
    "than mib MiB across the test",
    "pinned_stack": "pinned_stack(python=, torch=, cuda=): skip unless the running stack "
    "matches the pinned one",
    "no_host_sync": "no_host_sync: fail on any device-to-host synchronization in the body",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")
