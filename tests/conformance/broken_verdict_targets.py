"""Deliberately broken targets for the checks added to make verdicts trustworthy: each is
correct in its answers and wrong in exactly one way that only the new check (or the order of
checks) can show. test_broken_verdict_targets.py runs the conformance suite on each.

- ``output_in_input`` (the foreign encoder cache): writes its answer into the caller's ``x``
  and returns that tensor, so the output shares storage with an input (output storage).
- ``recapturing`` (the reference cache): captures a key it already holds again on every call:
  right answers, a capture per call (captures).
- ``raising_sampler`` (the reference target): its sampler raises after its graphs ran, while
  they are still referenced from the failing frames (identical sampling fails; no later check
  may change its verdict for it).

Use as ``--cudagraph-target broken_verdict_targets:<factory>`` with this folder importable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pytest_cudagraph.conformance import CudaGraphTarget
from pytest_cudagraph.examples.encoder_cache import EncoderGraphCache, Entry
from pytest_cudagraph.examples.hand_written_target import make_target as make_encoder_target
from reasyn_ref import ARSampler, ARStep
from reasyn_ref.graph_cache import GraphCache, GraphEntry
from reasyn_ref.targets.reference import ReferenceTarget


class OutputInInput(EncoderGraphCache):
    """Copies the graph's output into the caller's ``x`` (an in-place "out=" convention) and
    returns it: the values are right, and the caller's input is gone."""

    def replay(self, entry: Entry, x: Tensor, gain: Tensor) -> None:
        super().replay(entry, x, gain)
        self.caller_x = x  # under the cache's lock, like copy_out, which runs next

    def copy_out(self, entry: Entry) -> Tensor:
        return self.caller_x.copy_(entry.out)


class RecapturingCache(GraphCache):
    """Captures a held key's graph afresh (a new graph, in the key's pool) before every replay,
    as a cache that forgets it already holds a key would."""

    def replay(self, entry: GraphEntry, step: ARStep) -> None:
        if getattr(entry, "replayed", False):  # a held key, not the call that built it
            torch.cuda.synchronize(self.device)  # no replay of the old graph in flight
            # A new graph in a new private pool, as a first capture gets: a second graph
            # captured into a pool the first still holds trips torch's allocator.
            old_graph = entry.graph
            entry.graph, entry.pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
            self.capture(entry)
            del old_graph
        super().replay(entry, step)
        entry.replayed = True


class SamplerFault(RuntimeError):
    pass


class RaisingSampler(ARSampler):
    """Samples, then raises when its graphs ran; the frame raising holds the sampler, and so
    its graph cache, for as long as the traceback lives."""

    def sample(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        tokens = super().sample(*args, **kwargs)
        if self.graph_cache is not None:
            graphs = len(self.graph_cache.keys())
            raise SamplerFault(f"the sampler failed after its {graphs} graph(s) ran")
        return tokens


class RaisingSamplerTarget(ReferenceTarget):
    sampler_class = RaisingSampler


def output_in_input(device: torch.device) -> CudaGraphTarget:
    return make_encoder_target(device, OutputInInput)


def recapturing(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, RecapturingCache).as_target()


def raising_sampler(device: torch.device) -> CudaGraphTarget:
    return RaisingSamplerTarget(device).as_target()
