"""A per-shape CUDA-graph cache around the decoder's bf16 AR step, exact or lean.

One graph per ``GraphKey`` of an ``ARStep``: every shape and layout the forward depends on is
in the key (a shared memory, one target's expanded over the batch, rounds otherwise than a
memory per row), and every tensor it reads is a static buffer refreshed on each call, so a new
target on a cached key gets its own answer (upstream baked the memory in). A replay runs the
eager step ``model.ar_step_logits(..., bf16=True)`` on a bf16-weight copy of the decoder taken
when the cache is built (``graph_module``), so its logits are bit-identical to eager; with
``lean=True`` it runs the lean step (``lean.LeanDecoder``), bit-identical to that step run
eagerly. ``cache.eager(step)`` is the eager step the graphs replay. Memory length must be a
multiple of 64 (callers pad it, masked); any other shape in a key must be a bucket too.

Graphs live in an LRU of ``capacity`` entries, each in its own private memory pool; warm-ups
and capture run on one side stream of the decoder's device (``capture_cache.CaptureCache``,
shared with ``StepGraphCache``), replay and the output copy on its current stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .bucketing import SEQ_BUCKET, is_batch_bucket, is_seq_bucket
from .capture_cache import CaptureCache, check_capture_settings, live
from .checks import check_bool, check_device
from .config import DecoderConfig
from .lean import LeanDecoder
from .model import Decoder, ar_step_logits, step_context, with_bf16_matmul_weights
from .step import ARStep, GraphKey

if TYPE_CHECKING:
    from .capture_cache import PoolHandle

MEMORY_BUCKET = SEQ_BUCKET


@dataclass(eq=False)
class GraphEntry:
    """One captured graph, its private pool, the static inputs it reads and the output it
    writes. ``memory`` is [1, M, d] for a shared-memory key (expanded in the graph), else
    [B, M, d]; ``memory_padding_mask`` is None for a key without a mask."""

    key: GraphKey
    graph: torch.cuda.CUDAGraph | None
    pool: PoolHandle | None
    tokens: Tensor | None
    memory: Tensor | None
    memory_padding_mask: Tensor | None
    gather: Tensor | None
    logits: Tensor | None = None

    def release(self) -> None:
        """Destroy the graph and drop every reference to its pool and buffers, so that nothing
        holding this entry keeps its memory alive."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.pool = self.logits = None
        self.tokens = self.memory = self.memory_padding_mask = self.gather = None


class GraphCache(CaptureCache[GraphKey, GraphEntry]):
    """CUDA graphs of ``decoder``'s bf16 AR step (``lean``: its lean step), one per step key,
    LRU-bounded.

    ``cache(step)`` takes an ``ARStep`` in the bucketed layout on the decoder's device and
    returns fp32 logits [step.rows, vocab], a tensor of its own that later calls never
    overwrite. Thread-safe: one lock (``.lock``) covers lookup, capture and replay.

    Stages. A call runs, under the lock, ``STAGES`` in order (``CaptureCache``'s and one of its
    own): on a key not yet cached ``warm_up(entry)`` and ``capture(entry)`` (both run
    ``static_step(entry)``, the forward on the entry's static inputs), then
    ``replay(entry, step)`` and ``copy_out(entry, rows)``. Failures leave the cache consistent:
    an error while building (warm-up, capture) discards the half-built entry before it is ever
    stored; an error in replay or copy-out keeps the stored entry, which stays valid because
    every call refreshes all of its inputs before replaying.
    """

    STAGES = (*CaptureCache.STAGES, "copy_out")

    def __init__(
        self,
        decoder: Decoder,
        device: torch.device | str | int,
        *,
        lean: bool = False,
        capacity: int = 3,
        warmups: int = 3,
    ) -> None:
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must be a reasyn_ref Decoder, got {type(decoder).__name__}")
        device = check_device("device", device)
        check_bool("lean", lean)
        check_capture_settings("GraphCache", capacity, warmups)
        weight = decoder.embed.weight
        if weight.device.type != "cuda":
            raise ValueError(
                f"GraphCache needs the decoder on a CUDA device; its parameters are on "
                f"{weight.device}"
            )
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device != weight.device:
            raise ValueError(
                f"device {device} is not the decoder's device {weight.device}: a graph runs "
                f"where the decoder's weights live"
            )
        super().__init__(device, capacity=capacity, warmups=warmups)
        self.decoder = decoder
        self.config: DecoderConfig = decoder.config
        self.memory_dtype = weight.dtype
        self.lean = lean
        with torch.cuda.device(device):
            # Copied inside the device's context, like everything the cache creates.
            self._graph_module = graph_step_module(decoder, lean=lean)

    @property
    def graph_module(self) -> Decoder | LeanDecoder:
        """The module the graphs run (``graph_step_module`` of the decoder), a copy of the
        cache's own: the module whose state a warm-up, a capture or a replay may change, which a
        check of module state compares with the eager side's."""
        return self._graph_module

    def __call__(self, step: ARStep) -> Tensor:
        """fp32 logits [step.rows, vocab] of one AR step, from its key's graph (captured on
        first use)."""
        if not isinstance(step, ARStep):
            raise TypeError(f"step must be an ARStep, got {type(step).__name__}")
        key = check_graph_step(self.config, self.device, self.memory_dtype, step)
        with self.lock, torch.cuda.device(self.device):
            entry = self.lookup(key)
            self.replay(entry, step)
            return self.copy_out(entry, step.rows)

    def eager(self, step: ARStep) -> Tensor:
        """The eager step the graphs replay, on the same weights copy: fp32 logits
        [step.rows, vocab], bit-identical to ``cache(step)``. Any shapes; no graph involved."""
        if not isinstance(step, ARStep):
            raise TypeError(f"step must be an ARStep, got {type(step).__name__}")
        return ar_step_logits(self._graph_module, step, bf16=not self.lean)

    # --- stages (public: see the class docstring; warm_up and capture are CaptureCache's) ----

    def static_step(self, entry: GraphEntry) -> Tensor:
        """The eager step's forward on the entry's static inputs: what warm-ups run and the
        capture records."""
        memory = live(entry.memory).expand(entry.key.batch, -1, -1)  # a view; no-op per row
        # The lean step is bf16 throughout; the exact one runs under bf16 autocast.
        with step_context(self.device, bf16=not self.lean):
            return self._graph_module(entry.tokens, memory, entry.memory_padding_mask, entry.gather)

    def replay(self, entry: GraphEntry, step: ARStep) -> None:
        """Refresh every static input from ``step``, then replay, on the current stream."""
        live(entry.tokens).copy_(step.tokens)
        live(entry.memory).copy_(step.memory[:1] if entry.key.shared_memory else step.memory)
        if step.memory_padding_mask is not None:  # the key has a mask: so has the entry
            live(entry.memory_padding_mask).copy_(step.memory_padding_mask)
        live(entry.gather).copy_(step.gather)
        self.replay_graph(entry)

    def copy_out(self, entry: GraphEntry, rows: int) -> Tensor:
        """The real rows as fp32 in fresh memory: the static output is rewritten by every replay."""
        return live(entry.logits)[:rows].to(torch.float32, copy=True)

    def new_entry(self, key: GraphKey) -> GraphEntry:
        # Zeros are valid inputs (token id 0, gather 0, no padding) for the warm-ups.
        def zeros(*shape: int, dtype: torch.dtype) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        return GraphEntry(
            key=key,
            graph=torch.cuda.CUDAGraph(),
            pool=torch.cuda.graph_pool_handle(),
            tokens=zeros(key.batch, key.seq, dtype=torch.long),
            memory=zeros(
                1 if key.shared_memory else key.batch,
                key.memory_len,
                self.config.d_model,
                dtype=self.memory_dtype,
            ),
            memory_padding_mask=(
                zeros(key.batch, key.memory_len, dtype=torch.bool) if key.has_mask else None
            ),
            gather=zeros(key.batch, dtype=torch.long),
        )


def graph_step_module(decoder: Decoder, *, lean: bool) -> Decoder | LeanDecoder:
    """A copy of ``decoder`` of its own, made to run the step a ``GraphCache`` of that ``lean``
    captures: the lean step (``LeanDecoder``), or the decoder with bf16 matmul weights
    (bit-identical to it under bf16 autocast, fewer kernels). Two copies of one decoder are
    alike, state for state, and share no memory."""
    return LeanDecoder(decoder) if lean else with_bf16_matmul_weights(decoder)


def check_graph_step(
    config: DecoderConfig, device: torch.device, memory_dtype: torch.dtype, step: ARStep
) -> GraphKey:
    """What a graph call needs beyond a valid ARStep, checked without a host sync: the cache's
    device, the decoder's memory dtype and width, and bucketed shapes (a sequence bucket is
    within max_len); returns the step's key. Token and gather values are not checked here:
    that would read the device (the sampler checks them on its host copy)."""
    if step.device != device:
        raise ValueError(f"tokens are on {step.device}; the graph cache is bound to {device}")
    if step.memory.dtype != memory_dtype:
        raise ValueError(
            f"memory must be {memory_dtype} (the decoder's parameter dtype), got "
            f"{step.memory.dtype}"
        )
    if step.memory.shape[2] != config.d_model:
        raise ValueError(
            f"memory must be [B, M, d_model={config.d_model}], got {tuple(step.memory.shape)}"
        )
    key = step.key
    if not is_batch_bucket(key.batch):
        raise ValueError(
            f"tokens batch {key.batch} is not a batch bucket (a power of two; see bucket_batch)"
        )
    if not is_seq_bucket(key.seq, config.max_len):
        raise ValueError(
            f"tokens length {key.seq} is not a sequence bucket (a multiple of {SEQ_BUCKET} "
            f"or max_len={config.max_len}; see bucket_seq)"
        )
    if key.memory_len % MEMORY_BUCKET:
        raise ValueError(
            f"memory length {key.memory_len} is not a memory bucket (a positive multiple of "
            f"{MEMORY_BUCKET}); pad the target's memory and mask its padding"
        )
    return key
