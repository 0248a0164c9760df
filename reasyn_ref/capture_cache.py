"""What both graph caches share: an LRU of captured graphs, one per key, each built by warm-ups
and a capture on a side stream of the cache's device into a private memory pool, replayed and
counted in one place, and released for real (graph destroyed, blocks handed back to the driver).
``GraphCache`` (the full AR step) and ``StepGraphCache`` (the KV step) are its two subclasses.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import torch
from torch import Tensor

from .checks import check_int

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE as PoolHandle  # what graph_pool_handle() returns

# "thread_local": only this thread's unsafe CUDA calls (a sync, a cudaMalloc) during a capture
# are errors, so a sync hidden in the forward still fails loudly, while another thread touching
# CUDA (an eager forward, a data loader) neither breaks our capture nor is broken by it, as it
# would be under the default "global". "relaxed" would also hide our own unsafe calls.
CAPTURE_ERROR_MODE = "thread_local"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class LRU(Generic[K, V]):
    """Least-recently-used order over at most ``capacity`` items, oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = check_int("capacity", capacity, minimum=1)
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

    def values(self) -> list[V]:
        """Every item, oldest first, leaving the order as it is."""
        return list(self._items.values())

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


@dataclass
class CacheStats(Generic[K]):
    """Counters of one graph cache. ``evictions`` counts capacity evictions, not ``clear()``;
    ``capture_seconds`` is the time spent building each key's graph (buffers, warm-ups, capture),
    summed over re-captures after evictions."""

    hits: int = 0
    captures: int = 0
    evictions: int = 0
    replays: int = 0
    capture_seconds: dict[K, float] = field(default_factory=dict)


class CapturedEntry(Protocol):
    """What the cache needs of an entry: its graph and pool, the output its capture records, and
    a ``release`` that destroys the graph and drops every reference to its memory."""

    graph: torch.cuda.CUDAGraph | None
    pool: PoolHandle | None
    logits: Tensor | None

    def release(self) -> None: ...


E = TypeVar("E", bound=CapturedEntry)


def live(part: T | None) -> T:
    """A part of a cache entry (its graph, pool, a buffer, its output); RuntimeError once the
    entry was released (evicted or cleared), which drops every part."""
    if part is None:
        raise RuntimeError("this graph entry was released: use an entry only while it is cached")
    return part


def check_capture_settings(cache: str, capacity: int, warmups: int) -> None:
    """What every graph cache checks first: ``capacity`` and ``warmups`` are counts, and CUDA is
    there (``cache`` names the cache in the error)."""
    check_int("capacity", capacity, minimum=1)
    check_int("warmups", warmups, minimum=1)
    if not torch.cuda.is_available():
        raise RuntimeError(f"{cache} needs CUDA: torch.cuda.is_available() is False")


class CaptureCache(Generic[K, E]):
    """Captured graphs on ``device``, one per key, at most ``capacity``, LRU order.

    A subclass checks its arguments (``check_capture_settings`` first), then calls this
    constructor, and provides ``new_entry(key)`` (an entry with a fresh graph, pool and buffers),
    ``static_step(entry)`` (the forward on its buffers, what warm-ups run and a capture records)
    and its ``replay`` stage, which refreshes what the graph reads and calls ``replay_graph``.
    Its calls take the entry of a key from ``lookup`` under ``lock`` and in the device's context.

    ``STAGES`` are the methods every call runs through, in order (a subclass may add its own);
    they are public and part of the contract: tests, fault injection and subclasses wrap them by
    name. Also public, for subclasses and test doubles: ``entries`` (the LRU of entries; read it
    under ``lock``), ``side_stream`` (where warm-ups and captures run, made on ``device`` here)
    and ``stats``.
    """

    STAGES: tuple[str, ...] = ("warm_up", "capture", "replay")

    def __init__(self, device: torch.device, *, capacity: int, warmups: int) -> None:
        self.device = device
        self.warmups = warmups
        self.lock = threading.Lock()
        self.stats: CacheStats[K] = CacheStats()
        self.entries: LRU[K, E] = LRU(capacity)
        with torch.cuda.device(device):
            self.side_stream = torch.cuda.Stream(device=device)

    @property
    def capacity(self) -> int:
        return self.entries.capacity

    def keys(self) -> list[K]:
        """The cached keys, least recently used first. A snapshot taken without the lock (one
        C-level copy under the GIL), so that it can be read from anywhere, a stage included."""
        return self.entries.keys()

    def clear(self) -> None:
        """Drop every graph and its buffers, and give their memory back."""
        with self.lock, torch.cuda.device(self.device):
            self._release([entry for _, entry in self.entries.pop_all()])

    # --- what a subclass provides ------------------------------------------------------------

    def new_entry(self, key: K) -> E:
        """An entry for ``key`` with a fresh graph, pool and buffers, not yet captured."""
        raise NotImplementedError

    def static_step(self, entry: E) -> Tensor:
        """The forward on the entry's static buffers: what warm-ups run and the capture records."""
        raise NotImplementedError

    # --- stages --------------------------------------------------------------------------------

    def warm_up(self, entry: E) -> None:
        """Run the forward on the side stream first, so that lazy initialisation (cuBLAS
        handles, workspaces, kernel loading) happens before the capture, not inside it."""
        caller_stream = torch.cuda.current_stream()
        self.side_stream.wait_stream(caller_stream)
        with torch.cuda.stream(self.side_stream):
            for _ in range(self.warmups):
                self.static_step(entry)
        caller_stream.wait_stream(self.side_stream)

    def capture(self, entry: E) -> None:
        """Record ``static_step`` into the entry's graph, in its private pool."""
        caller_stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(
                live(entry.graph),
                pool=live(entry.pool),
                stream=self.side_stream,
                capture_error_mode=CAPTURE_ERROR_MODE,
            ):
                entry.logits = self.static_step(entry)
        finally:
            # torch.cuda.graph skips restoring the caller's stream when ending the capture fails.
            torch.cuda.set_stream(caller_stream)

    def replay_graph(self, entry: E) -> None:
        """Replay the entry's graph on the current stream and count it in ``stats.replays``: the
        one place a replay happens, so the count is of replays that ran."""
        live(entry.graph).replay()
        self.stats.replays += 1

    # --- entries -----------------------------------------------------------------------------

    def lookup(self, key: K) -> E:
        """The entry of ``key``, built on first use; evicts past capacity. Call it under
        ``lock``, in the device's context."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self._build(key)
            evicted = self.entries.put(key, entry)
            self.stats.evictions += len(evicted)
            self._release([old for _, old in evicted])
        else:
            self.stats.hits += 1
        return entry

    def _build(self, key: K) -> E:
        """A new entry, fully captured; on any error nothing of it survives."""
        start = time.perf_counter()
        entry = self.new_entry(key)
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

    def _discard(self, entry: E) -> None:
        """Undo a failed build: end a capture left open, then free the entry."""
        with torch.cuda.stream(self.side_stream):
            if torch.cuda.is_current_stream_capturing():
                # The error that brought us here is the one to report.
                with contextlib.suppress(RuntimeError):
                    live(entry.graph).capture_end()
        self._release([entry])

    def _release(self, entries: list[E]) -> None:
        """Wait for replays in flight, destroy the graphs and drop their buffers, then hand the
        freed blocks back to the driver so the memory really goes back."""
        if not entries:
            return
        torch.cuda.synchronize(self.device)
        for entry in entries:
            entry.release()
        torch.cuda.empty_cache()
