"""A fake of the torch.cuda calls the graph caches make, shaped like torch's, and caches whose
stages record their calls, so that the orchestration of ``reasyn_ref.capture_cache`` (build on
first use, LRU eviction, discard of a failed build, release, replay counting, the lock) runs on
the CPU: test_capture_cache.py and test_graph_cache.py use them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from reasyn_ref import DecoderConfig, KVDecoder
from reasyn_ref.capture_cache import CaptureCache
from reasyn_ref.graph_cache import GraphCache, GraphEntry
from reasyn_ref.kv_graphs import StepGraphCache
from reasyn_ref.workloads import seeded_decoder

CONFIG = DecoderConfig.tiny()
CPU = torch.device("cpu")
# What releasing an entry's memory does, in order: wait, destroy the graph, hand blocks back.
RELEASE = ["synchronize", "reset", "empty_cache"]


class FakeStream:
    def wait_stream(self, other: object) -> None:
        pass


class FakeGraph:
    """What the caches call of a torch.cuda.CUDAGraph: replay (counted), reset, capture_end."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1

    def reset(self) -> None:
        self.cuda.events.append("reset")

    def capture_end(self) -> None:
        self.cuda.events.append("capture_end")
        self.cuda.capturing = False


class FakeCuda:
    """The torch.cuda functions the caches call, on the CPU (``install``). ``events`` logs those
    that release memory (synchronize, a graph's reset, empty_cache) and the ending of a capture
    left open. With ``end_capture_fails``, leaving ``torch.cuda.graph`` raises and leaves the
    capture open, as torch's does when ending a capture fails."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.capturing = False
        self.end_capture_fails = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fakes = {
            "device": lambda device: contextlib.nullcontext(),
            "Stream": lambda device=None: FakeStream(),
            "current_stream": lambda device=None: FakeStream(),
            "stream": lambda stream: contextlib.nullcontext(),
            "set_stream": lambda stream: None,
            "graph": self.graph,
            "is_current_stream_capturing": lambda: self.capturing,
            "synchronize": lambda device=None: self.events.append("synchronize"),
            "empty_cache": lambda: self.events.append("empty_cache"),
            "CUDAGraph": lambda: FakeGraph(self),
            "graph_pool_handle": object,
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fake)

    @contextlib.contextmanager
    def graph(
        self, graph: FakeGraph, *, pool: object, stream: object, capture_error_mode: str
    ) -> Iterator[None]:
        self.capturing = True
        try:
            yield
        finally:
            if self.end_capture_fails:
                raise RuntimeError("ending the capture failed")
            self.capturing = False


class Recording:
    """Stages that log their names to the fake's ``events`` (so both interleave) before running
    for real, raising at ``fail_at`` instead; the base's constructor on the CPU. Put first in
    the bases."""

    calls: list[str]
    fail_at: str | None

    def start_recording(self, cuda: FakeCuda, capacity: int, fail_at: str | None) -> None:
        CaptureCache.__init__(self, CPU, capacity=capacity, warmups=1)  # type: ignore[arg-type]
        self.calls = cuda.events
        self.fail_at = fail_at

    def record(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_at:
            raise RuntimeError(f"injected at {name}")

    def warm_up(self, entry: object) -> None:
        self.record("warm_up")
        super().warm_up(entry)  # type: ignore[misc]

    def capture(self, entry: object) -> None:
        self.record("capture")
        super().capture(entry)  # type: ignore[misc]

    def replay(self, entry: object, *step: object) -> None:
        self.record("replay")
        super().replay(entry, *step)  # type: ignore[misc]


class RecordingCache(Recording, GraphCache):
    """GraphCache, recording; its graphs output zeros."""

    def __init__(self, cuda: FakeCuda, capacity: int, fail_at: str | None = None) -> None:
        self.start_recording(cuda, capacity, fail_at)
        self.config, self.memory_dtype = CONFIG, torch.float32

    def static_step(self, entry: GraphEntry) -> Tensor:
        return torch.zeros(entry.key.batch, CONFIG.vocab_size)

    def copy_out(self, entry: GraphEntry, rows: int) -> Tensor:
        self.record("copy_out")
        return super().copy_out(entry, rows)


class RecordingSteps(Recording, StepGraphCache):
    """StepGraphCache, recording; its steps run the tiny decoder's KV step on the CPU."""

    def __init__(self, cuda: FakeCuda, capacity: int, fail_at: str | None = None) -> None:
        self.start_recording(cuda, capacity, fail_at)
        self.kv = KVDecoder(seeded_decoder(CONFIG, 0))
        self.dtype = torch.float32
