"""Deliberately broken stateful targets: reasyn-kv with its step graphs broken in one stateful way
each (the eager side stays right). test_broken_kv_targets.py runs the conformance suite on each
and checks that the check meant for the hazard fails.

Three hazards live in what the captured step reads as each row's position (buffers of their own
kind, made by a decoder subclass the graphs capture); the fourth in how the cache resets state.

Use as ``--cudagraph-target broken_kv_targets:<factory>`` with this folder on the import path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pytest_cudagraph.conformance import CudaGraphTarget
from reasyn_ref.kv_decoder import KVDecoder, StepBuffers, StepKey
from reasyn_ref.kv_graphs import StepGraphCache
from reasyn_ref.targets.kv import KVTarget


@dataclass(eq=False)
class BakedPositionBuffers(StepBuffers):
    """Positions read from a copy taken when the buffers were made, as if copied into the graph
    as constants at capture: every replay runs at the capture's positions (all 0)."""

    baked: Tensor

    @property
    def positions(self) -> Tensor:
        return self.baked


@dataclass(eq=False)
class SharedPositionBuffers(StepBuffers):
    """One position for the whole batch, row 0's (a scalar ``input_pos``, gpt-fast style): rows
    at different positions in one batch write and attend at the wrong place."""

    @property
    def positions(self) -> Tensor:
        return self.inputs[1, :1].expand(self.inputs.shape[1])


@dataclass(eq=False)
class PositionCounterBuffers(StepBuffers):
    """Each row's position is the furthest it has reached in these buffers, a counter kept on the
    device and raised by every step, and loading a new target never lowers it: a shorter
    target's rows resume past their own positions, over the last target's keys and values."""

    reached: Tensor

    @property
    def positions(self) -> Tensor:
        ahead = torch.maximum(self.inputs[1], self.reached)
        self.reached.copy_(ahead)
        return ahead


class BakedPositionDecoder(KVDecoder):
    def new_buffers(self, key: StepKey, dtype: torch.dtype) -> StepBuffers:
        plain = super().new_buffers(key, dtype)
        return BakedPositionBuffers(**vars(plain), baked=plain.positions.clone())


class SharedPositionDecoder(KVDecoder):
    def new_buffers(self, key: StepKey, dtype: torch.dtype) -> StepBuffers:
        return SharedPositionBuffers(**vars(super().new_buffers(key, dtype)))


class PositionCounterDecoder(KVDecoder):
    def new_buffers(self, key: StepKey, dtype: torch.dtype) -> StepBuffers:
        plain = super().new_buffers(key, dtype)
        return PositionCounterBuffers(**vars(plain), reached=torch.zeros_like(plain.positions))


class ReallocatingResetCache(StepGraphCache):
    """Resets state by giving each cached key new zeroed buffers (as re-running a cache set-up
    does) while its graph keeps reading and writing the buffers it was captured on."""

    def clear_state(self) -> None:
        with self.lock:
            for key in self.entries.keys():
                entry = self.entries.get(key)
                # Kept alive: the graph still uses them, and freed memory would be handed to
                # whatever is allocated next, which the graph would then overwrite.
                entry.captured_on = entry.buffers
                entry.buffers = self.kv.new_buffers(key, self.dtype)


def baked_position(device: torch.device) -> CudaGraphTarget:
    return KVTarget(device, graph_kv_class=BakedPositionDecoder).as_target()


def shared_position(device: torch.device) -> CudaGraphTarget:
    return KVTarget(device, graph_kv_class=SharedPositionDecoder).as_target()


def stale_position_counter(device: torch.device) -> CudaGraphTarget:
    return KVTarget(device, graph_kv_class=PositionCounterDecoder).as_target()


def reallocating_reset(device: torch.device) -> CudaGraphTarget:
    return KVTarget(device, cache_class=ReallocatingResetCache).as_target()
