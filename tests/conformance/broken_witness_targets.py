"""Twins of the checks whose verdict rests on a capture, shaped like real code; their graphs are
``Captured`` (CUDA graphs on a GPU, stand-in graphs on the CPU), so the CPU tests call the
checks on the code the GPU runs judge.

- ``caller_tensors_kept``: a graph per shape over the capturing call's tensors (petals), no
  reset: fails inputs unchanged in any order of checks.
- ``unread_recordings``: nano-vllm's runner, graphs captured at start-up, keeping clones no
  graph reads: passes no rebound tensors.
- ``rebinding_through(route)``: a cache rebinding its static buffer, kept in a module global, a
  deque, an lru_cache'd getter, a threading.local or a frozenset: fails no rebound tensors.
- ``piecewise``: the piecewise example, several graphs per key: passes captures.
- ``falls_back_for_good``: drops its graphs on any error, for good: reported once.

Use as ``--cudagraph-target broken_witness_targets:<factory>`` with this folder importable."""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable

import torch
from torch import Tensor, nn

from pytest_cudagraph.conformance import Cache, Case, CudaGraphTarget, graphs_on, hand_written
from pytest_cudagraph.examples import piecewise_runner_target
from pytest_cudagraph.examples.piecewise_runner import Piece, PiecewiseRunner, make_layers

WIDTH = 32
SHAPES = [(2, WIDTH), (4, WIDTH)]  # x of (rows, width): a key each


class Captured:
    """One graph of ``body`` over static tensors: a CUDA graph on a GPU (after one warm-up
    call); on the CPU a stand-in graph whose replay runs ``body`` again into the same output,
    as a replay runs the captured kernels on the captured addresses."""

    def __init__(self, body: Callable[[], Tensor], device: torch.device) -> None:
        self.body, self.on_cuda = body, graphs_on(device)  # CUDA, or emulated graphs
        if self.on_cuda:
            body()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.output = body()
        else:
            from graph_stand_ins import StandInGraph  # the CPU tests' helper

            self.graph = StandInGraph()
            self.graph.capture_begin()
            self.output = body()
            self.graph.capture_end()

    def replay(self) -> Tensor:
        self.graph.replay()
        if not self.on_cuda:
            self.output.copy_(self.body())
        return self.output


def make_layer(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()).to(device).requires_grad_(False)


def layer_target(device: torch.device, layer: nn.Module, **fields: object) -> CudaGraphTarget:
    """A target whose eager side is ``layer`` on x, keyed by x's shape."""

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(*case.key, generator=generator, device=device)}

    return hand_written(
        device=device,
        eager=lambda inputs: layer(inputs["x"]),
        keys=SHAPES,
        draw=draw,
        key_of=lambda inputs: tuple(inputs["x"].shape),
        **fields,
    )


# Inputs unchanged


class CallerTensorsKept:
    """A graph per shape captured on that shape's first call over the caller's own tensor as
    its static input (petals keeps the capturing call's arguments): every later call copies
    its input into the first caller's tensor. Its graphs live as long as it does."""

    def __init__(self, layer: nn.Module, device: torch.device) -> None:
        self.layer, self.device = layer, device
        self.lock = threading.Lock()
        self.graphs: dict[torch.Size, tuple[Tensor, Captured]] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        with self.lock:
            if x.shape not in self.graphs:
                self.graphs[x.shape] = (x, Captured(lambda: self.layer(x), self.device))
            static, graph = self.graphs[x.shape]
            static.copy_(x)
            return graph.replay().clone()


def caller_tensors_kept(device: torch.device) -> CudaGraphTarget:
    layer = make_layer(device)
    runner = CallerTensorsKept(layer, device)
    cache = Cache(lock=runner.lock, capacity=len(SHAPES))  # no reset: the graphs stay
    return layer_target(device, layer, graphed=runner, cache=cache)


# No rebound tensors


class RecordingRunner:
    """nano-vllm's model runner's shape: a graph per shape captured at start-up over static
    buffers (``graph_vars``); each run copies its batch in, replays, and keeps a clone of the
    output, as the last one and among the last few (a window whose entries move every step).
    No graph reads those clones."""

    KEPT = 4

    def __init__(self, layer: nn.Module, device: torch.device) -> None:
        self.graph_vars = {"x": torch.zeros(max(rows for rows, _ in SHAPES), WIDTH, device=device)}
        self.graphs = {
            rows: Captured(functools.partial(self.forward, layer, rows), device)
            for rows, _ in SHAPES
        }
        self.recorded: list[Tensor] = []
        self.last: Tensor | None = None

    def forward(self, layer: nn.Module, rows: int) -> Tensor:
        return layer(self.graph_vars["x"][:rows])

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        self.graph_vars["x"][: len(x)] = x
        self.last = self.graphs[len(x)].replay().clone()
        self.recorded = [*self.recorded, self.last][-self.KEPT :]
        return self.last


def unread_recordings(device: torch.device) -> CudaGraphTarget:
    layer = make_layer(device)
    runner = RecordingRunner(layer, device)
    return layer_target(device, layer, graphed=runner, cache=Cache(capacity=len(SHAPES)))


class Slot:
    """Where a cache keeps its static buffers, one per shape."""

    def __init__(self) -> None:
        self.buffers: dict[torch.Size, Tensor] = {}


GLOBAL_SLOT = Slot()
DEQUE_OF_SLOTS = collections.deque([Slot()])
FROZEN_SLOTS = frozenset({Slot()})
THREAD_SLOTS = threading.local()


@functools.cache
def cached_slot() -> Slot:
    return Slot()


def global_slot() -> Slot:
    return GLOBAL_SLOT


def deque_slot() -> Slot:
    return DEQUE_OF_SLOTS[0]


def frozen_slot() -> Slot:
    return next(iter(FROZEN_SLOTS))


def thread_slot() -> Slot:
    if not hasattr(THREAD_SLOTS, "slot"):
        THREAD_SLOTS.slot = Slot()
    return THREAD_SLOTS.slot


ROUTES = {
    "a module global": global_slot,
    "a deque": deque_slot,
    "an lru_cache'd getter": cached_slot,
    "a threading.local": thread_slot,
    "a frozenset": frozen_slot,
}


class RebindingCache:
    """A graph per shape over a static buffer kept in the slot ``slot_of()`` gives; with
    ``rebind`` each later call puts a new buffer there instead of copying into the one the
    graph reads."""

    def __init__(
        self, layer: nn.Module, device: torch.device, slot_of: Callable[[], Slot], rebind: bool
    ) -> None:
        self.layer, self.device, self.slot_of, self.rebind = layer, device, slot_of, rebind
        self.graphs: dict[torch.Size, Captured] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x, buffers = inputs["x"], self.slot_of().buffers
        if x.shape not in self.graphs:
            static = buffers[x.shape] = torch.zeros_like(x)
            self.graphs[x.shape] = Captured(lambda: self.layer(static), self.device)
        elif self.rebind:
            buffers[x.shape] = torch.zeros_like(x)  # replaced, where copy_ was meant
        buffers[x.shape].copy_(x)
        return self.graphs[x.shape].replay().clone()


def rebinding_through(route: str, device: torch.device, rebind: bool = True) -> CudaGraphTarget:
    slot_of = ROUTES[route]
    slot_of().buffers.clear()
    layer = make_layer(device)
    runner = RebindingCache(layer, device, slot_of, rebind)
    return layer_target(device, layer, graphed=runner, cache=Cache(capacity=len(SHAPES)))


# Captures


class CapturedPiecewise(PiecewiseRunner):
    """The piecewise example with ``Captured`` pieces: the same runner on the CPU too."""

    def capture(self, hidden: Tensor) -> list[Piece]:
        pieces = []
        for layer in self.layers:
            static = torch.zeros_like(hidden)
            graph = Captured(functools.partial(layer.feed_forward, static), self.device)
            pieces.append(Piece(static, graph, graph.output))
        self.pieces[hidden.shape] = pieces
        return pieces


def piecewise(device: torch.device) -> CudaGraphTarget:
    runner = CapturedPiecewise(make_layers(device), device)  # the example's seeded weights
    target = piecewise_runner_target.make_target(device)
    return dataclasses.replace(target, graphed=lambda inputs: runner.run(inputs["hidden"]))


# A permanent fallback


class DropsGraphsOnError:
    """A graph per shape under a lock; any error inside a call drops every graph for good and
    is raised: from then on each call runs the layer eagerly, right and slow (a compiled
    session that sets its compiled path to None on any exception does so)."""

    def __init__(self, layer: nn.Module, device: torch.device) -> None:
        self.layer, self.device = layer, device
        self.lock = threading.Lock()
        self.graphs: dict[torch.Size, tuple[Tensor, Captured]] | None = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        with self.lock:
            if self.graphs is None:
                return self.layer(x)
            try:
                return self.replayed(self.graphs, x)
            except Exception:
                self.graphs = None
                raise

    def replayed(self, graphs: dict[torch.Size, tuple[Tensor, Captured]], x: Tensor) -> Tensor:
        if x.shape not in graphs:
            static = torch.zeros_like(x)
            graphs[x.shape] = (static, Captured(lambda: self.layer(static), self.device))
        static, graph = graphs[x.shape]
        static.copy_(x)
        return graph.replay().clone()

    def reset(self) -> None:
        """Drop the graphs; a fallback stays."""
        with self.lock:
            if self.graphs is not None:
                self.graphs.clear()


def falls_back_for_good(device: torch.device) -> CudaGraphTarget:
    layer = make_layer(device)
    runner = DropsGraphsOnError(layer, device)
    cache = Cache(reset=runner.reset, lock=runner.lock, capacity=len(SHAPES))
    return layer_target(device, layer, graphed=runner, cache=cache)
