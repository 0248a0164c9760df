"""The user's side of the hand-written example: a small ``nn.TransformerEncoder`` stack and a
hand-written per-shape CUDA-graph cache around it (not the ReaSyn decoder)."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pytest_cudagraph.conformance import graphs_on

D_MODEL = 64
WARM_UPS = 3


def make_encoder(device: torch.device) -> nn.Module:
    """Two encoder layers with random weights from a fixed seed, in eval mode. A SiLU activation
    keeps PyTorch's fused encoder fast path out; no gradients, so eager and graphs take the same
    attention path."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        D_MODEL, nhead=4, dim_feedforward=4 * D_MODEL, batch_first=True, activation=F.silu
    )
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return encoder.eval().requires_grad_(False).to(device)


@dataclasses.dataclass
class Entry:
    """One key's graph and its static buffers: inputs copied in before each replay, the
    output the graph writes."""

    x: Tensor
    gain: Tensor
    out: Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None


class EncoderGraphCache:
    """``cache(x, gain)`` = ``encoder(x * gain)`` through one CUDA graph per (batch, seq): an LRU
    of ``capacity`` graphs, each in its own memory pool, built (3 warm-ups, then the capture,
    on the cache's one side stream) and replayed under one lock, on the encoder's device."""

    def __init__(self, encoder: nn.Module, device: torch.device, capacity: int = 3) -> None:
        if not graphs_on(device):
            raise ValueError(f"EncoderGraphCache needs CUDA graphs, got {device} without them")
        self.encoder = encoder
        self.device = device
        self.capacity = capacity
        self.lock = self.make_lock()
        self.graphs: OrderedDict[tuple[int, int], Entry] = OrderedDict()
        # One side stream for every warm-up and capture: torch keeps a cuBLAS workspace per
        # stream used, so a new stream per graph would add a workspace that no eviction frees.
        self.side_stream = torch.cuda.Stream(device)

    def make_lock(self) -> threading.Lock:
        return threading.Lock()

    def __call__(self, x: Tensor, gain: Tensor) -> Tensor:
        key = (x.shape[0], x.shape[1])
        with self.lock, torch.cuda.device(self.device):
            entry = self.graphs.get(key)
            if entry is None:
                entry = self.build(key, x, gain)
            self.graphs.move_to_end(key)
            self.replay(entry, x, gain)
            return self.copy_out(entry)

    def build(self, key: tuple[int, int], x: Tensor, gain: Tensor) -> Entry:
        """A new entry, cached only once it is captured (evicting the oldest past capacity)."""
        entry = Entry(x=x.clone(), gain=gain.clone())
        self.warm_up(entry)
        self.capture(entry)
        while len(self.graphs) >= self.capacity:
            _, oldest = self.graphs.popitem(last=False)
            self.release(oldest)
        self.graphs[key] = entry
        return entry

    def forward(self, entry: Entry) -> Tensor:
        return self.encoder(entry.x * entry.gain)

    def warm_up(self, entry: Entry) -> None:
        self.side_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side_stream):
            for _ in range(WARM_UPS):
                self.forward(entry)
        torch.cuda.current_stream(self.device).wait_stream(self.side_stream)

    def capture(self, entry: Entry) -> None:
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls meanwhile (an eager call, drawing inputs)
        # neither fail nor break this capture; under the default "global" they fail.
        with torch.cuda.graph(graph, stream=self.side_stream, capture_error_mode="thread_local"):
            entry.out = self.forward(entry)
        entry.graph = graph

    def replay(self, entry: Entry, x: Tensor, gain: Tensor) -> None:
        entry.x.copy_(x)
        entry.gain.copy_(gain)
        entry.graph.replay()

    def copy_out(self, entry: Entry) -> Tensor:
        return entry.out.clone()

    def release(self, entry: Entry) -> None:
        """Free a graph and its memory pool (empty_cache gives the pool back to the driver)."""
        torch.cuda.synchronize(self.device)
        entry.graph.reset()
        entry.graph = entry.out = None
        torch.cuda.empty_cache()

    def clear(self) -> None:
        with self.lock:
            while self.graphs:
                self.release(self.graphs.popitem()[1])
