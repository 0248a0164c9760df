"""A per-shape CUDA-graph cache around the decoder's AR step.

One graph per ``GraphKey``: every shape and layout the forward depends on is in the key, and
every tensor it reads (tokens, gather, memory and its padding mask) is a static buffer
refreshed on each call. Upstream baked the encoder memory into its graphs, so a new target with
a cached shape silently got the old target's logits; here a call with new memory on a cached
key gets the new answer.

A graph replays exactly the eager step ``model.ar_step_logits(..., bf16=True)`` (bf16 autocast
with its weight cache off) on the same inputs, so its logits are bit-identical to eager. The
cache only runs that bf16 path; the sampler refuses graphs with bf16 off. The graphs run a copy
of the decoder whose matmul weights are stored in bf16 (``model.with_bf16_matmul_weights``):
autocast would cast them to the very same values on every step, so the results do not change,
but a third of each graph's kernels (one cast per weight) go away. That copy is taken when the
cache is built: after changing the decoder's weights, build a new cache.

Bit-identity needs the memory's layout, not just its shape: the cross-attention projects the
memory with one fused matmul-plus-bias when the bf16 copy of it is contiguous, and with a
matmul and a separate bias add (rounded twice) when it is not, and an expanded memory (one
target viewed over the batch, as the sampler passes it) and a per-row memory take different
paths. So the key says which one the call holds (``shared_memory``): a shared memory is staged
as one [1, M, d] row and expanded in the graph, as eager sees it; a per-row memory is staged
contiguous [B, M, d]. The padding mask is only ever turned into a new additive mask, so its
layout does not matter and it is always staged as [B, M].

Memory length must be a multiple of 64 (the memory bucket; the encoder's max_len 256 is one):
callers pad each target's memory, with the padding masked, so that targets of different lengths
share graphs. Any other shape in a key must be a bucket too (``bucketing``).

Graphs live in an LRU of ``capacity`` entries, each in its own private memory pool (a pool
shared between graphs is only safe when they replay in capture order). All work runs on the
decoder's device, whatever device is current: warm-ups and capture on a side stream created
once per cache, replay and the output copy on the device's current stream.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from .bucketing import SEQ_BUCKET, is_batch_bucket, is_seq_bucket
from .config import DecoderConfig
from .model import check_decoder_inputs, step_context, with_bf16_matmul_weights

MEMORY_BUCKET = SEQ_BUCKET

# "thread_local": only this thread's unsafe CUDA calls (a sync, a cudaMalloc) during a capture
# are errors, so a sync hidden in the forward still fails loudly, while another thread touching
# CUDA (an eager forward, a data loader) neither breaks our capture nor is broken by it, as it
# would be under the default "global". "relaxed" would also hide our own unsafe calls.
CAPTURE_ERROR_MODE = "thread_local"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """Least-recently-used order over at most ``capacity`` items, oldest first."""

    def __init__(self, capacity: int) -> None:
        check_count("capacity", capacity)
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The item under ``key``, marked most recently used; None when absent."""
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Store ``value`` as the most recently used item; returns the items pushed out to stay
        within capacity, oldest first."""
        self._items[key] = value
        self._items.move_to_end(key)
        evicted = []
        while len(self._items) > self.capacity:
            evicted.append(self._items.popitem(last=False))
        return evicted

    def pop_all(self) -> list[tuple[K, V]]:
        """Remove and return every item, oldest first."""
        items = list(self._items.items())
        self._items.clear()
        return items

    def keys(self) -> list[K]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class GraphKey(NamedTuple):
    """Every shape and layout one captured forward depends on. ``shared_memory``: the memory
    is one target's expanded over the batch (batch stride 0, batch > 1)."""

    batch: int
    seq: int
    memory_len: int
    has_mask: bool
    shared_memory: bool = False


@dataclass
class CacheStats:
    """Counters of one GraphCache. ``evictions`` counts capacity evictions, not ``clear()``;
    ``capture_seconds`` is the time spent building each key's graph (buffers, warm-ups, capture),
    summed over re-captures after evictions."""

    hits: int = 0
    captures: int = 0
    evictions: int = 0
    replays: int = 0
    capture_seconds: dict[GraphKey, float] = field(default_factory=dict)


@dataclass(eq=False)
class _Entry:
    """One captured graph, its private pool, the static inputs it reads and the output it writes."""

    key: GraphKey
    graph: torch.cuda.CUDAGraph | None
    pool: object
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


class GraphCache:
    """CUDA graphs of ``decoder``'s bf16 AR step, one per input shape, LRU-bounded.

    Call it like the eager step, with inputs already in the bucketed layout on the decoder's
    device: ``cache(tokens, memory, memory_padding_mask, gather, rows=B)`` returns fp32 logits
    [rows, vocab] of the real rows, a tensor of its own that later calls never overwrite.
    Thread-safe: one lock (``.lock``) covers lookup, capture and replay.

    Failures leave the cache consistent: an error while building a graph (``_warm_up``,
    ``_capture``) discards the half-built entry before it is ever stored; an error in
    ``_replay`` or ``_copy_out`` keeps the stored entry, which stays valid because every call
    refreshes all of its inputs before replaying.
    """

    def __init__(
        self,
        decoder: nn.Module,
        device: torch.device | str | int,
        *,
        capacity: int = 3,
        warmups: int = 3,
    ) -> None:
        check_count("capacity", capacity)
        check_count("warmups", warmups)
        if not torch.cuda.is_available():
            raise RuntimeError("GraphCache needs CUDA: torch.cuda.is_available() is False")
        weight = next(decoder.parameters(), None)
        if weight is None:
            raise ValueError("decoder has no parameters; GraphCache binds to their device")
        if weight.device.type != "cuda":
            raise ValueError(
                f"GraphCache needs the decoder on a CUDA device; its parameters are on "
                f"{weight.device}"
            )
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device != weight.device:
            raise ValueError(
                f"device {device} is not the decoder's device {weight.device}: a graph runs "
                f"where the decoder's weights live"
            )
        self.decoder = decoder
        self.config: DecoderConfig = decoder.config
        self.device = device
        self.warmups = warmups
        self.memory_dtype = weight.dtype
        self.lock = threading.Lock()
        self.stats = CacheStats()
        self._lru: LRU[GraphKey, _Entry] = LRU(capacity)
        with torch.cuda.device(device):
            self._side_stream = torch.cuda.Stream(device=device)
            # What the graphs run: bit-identical to the decoder under bf16 autocast, fewer
            # kernels. Copied inside the device's context, like everything the cache creates.
            self._graph_decoder = with_bf16_matmul_weights(decoder)

    @property
    def capacity(self) -> int:
        return self._lru.capacity

    def keys(self) -> list[GraphKey]:
        """The cached keys, least recently used first. A snapshot taken without the lock (one
        C-level copy under the GIL), so that it can be read from anywhere, a stage included."""
        return self._lru.keys()

    def __call__(
        self,
        tokens: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None,
        gather: Tensor,
        *,
        rows: int,
    ) -> Tensor:
        """fp32 logits [rows, vocab] of one AR step, from this shape's graph (captured on first
        use). Inputs: tokens long [Bb, Lb], memory [Bb, M, d] (an expanded view is fine),
        memory_padding_mask bool [Bb, M] or None, gather long [Bb]; rows <= Bb are real."""
        key = check_graph_inputs(
            self.config,
            self.device,
            self.memory_dtype,
            tokens,
            memory,
            memory_padding_mask,
            gather,
            rows=rows,
        )
        with self.lock, torch.cuda.device(self.device):
            entry = self._lru.get(key)
            if entry is None:
                entry = self._build(key)
                evicted = self._lru.put(key, entry)
                self.stats.evictions += len(evicted)
                self._release([old for _, old in evicted])
            else:
                self.stats.hits += 1
            self._replay(entry, tokens, memory, memory_padding_mask, gather)
            self.stats.replays += 1
            return self._copy_out(entry, rows)

    def clear(self) -> None:
        """Drop every graph and give its memory back."""
        with self.lock, torch.cuda.device(self.device):
            self._release([entry for _, entry in self._lru.pop_all()])

    def _build(self, key: GraphKey) -> _Entry:
        """A new entry, fully captured; on any error nothing of it survives."""
        start = time.perf_counter()
        entry = self._new_entry(key)
        try:
            self._warm_up(entry)
            self._capture(entry)
        except BaseException:
            self._discard(entry)
            raise
        self.stats.captures += 1
        seconds = time.perf_counter() - start
        self.stats.capture_seconds[key] = self.stats.capture_seconds.get(key, 0.0) + seconds
        return entry

    def _new_entry(self, key: GraphKey) -> _Entry:
        # Zeros are valid inputs (token id 0, gather 0, no padding) for the warm-ups.
        def zeros(*shape: int, dtype: torch.dtype) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        return _Entry(
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

    def _forward(self, entry: _Entry) -> Tensor:
        """The eager step's forward on the static inputs: what warm-ups run and graphs capture."""
        memory = entry.memory.expand(entry.key.batch, -1, -1)  # a view; no-op for per-row memory
        with step_context(self.device, bf16=True):
            return self._graph_decoder(
                entry.tokens, memory, entry.memory_padding_mask, entry.gather
            )

    def _warm_up(self, entry: _Entry) -> None:
        """Run the forward on the side stream first, so that lazy initialisation (cuBLAS
        handles, workspaces, kernel loading) happens before the capture, not inside it."""
        caller_stream = torch.cuda.current_stream()
        self._side_stream.wait_stream(caller_stream)
        with torch.cuda.stream(self._side_stream):
            for _ in range(self.warmups):
                self._forward(entry)
        caller_stream.wait_stream(self._side_stream)

    def _capture(self, entry: _Entry) -> None:
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

    def _replay(
        self,
        entry: _Entry,
        tokens: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None,
        gather: Tensor,
    ) -> None:
        """Refresh every static input, then replay, all on the device's current stream."""
        entry.tokens.copy_(tokens)
        entry.memory.copy_(memory[:1] if entry.key.shared_memory else memory)
        if memory_padding_mask is not None:
            entry.memory_padding_mask.copy_(memory_padding_mask)
        entry.gather.copy_(gather)
        entry.graph.replay()

    def _copy_out(self, entry: _Entry, rows: int) -> Tensor:
        """The real rows as fp32 in fresh memory: the static output is rewritten by every replay."""
        return entry.logits[:rows].to(torch.float32, copy=True)

    def _discard(self, entry: _Entry) -> None:
        """Undo a failed build: end a capture left open, then free the entry."""
        with torch.cuda.stream(self._side_stream):
            if torch.cuda.is_current_stream_capturing():
                # The error that brought us here is the one to report.
                with contextlib.suppress(RuntimeError):
                    entry.graph.capture_end()
        self._release([entry])

    def _release(self, entries: list[_Entry]) -> None:
        """Wait for replays in flight, destroy the graphs and drop their buffers, then hand the
        freed blocks back to the driver so the memory really goes back."""
        if not entries:
            return
        torch.cuda.synchronize(self.device)
        for entry in entries:
            entry.release()
        torch.cuda.empty_cache()


def check_graph_inputs(
    config: DecoderConfig,
    device: torch.device,
    memory_dtype: torch.dtype,
    tokens: Tensor,
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    gather: Tensor | None,
    *,
    rows: int,
) -> GraphKey:
    """Device, dtype, shape and bucket checks of one graph call, without a host sync; returns
    the call's key. Token and gather values are not checked here: that would read the device
    (the sampler checks them on its host copy)."""
    if gather is None:
        raise ValueError("gather is required: the graph reads each row's last index from it")
    batch, length = check_decoder_inputs(config, tokens, memory, memory_padding_mask, gather)
    if tokens.device != device:
        raise ValueError(f"tokens are on {tokens.device}; the graph cache is bound to {device}")
    if memory.dtype != memory_dtype:
        raise ValueError(
            f"memory must be {memory_dtype} (the decoder's parameter dtype), got {memory.dtype}"
        )
    if not is_batch_bucket(batch):
        raise ValueError(
            f"tokens batch {batch} is not a batch bucket (a power of two; see bucket_batch)"
        )
    if not is_seq_bucket(length, config.max_len):
        raise ValueError(
            f"tokens length {length} is not a sequence bucket (a multiple of {SEQ_BUCKET} "
            f"or max_len={config.max_len}; see bucket_seq)"
        )
    memory_len = memory.shape[1]
    if memory_len < 1 or memory_len % MEMORY_BUCKET:
        raise ValueError(
            f"memory length {memory_len} is not a memory bucket (a positive multiple of "
            f"{MEMORY_BUCKET}); pad the target's memory and mask its padding"
        )
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= batch:
        raise ValueError(f"rows must be an int in [1, B={batch}], got {rows!r}")
    shared_memory = batch > 1 and memory.stride(0) == 0
    return GraphKey(batch, length, memory_len, memory_padding_mask is not None, shared_memory)


def check_count(name: str, value: object) -> None:
    """``value`` must be an int >= 1 (not a bool); the error names ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
