"""Deliberately broken conformance targets: the reference target with its GraphCache broken in
exactly one way each. test_broken_targets.py runs the conformance suite on each and checks that
the check meant for the fault fails and the others pass.

Use as ``--cudagraph-target broken_targets:<factory>`` with this folder on the import path.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import replace

import torch
from torch import Tensor

from pytest_cudagraph.conformance import CudaGraphTarget
from reasyn_ref import ARStep
from reasyn_ref.capture_cache import LRU
from reasyn_ref.graph_cache import GraphCache, GraphEntry
from reasyn_ref.targets.reference import ReferenceTarget


class BakedMemoryCache(GraphCache):
    """Upstream's bug: the memory a graph first ran with stays in it; later calls on the same
    key refresh tokens, mask and gather but not the memory."""

    def replay(self, entry: GraphEntry, step: ARStep) -> None:
        if getattr(entry, "memory_baked", False):
            # Hand the replay the memory the entry already holds (a copy: a buffer may not be
            # copied onto itself), so the old memory stays.
            step = replace(step, memory=entry.memory.clone().expand_as(step.memory))
        entry.memory_baked = True
        super().replay(entry, step)


class StaticOutputCache(GraphCache):
    """Returns the graph's own output buffer (the fp32 cast captured in the graph) instead of
    a copy, so the next replay of that key overwrites what the caller holds."""

    def static_step(self, entry: GraphEntry) -> Tensor:
        return super().static_step(entry).float()

    def copy_out(self, entry: GraphEntry, rows: int) -> Tensor:
        return entry.logits[:rows]


class LockKeptOnError:
    """A lock whose with-block forgets to release it when the block raises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> LockKeptOnError:
        self._lock.acquire()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self._lock.release()


class LockKeptCache(GraphCache):
    """An error in warm-up, capture, replay or copy leaves the cache's lock held."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.lock = LockKeptOnError()


class WrongDeviceCache(GraphCache):
    """Warms up and captures on a side stream of whatever device was current when the cache
    was built, instead of the decoder's device."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.side_stream = torch.cuda.Stream()


class UnboundedCache(GraphCache):
    """Keeps reporting its capacity but never evicts, so graphs pile up."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.reported_capacity = self.entries.capacity  # the LRU it was built with
        self.entries = LRU(sys.maxsize)

    @property
    def capacity(self) -> int:
        return self.reported_capacity


def baked_memory(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, BakedMemoryCache).as_target()


def static_output(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, StaticOutputCache).as_target()


def lock_kept_on_error(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, LockKeptCache).as_target()


def wrong_device(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, WrongDeviceCache).as_target()


def unbounded(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, UnboundedCache).as_target()
