"""CUDA graphs of the KV decoder's step, one per ``StepKey``, LRU-bounded.

Each graph owns its ``StepBuffers``: the KV cache, the tokens and positions, the target's
cross-attention keys, values and mask. Nothing a step reads is baked in: the caller writes the
target (``load_target``), the prefixes (``prefill``) and each step's tokens and positions into
the buffers in place before replaying; the graph writes each row's keys and values at its
position, as the eager step does. Graphs capture ``KVDecoder.step`` under
``step_context(bf16=True)``; ``EagerSteps`` runs that same step on buffers of the same shapes,
so the two are bit-identical. Capture runs the step on the buffers, so it happens in ``claim``
before any target goes in; a claim holds the cache's lock for the whole target.

As in ``graph_cache`` (both are ``capture_cache.CaptureCache``): one private memory pool per
graph, warm-ups and capture on a side stream of the decoder's device, replay on its current
stream, logits copied out as fp32 of their own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .capture_cache import CaptureCache, check_capture_settings, live
from .checks import check_int
from .kv_decoder import KVDecoder, StepBuffers, StepKey, StepSlot, check_step_key, claimed
from .model import step_context

if TYPE_CHECKING:
    from .capture_cache import PoolHandle


@dataclass(eq=False)
class StepGraph:
    """One captured step, its private pool, the buffers it reads and writes, its logits."""

    cache: StepGraphCache
    graph: torch.cuda.CUDAGraph | None
    pool: PoolHandle | None
    buffers: StepBuffers | None
    logits: Tensor | None = None

    def step(self, rows: int) -> Tensor:
        """Replay on the buffers as they are now; fp32 logits [rows, vocab] of their own."""
        if self.graph is None:
            raise RuntimeError("this step graph was released: use a slot only inside its claim")
        check_int("rows", rows, minimum=1, maximum=claimed(self).key.batch, label="Bb")
        self.cache.replay(self)
        return live(self.logits)[:rows].to(torch.float32, copy=True)

    def release(self) -> None:
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.pool = self.buffers = self.logits = None


class StepGraphCache(CaptureCache[StepKey, StepGraph]):
    """Graphs of ``kv``'s bf16 step, one per ``StepKey``, at most ``capacity``.

    ``with cache.claim(key) as slot:`` gives the key's buffers (captured on first use) and
    ``slot.step(rows)``, the replay. ``kv`` should hold the weights the graphs are to run
    (``KVDecoder(with_bf16_matmul_weights(decoder))`` saves a cast per weight).

    ``STAGES`` are ``CaptureCache``'s, public as ``GraphCache``'s (fault injection wraps them by
    name): on a key's first claim ``warm_up(entry)`` and ``capture(entry)``, both running
    ``static_step(entry)``; each ``slot.step`` runs ``replay(entry)``.
    """

    def __init__(
        self,
        kv: KVDecoder,
        *,
        capacity: int = 3,
        warmups: int = 3,
    ) -> None:
        if not isinstance(kv, KVDecoder):
            raise TypeError(f"kv must be a KVDecoder, got {type(kv).__name__}")
        check_capture_settings("StepGraphCache", capacity, warmups)
        if kv.device.type != "cuda":
            raise ValueError(
                f"StepGraphCache needs the decoder on a CUDA device, it is on {kv.device}"
            )
        super().__init__(kv.device, capacity=capacity, warmups=warmups)
        self.kv = kv
        with torch.cuda.device(self.device):
            self.dtype = self._step_dtype()

    @contextlib.contextmanager
    def claim(self, key: StepKey) -> Iterator[StepSlot]:
        """The graph of ``key`` and its buffers, for one target; holds the lock until exit."""
        check_step_key(self.kv.config, key)
        key = StepKey(*key)
        with self.lock, torch.cuda.device(self.device):
            yield self.lookup(key)

    def clear_state(self) -> None:
        """Zero every cached graph's buffers in place (KV cache, tokens, positions, the target),
        keeping the graphs. Correct decoding needs no reset between targets (each target's
        writes cover what its steps read); this is for callers that want none of a finished
        target's data left on the device."""
        with self.lock, torch.cuda.device(self.device):
            for entry in self.entries.values():
                buffers = claimed(entry)
                for tensor in (buffers.inputs, buffers.cache, buffers.cross, buffers.cross_mask):
                    tensor.zero_()

    def _step_dtype(self) -> torch.dtype:
        with step_context(self.device, bf16=True):
            return self.kv.compute_dtype()

    # --- stages (warm_up and capture are CaptureCache's) -------------------------------------

    def static_step(self, entry: StepGraph) -> Tensor:
        """The bf16 step on the entry's buffers: what warm-ups run and the capture records."""
        with step_context(self.device, bf16=True):
            return self.kv.step(claimed(entry))

    def replay(self, entry: StepGraph) -> None:
        """Run ``entry``'s graph once on its buffers as they are, on the current stream."""
        with torch.cuda.device(self.device):
            self.replay_graph(entry)

    def new_entry(self, key: StepKey) -> StepGraph:
        return StepGraph(
            cache=self,
            graph=torch.cuda.CUDAGraph(),
            pool=torch.cuda.graph_pool_handle(),
            buffers=self.kv.new_buffers(key, self.dtype),  # checks the key
        )
