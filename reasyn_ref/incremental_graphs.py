"""CUDA graphs of the incremental step, one per ``StepKey``, LRU-bounded.

Each graph owns its ``StepBuffers``: the KV cache, the tokens and positions, the target's
cross-attention keys, values and mask. Nothing a step reads is baked in: the caller writes the
target (``load_target``) and the prefixes (``prefill``) into the buffers in place, and each
step's tokens and positions, before replaying. The graph itself writes each row's keys and
values at that row's position, as the eager step does.

Graphs capture ``IncrementalDecoder.step`` under ``step_context(bf16=True)`` on buffers of the
key's shapes; ``EagerSteps`` with ``bf16=True`` runs that same step on buffers of the same
shapes, so the two are bit-identical. Capture runs the step on the buffers (warm-ups, capture),
so it happens in ``claim`` before any target goes in. A claim holds the cache's lock for the
whole target: the buffers are one target's state until the claim ends.

As in ``graph_cache``: one private memory pool per graph, warm-ups and capture on a side stream
of the decoder's device, replay on its current stream, logits copied out as fp32 of their own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .graph_cache import CAPTURE_ERROR_MODE, LRU, check_count
from .incremental import (
    IncrementalDecoder,
    StepBuffers,
    StepKey,
    StepSlot,
    check_rows,
    check_step_key,
)
from .model import step_context


@dataclass
class StepGraphStats:
    """Counters of one StepGraphCache; ``capture_seconds`` sums each key's builds (buffers,
    warm-ups, capture)."""

    hits: int = 0
    captures: int = 0
    evictions: int = 0
    replays: int = 0
    capture_seconds: dict[StepKey, float] = field(default_factory=dict)


@dataclass(eq=False)
class StepGraph:
    """One captured step, its private pool, the buffers it reads and writes, its logits."""

    cache: StepGraphCache
    graph: torch.cuda.CUDAGraph | None
    pool: object
    buffers: StepBuffers | None
    logits: Tensor | None = None

    def step(self, rows: int) -> Tensor:
        """Replay on the buffers as they are now; fp32 logits [rows, vocab] of their own."""
        if self.graph is None:
            raise RuntimeError("this step graph was released: use a slot only inside its claim")
        check_rows(rows, self.buffers.key.batch)
        self.cache.replay(self)
        return self.logits[:rows].to(torch.float32, copy=True)

    def release(self) -> None:
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.pool = self.buffers = self.logits = None


class StepGraphCache:
    """Graphs of ``kv``'s bf16 incremental step, one per ``StepKey``, at most ``capacity``.

    ``with cache.claim(key) as slot:`` gives the key's buffers (captured on first use) and
    ``slot.step(rows)``, the replay. ``kv`` should hold the weights the graphs are to run
    (``IncrementalDecoder(with_bf16_matmul_weights(decoder))`` saves a cast per weight).
    """

    def __init__(
        self,
        kv: IncrementalDecoder,
        *,
        capacity: int = 3,
        warmups: int = 3,
    ) -> None:
        if not isinstance(kv, IncrementalDecoder):
            raise TypeError(f"kv must be an IncrementalDecoder, got {type(kv).__name__}")
        check_count("capacity", capacity)
        check_count("warmups", warmups)
        if not torch.cuda.is_available():
            raise RuntimeError("StepGraphCache needs CUDA: torch.cuda.is_available() is False")
        if kv.device.type != "cuda":
            raise ValueError(
                f"StepGraphCache needs the decoder on a CUDA device, it is on {kv.device}"
            )
        self.kv = kv
        self.device = kv.device
        self.warmups = warmups
        self.lock = threading.Lock()
        self.stats = StepGraphStats()
        self._lru: LRU[StepKey, StepGraph] = LRU(capacity)
        with torch.cuda.device(self.device):
            self._side_stream = torch.cuda.Stream(device=self.device)
            self.dtype = self._step_dtype()

    @property
    def capacity(self) -> int:
        return self._lru.capacity

    def keys(self) -> list[StepKey]:
        """The cached keys, least recently used first (a snapshot, taken without the lock)."""
        return self._lru.keys()

    @contextlib.contextmanager
    def claim(self, key: StepKey) -> Iterator[StepSlot]:
        """The graph of ``key`` and its buffers, for one target; holds the lock until exit."""
        check_step_key(self.kv.config, key)
        key = StepKey(*key)
        with self.lock, torch.cuda.device(self.device):
            entry = self._lru.get(key)
            if entry is None:
                entry = self._build(key)
                evicted = self._lru.put(key, entry)
                self.stats.evictions += len(evicted)
                self._release([old for _, old in evicted])
            else:
                self.stats.hits += 1
            yield entry

    def clear_state(self) -> None:
        """Zero every cached graph's buffers in place (KV cache, tokens, positions, the target),
        keeping the graphs. Correct decoding needs no reset between targets (each target's
        writes cover what its steps read); this is for callers that want none of a finished
        target's data left on the device."""
        with self.lock, torch.cuda.device(self.device):
            for key in self._lru.keys():  # oldest first, so that get() keeps the LRU order
                buffers = self._lru.get(key).buffers
                for tensor in (buffers.inputs, buffers.cache, buffers.cross, buffers.cross_mask):
                    tensor.zero_()

    def clear(self) -> None:
        """Drop every graph and its buffers, and give their memory back."""
        with self.lock, torch.cuda.device(self.device):
            self._release([entry for _, entry in self._lru.pop_all()])

    def _step_dtype(self) -> torch.dtype:
        with step_context(self.device, bf16=True):
            return self.kv.compute_dtype()

    def _build(self, key: StepKey) -> StepGraph:
        """A captured entry for ``key``; on any error nothing of it survives."""
        start = time.perf_counter()
        entry = StepGraph(
            cache=self,
            graph=torch.cuda.CUDAGraph(),
            pool=torch.cuda.graph_pool_handle(),
            buffers=self.kv.new_buffers(key, self.dtype),  # checks the key
        )
        try:
            self.warm_up(entry)
            self.capture(entry)
        except BaseException:
            self._discard(entry)
            raise
        self.stats.captures += 1
        seconds = time.perf_counter() - start
        self.stats.capture_seconds[key] = self.stats.capture_seconds.get(key, 0.0) + seconds
        return entry

    def _forward(self, entry: StepGraph) -> Tensor:
        with step_context(self.device, bf16=True):
            return self.kv.step(entry.buffers)

    def warm_up(self, entry: StepGraph) -> None:
        """Lazy initialisation (handles, workspaces, kernel loading) before, not in, the capture."""
        caller_stream = torch.cuda.current_stream()
        self._side_stream.wait_stream(caller_stream)
        with torch.cuda.stream(self._side_stream):
            for _ in range(self.warmups):
                self._forward(entry)
        caller_stream.wait_stream(self._side_stream)

    def capture(self, entry: StepGraph) -> None:
        """Record the step on the entry's buffers into its graph, in its private pool."""
        caller_stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(
                entry.graph,
                pool=entry.pool,
                stream=self._side_stream,
                capture_error_mode=CAPTURE_ERROR_MODE,
            ):
                entry.logits = self._forward(entry)
        finally:
            # torch.cuda.graph skips restoring the caller's stream when ending the capture fails.
            torch.cuda.set_stream(caller_stream)

    def replay(self, entry: StepGraph) -> None:
        """Run ``entry``'s graph once on its buffers as they are, on the current stream."""
        with torch.cuda.device(self.device):
            entry.graph.replay()
        self.stats.replays += 1

    def _discard(self, entry: StepGraph) -> None:
        """Undo a failed build: end a capture left open, then free the entry."""
        with torch.cuda.stream(self._side_stream):
            if torch.cuda.is_current_stream_capturing():
                with contextlib.suppress(RuntimeError):  # the error that brought us here wins
                    entry.graph.capture_end()
        self._release([entry])

    def _release(self, entries: list[StepGraph]) -> None:
        """Wait for replays in flight, destroy the graphs, free their memory for real."""
        if not entries:
            return
        torch.cuda.synchronize(self.device)
        for entry in entries:
            entry.release()
        torch.cuda.empty_cache()
