"""no_host_sync: fail a test whose body makes the host wait for the device.

Code that synchronizes (``.item()``, ``.cpu()``, a data-dependent ``bool(...)``) cannot be
captured in a CUDA graph; torch's sync debug mode "error" turns each such call into an
exception, which is reported as "not capture-clean".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

# The message of the RuntimeError torch raises in sync debug mode "error".
_TORCH_SYNC_ERROR = "called a synchronizing CUDA operation"


@contextmanager
def host_syncs_fail() -> Iterator[None]:
    """Run the block in sync debug mode "error"; the previous mode is restored, also on failure."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    except RuntimeError as error:
        if _TORCH_SYNC_ERROR not in str(error):
            raise
        raise pytest.fail.Exception(
            "no_host_sync: the test body synchronized the host with the device, so this code "
            f"is not capture-clean (torch: {error})"
        ) from error
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@contextmanager
def host_syncs_allowed(device: torch.device) -> Iterator[None]:
    """Lift sync debug mode for the plugin's own work (comparing outputs, the eager side)."""
    if device.type != "cuda" or not torch.cuda.is_initialized():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("default")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
