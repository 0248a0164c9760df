"""A conformance target that is not the ReaSyn decoder, and broken twins of it.

The target is the docs' hand-written example (examples/hand_written_target.py): a hand-written
per-shape CUDA-graph cache around a small ``nn.TransformerEncoder`` stack
(examples/encoder_cache.py). Each twin is that cache wrong in exactly one way. Use as
``--cudagraph-target foreign:make_target`` (or ``foreign:<twin>``) with this folder importable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from broken_targets import LockKeptOnError
from torch import Tensor

from pytest_cudagraph.conformance import CudaGraphTarget
from pytest_cudagraph.examples.encoder_cache import EncoderGraphCache, Entry
from pytest_cudagraph.examples.hand_written_target import make_target

__all__ = ["baked_gain", "lock_kept_on_error", "make_target", "static_output", "unlocked"]


# Broken twins: each cache is wrong in exactly one way.


class BakedGain(EncoderGraphCache):
    """Refreshes ``x`` before each replay but keeps the gain the graph was captured with."""

    def replay(self, entry: Entry, x: Tensor, gain: Tensor) -> None:
        super().replay(entry, x, entry.gain)


class StaticOutput(EncoderGraphCache):
    """Returns the graph's own output buffer, which the next replay of that key overwrites."""

    def copy_out(self, entry: Entry) -> Tensor:
        return entry.out


class LockKept(EncoderGraphCache):
    def make_lock(self) -> LockKeptOnError:
        return LockKeptOnError()


class NoLock:
    """Stands for a lock and locks nothing."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


class Unlocked(EncoderGraphCache):
    """Takes no lock: threads race on each key's static buffers and on the LRU."""

    def make_lock(self) -> NoLock:
        return NoLock()


def twin(cache_class: type[EncoderGraphCache]) -> Callable[[torch.device], CudaGraphTarget]:
    def factory(device: torch.device) -> CudaGraphTarget:
        return make_target(device, cache_class)

    factory.__doc__ = cache_class.__doc__
    return factory


baked_gain = twin(BakedGain)
static_output = twin(StaticOutput)
lock_kept_on_error = twin(LockKept)
unlocked = twin(Unlocked)
