"""Identical randomness for both sides of a comparison: one mechanism for every check.

``seeded(device, seed)`` runs a block with torch's global CPU generator and ``device``'s CUDA
generator seeded with ``seed``, and puts both back as they were afterwards, so that code which
draws random numbers (sampling inside a graph, dropout) draws the same on the eager and the
graphed side, and the caller's RNG state is untouched. torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch.manual_seed takes a 64-bit unsigned seed.
MAX_SEED = 2**64 - 1


@contextmanager
def restored(device: torch.device) -> Iterator[None]:
    """The global CPU generator and ``device``'s CUDA generator as they were before the block,
    afterwards."""
    import torch

    cuda_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_devices, device_type="cuda"):
        yield


def seed_all(device: torch.device, seed: int) -> None:
    """Seed the global CPU generator and, on a CUDA ``device``, its default generator."""
    import torch

    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.default_generators[device.index].manual_seed(seed)


@contextmanager
def seeded(device: torch.device, seed: int) -> Iterator[None]:
    """Run the block under ``seed`` (``seed_all``), the generators restored afterwards."""
    with restored(device):
        seed_all(device, seed)
        yield
