"""Graph caches whose stages record their calls instead of touching CUDA, so that the shared
orchestration of ``reasyn_ref.capture_cache`` (build on first use, LRU eviction, discard of a failed
build, the lock) runs on the CPU: test_graph_cache.py and test_capture.py use them."""

from __future__ import annotations

import threading

import torch

from reasyn_ref import DecoderConfig, KVDecoder
from reasyn_ref.capture_cache import LRU, CacheStats
from reasyn_ref.graph_cache import GraphCache, GraphEntry
from reasyn_ref.kv_graphs import StepGraph, StepGraphCache
from reasyn_ref.step import GraphKey
from reasyn_ref.workloads import seeded_decoder

CONFIG = DecoderConfig.tiny()
CPU = torch.device("cpu")


class Recording:
    """Stages that log their names to ``calls`` (raising at ``fail_at``), and the state the
    cache constructors set, minus the CUDA checks and the side stream. Put first in the bases."""

    def start_recording(self, capacity: int, fail_at: str | None) -> None:
        self.device, self.warmups = CPU, 1
        self.lock = threading.Lock()
        self.stats = CacheStats()
        self._lru = LRU(capacity)
        self.calls: list[str] = []
        self.fail_at = fail_at

    def _stage(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_at:
            raise RuntimeError(f"injected at {name}")

    def warm_up(self, entry: object) -> None:
        self._stage("warm_up")

    def capture(self, entry: object) -> None:
        self._stage("capture")

    def _discard(self, entry: object) -> None:
        self.calls.append("discard")


class RecordingCache(Recording, GraphCache):
    """GraphCache, recording; its entries hold no graph and no buffers."""

    def __init__(self, capacity: int, fail_at: str | None = None) -> None:
        self.start_recording(capacity, fail_at)
        self.config, self.memory_dtype = CONFIG, torch.float32

    def replay(self, entry: GraphEntry, step: object) -> None:
        self._stage("replay")

    def copy_out(self, entry: GraphEntry, rows: int) -> torch.Tensor:
        self._stage("copy_out")
        return torch.zeros(rows, CONFIG.vocab_size)

    def _new_entry(self, key: GraphKey) -> GraphEntry:
        return GraphEntry(key, None, None, None, None, None, None)

    def _release(self, entries: list[GraphEntry]) -> None:
        self.calls.extend(f"release {entry.key.batch}" for entry in entries)


class RecordingSteps(Recording, StepGraphCache):
    """StepGraphCache, recording; its entries hold real (CPU) buffers and no graph."""

    def __init__(self, capacity: int, fail_at: str | None = None) -> None:
        self.start_recording(capacity, fail_at)
        self.kv = KVDecoder(seeded_decoder(CONFIG, 0))
        self.dtype = torch.float32

    def _new_entry(self, key: object) -> StepGraph:
        return StepGraph(self, None, None, self.kv.new_buffers(key, self.dtype))

    def _release(self, entries: list[StepGraph]) -> None:
        self.calls.extend(f"release {entry.buffers.key.batch}" for entry in entries)
